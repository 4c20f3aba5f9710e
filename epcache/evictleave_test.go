package epcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/require"
)

// An evicted value's unit of room stays on its way until its Release
// returns, then goes to one waiter, also when the Get that evicted it
// leaves on its context meanwhile: the room goes to whoever needs it next,
// and a creation evicts for itself only when no unit is on its way.
//
// A Get (W1) evicts value A for itself; A's Release blocks; W1 leaves on its
// context. A second Get (W2) needs room: A's unit is on its way, and W2
// should take it when A's Release returns, evicting nothing. Instead W2
// evicts the other value too, and A's unit arrives to nobody: two
// evictions for one creation, and a free unit left.
func TestALeavingEvictorsUnitStaysOnItsWay(t *testing.T) {
	synctest.Test(t, leavingEvictor)
}

func leavingEvictor(t *testing.T) {
	var first atomic.Bool
	releasing := make(chan int, 1)
	unblock := make(chan struct{})
	var released sync.Map
	c, err := epcache.New(epcache.Config[int, int]{
		MaxEntries: 2,
		Create:     func(_ context.Context, k int) (int, error) { return k, nil },
		Release: func(k, _ int) {
			released.Store(k, true)
			if first.CompareAndSwap(false, true) {
				releasing <- k
				<-unblock
			}
		},
	})
	require.NoError(t, err)
	defer c.Close()
	bg := context.Background()
	for _, k := range []int{1, 2} {
		_, err := c.Get(bg, k)
		require.NoError(t, err)
	}
	ctx1, cancel1 := context.WithCancel(bg)
	w1 := make(chan error, 1)
	go func() { _, err := c.Get(ctx1, 3); w1 <- err }()
	evictedFirst := <-releasing // W1 evicted a value; its Release blocks
	cancel1()
	require.Error(t, <-w1, "W1 left on its context")

	w2 := make(chan error, 1)
	ctx2, cancel2 := context.WithTimeout(bg, 5*time.Second)
	defer cancel2()
	go func() { _, err := c.Get(ctx2, 4); w2 <- err }()
	synctest.Wait() // W2 is waiting for A's unit, or has evicted
	evictionsWhileOnWay := c.Stats().Evictions
	close(unblock)
	require.NoError(t, <-w2)
	synctest.Wait() // every Release has returned
	st := c.Stats()
	t.Logf("first evicted %d; evictions while its unit was on its way: %d; after: %d; Room %d of 2; Len %d",
		evictedFirst, evictionsWhileOnWay, st.Evictions, st.Room, c.Len())
	require.EqualValues(t, 1, st.Evictions, "a second value evicted while the first's unit was on its way to the line")
	require.EqualValues(t, 2, st.Room, "a unit of room left free")
}
