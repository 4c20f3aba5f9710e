package epcache

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/epcache/epcache/shard"
)

// A lease that catches a value just as an eviction takes it out of the
// cache (it is ended at once, by its taker, and that end releases the
// value) still leaves the value's room on its way to the waiter it was
// evicted for: the evictor evicts no second value for it. MaxEntries 2,
// two values; a Get of a third key evicts one, and a lease catches it as
// it leaves. The lease's end gives the waiter its room, and the other
// value stays.
func TestAnEvictionALeaseCaughtFreesRoomForOneWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var releases atomic.Int32
		c, err := New(Config[int, int]{
			Create:     func(_ context.Context, k int) (int, error) { return k, nil },
			Release:    func(int, int) { releases.Add(1) },
			MaxEntries: 2,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		bg := context.Background()
		for k := range 2 {
			if _, err := c.Get(bg, k); err != nil {
				t.Fatal(err)
			}
		}
		type caught struct {
			s  *shard.Slot[int, int]
			tk shard.Ticket
		}
		var stale atomic.Pointer[caught]
		testHookRemoved = func(s any) {
			if stale.Load() != nil {
				return
			}
			slot := s.(*shard.Slot[int, int])
			tk, ok := slot.Lease(c) // as Table.Acquire's lease, which finds the value gone next (Holds)
			if !ok {
				t.Error("no lease of a value before its Abandon")
				return
			}
			stale.Store(&caught{slot, tk})
		}
		defer func() { testHookRemoved = nil }()

		got := make(chan error, 1)
		go func() {
			_, err := c.Get(bg, 2)
			got <- err
		}()
		synctest.Wait()
		s := stale.Load()
		if s == nil {
			t.Fatal("no eviction")
		}
		if n := c.Stats().Evictions; n != 1 {
			t.Fatalf("%d evictions for one waiter, whose room a lease holds for a moment", n)
		}
		c.endStale(s.s, s.tk) // the lease's taker ends it: the value is released
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		st := c.Stats()
		if st.Evictions != 1 || c.Len() != 2 || releases.Load() != 1 {
			t.Fatalf("after the lease's end: %d evictions, %d values held, %d released; want 1, 2, 1", st.Evictions, c.Len(), releases.Load())
		}
	})
}
