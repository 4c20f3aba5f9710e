package shard_test

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/shard"
)

// Regression: Seal racing with an insertion that rebuilds the shard. The
// rebuild marks Empty slots Dead and sizes its new array for the rest; Seal
// used to turn those Dead slots Sealed between the rebuild's two passes, so
// the rebuild copied more slots than it had room for and spun forever with
// the shard mutex held. Seal now seals a shard under its mutex.
var sealRebuildHung atomic.Bool // one spinning goroutine per process is enough

// hang bounds a wait that only detects a hang: a test may wait this long
// for something that must happen, however slow or busy the machine, and
// fails only if it never does.
const hang = 2 * time.Minute

func TestSealDuringRebuild(t *testing.T) {
	if sealRebuildHung.Load() {
		t.Skip("already failed in this process")
	}
	trials := 40
	if testing.Short() {
		trials = 5
	}
	for trial := range trials {
		tb, err := shard.New[int, int](shard.Options[int]{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		// Fill the shard to its load limit with claimed (non-Empty) slots, so
		// that growth keeps them, then make all but the first Empty again.
		claims := map[*shard.Slot[int, int]]*shard.State[int]{}
		key := 0
		for {
			s := tb.LoadOrInsert(key)
			key++
			c, _, ok := s.Claim(nil, nil)
			if !ok {
				t.Fatal("claim")
			}
			claims[s] = c
			// Every slot is claimed, so none is dropped: key slots in all.
			if tb.Cells(0) >= 4096 && tb.RebuildsOnInsert(-1) {
				break
			}
		}
		var first *shard.Slot[int, int]
		for s := range tb.All() {
			if first == nil {
				first = s // stays Creating: Seal's callback stalls on it
				continue
			}
			if !s.Settle(claims[s], nil) {
				t.Fatal("settle")
			}
		}
		go1 := make(chan struct{})
		sealDone := make(chan struct{})
		delay := time.Duration(rand.N(200)) * time.Microsecond
		go func() {
			defer close(sealDone)
			_ = tb.Seal(func(s *shard.Slot[int, int], old *shard.State[int]) {
				if s == first {
					close(go1)
					for start := time.Now(); time.Since(start) < delay; {
					}
				}
			})
		}()
		<-go1
		insDone := make(chan struct{})
		go func() {
			defer close(insDone)
			tb.LoadOrInsert(-1) // triggers rebuild of the full shard
		}()
		select {
		case <-insDone:
		case <-time.After(hang):
			sealRebuildHung.Store(true)
			buf := make([]byte, 1<<20)
			t.Logf("%s", buf[:runtime.Stack(buf, true)])
			t.Fatalf("trial %d (delay %v): LoadOrInsert racing Seal never returned: rebuild spins on an over-full array", trial, delay)
		}
		<-sealDone
		// A smaller undercount leaves the array full, or fuller than `used`
		// says: probe with Lookups of absent keys, which must end.
		lk := make(chan struct{})
		go func() {
			defer close(lk)
			for k := -2; k > -200; k-- {
				tb.LoadOrInsert(k)
			}
		}()
		select {
		case <-lk:
		case <-time.After(hang):
			sealRebuildHung.Store(true)
			t.Fatalf("trial %d (delay %v): LoadOrInsert on a sealed table never returned", trial, delay)
		}
	}
}

// Regression: Claim used to accept any Failed state, including a claim whose
// flight a timeout resolved (Finish with a zero Until) while its creator
// still runs, which would start a second creation of the key.
func TestClaimRefusesAbandonedFlight(t *testing.T) {
	tb, err := shard.New[int, int](shard.Options[int]{})
	if err != nil {
		t.Fatal(err)
	}
	s := tb.LoadOrInsert(1)
	claim1, f1, ok := s.Claim(nil, nil)
	if !ok {
		t.Fatal("first claim")
	}
	// A timeout answers the waiters; the first creator is still running.
	if !f1.TryResolve() {
		t.Fatal("resolve")
	}
	f1.Finish(0, errors.New("timeout"), time.Time{})
	st := s.State()
	if st.Status() != shard.Failed || !st.Flight().Until().IsZero() {
		t.Fatalf("status %v", st.Status())
	}
	if _, _, ok := s.Claim(st, nil); ok {
		// Second creation now in flight; the first creator's Settle fails.
		if s.Settle(claim1, nil) {
			t.Fatal("unexpected")
		}
		t.Fatal("a second Claim succeeded while the abandoned creation is still in flight: two creations of one key overlap")
	}
}

// epcache's TestGetRacingClose fills a one-shard cache with 3,566 keys,
// each created (so Ready), so that the next insertion rebuilds; this keeps
// that number true.
func TestRebuildPointOfOneShard(t *testing.T) {
	const m = 3566
	tb, err := shard.New[int, int](shard.Options[int]{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	for k := range m {
		if k == m-1 && tb.RebuildsOnInsert(k) {
			t.Fatal("the last insertion rebuilds: the array is not at its limit after it")
		}
		publish(t, tb, k, k)
	}
	if !tb.RebuildsOnInsert(-1) {
		t.Fatal("the insertion after 3,566 keys does not rebuild: update epcache's TestGetRacingClose")
	}
}
