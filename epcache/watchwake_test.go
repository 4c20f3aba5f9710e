package epcache_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
)

// A waiter for room is woken when the last lease of the value that keeps
// it out ends, however that value was leased: the claimer's lease, a hit's,
// 40 nested ones (the overflow), eight goroutines' on several Ps, a lease
// taken after the eviction watched the value, and for a waiter whose
// context can end. MaxEntries 1; key 1 leased, a Get of key 2 waits. The
// sleeps only vary the interleavings; the 10 s limit detects a hang.
func TestAWaiterForRoomWakesWhenTheLastLeaseEnds(t *testing.T) {
	for _, procs := range []int{1, 2, 4} {
		for _, how := range []string{"claimer", "hit", "nested40", "goroutines", "after-watch", "waiter-with-deadline"} {
			t.Run(fmt.Sprintf("procs=%d/%s", procs, how), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				for round := range 50 {
					waiterWokenByLeaseEnd(t, how, round)
					if t.Failed() {
						return
					}
				}
			})
		}
	}
}

func waiterWokenByLeaseEnd(t *testing.T, how string, round int) {
	c, err := epcache.New(epcache.Config[int, int]{
		Create:     func(_ context.Context, k int) (int, error) { return k, nil },
		Release:    func(int, int) {},
		MaxEntries: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bg := context.Background()
	var leases []epcache.Lease[int, int]
	acq := func() {
		l, err := c.Acquire(bg, 1)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	var hold sync.WaitGroup
	releaseG := make(chan struct{})
	switch how {
	case "claimer":
		acq()
	case "hit", "after-watch", "waiter-with-deadline":
		c.Get(bg, 1)
		acq()
	case "nested40":
		c.Get(bg, 1)
		for range 40 {
			acq()
		}
	case "goroutines":
		c.Get(bg, 1)
		var got sync.WaitGroup
		for range 8 {
			got.Add(1)
			hold.Add(1)
			go func() {
				defer hold.Done()
				l, err := c.Acquire(bg, 1)
				got.Done()
				if err != nil {
					t.Error(err)
					return
				}
				<-releaseG
				l.Release()
			}()
		}
		got.Wait()
	}
	done := make(chan error, 1)
	ctx := bg
	if how == "waiter-with-deadline" {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(bg, time.Minute)
		defer cancel()
	}
	go func() { _, err := c.Get(ctx, 2); done <- err }()
	for c.Stats().RoomWaits == 0 {
		time.Sleep(50 * time.Microsecond)
	}
	time.Sleep(time.Duration(round%5) * 100 * time.Microsecond)
	if how == "after-watch" {
		acq() // a lease taken after the eviction watched the value
	}
	select {
	case err := <-done:
		t.Fatalf("round %d: Get(2) returned (%v) while key 1 was leased", round, err)
	default:
	}
	for i := len(leases) - 1; i >= 0; i-- {
		leases[i].Release()
	}
	close(releaseG)
	hold.Wait()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("round %d: Get(2): %v", round, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("round %d: Get(2) still waits for room 10s after the last lease of key 1 ended (%+v)", round, c.Stats())
	}
}
