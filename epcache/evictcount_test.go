package epcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An eviction frees room for one waiter and no more: concurrent first
// Acquires of more keys than MaxEntries holds evict exactly as many values
// as there are keys beyond the cap, also when a lease catches a value as
// the eviction takes it (the lease's end then releases it, and its room
// goes to the waiter it was evicted for). Three callers each of six keys
// under MaxEntries 2: every creation past the first two needs one
// eviction, and two values are left.
func TestEvictionsFreeRoomForOneWaiterEach(t *testing.T) {
	const keys, cap = 6, 2
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	for round := range rounds {
		l := newLedger()
		c, err := epcache.New(epcache.Config[int, *conn]{
			Create:     l.create,
			Release:    l.release,
			MaxEntries: cap,
		})
		require.NoError(t, err)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 3 * keys { // three callers a key
			k := g % keys
			wg.Go(func() {
				<-start
				for range 3 { // a key used again, as calls to one address are
					lease, err := c.Acquire(context.Background(), k)
					if err != nil {
						t.Error(err)
						return
					}
					lease.Release()
				}
			})
		}
		close(start)
		wg.Wait()
		st := c.Stats()
		require.EqualValues(t, cap, c.Len(), "round %d: %+v", round, st)
		require.EqualValues(t, st.Creates-cap, st.Evictions, "round %d: %d evictions for %d creations under MaxEntries %d", round, st.Evictions, st.Creates, cap)
		require.NoError(t, c.Close())
		l.checkClosed(t, c)
	}
}

// A value evicted for a waiter stays on its way to that waiter until its
// Release returns: while a slow Release runs, the end of another value's
// lease (which kicks the line) evicts nothing more for the same waiter.
// Two values, both leased, fill MaxEntries 2; a Get of a third key waits
// in line. The end of the first lease evicts its value, whose Release
// blocks; the end of the second must leave the second value in the cache,
// and the waiter gets the first value's room when its Release returns.
func TestASlowReleaseKeepsItsUnitOnItsWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var released atomic.Int32
		c, err := epcache.New(epcache.Config[int, *conn]{
			Create: func(_ context.Context, k int) (*conn, error) { return newConn(k, 0), nil },
			Release: func(k int, _ *conn) {
				if k == 0 {
					<-gate // closing this endpoint takes a while
				}
				released.Add(1)
			},
			MaxEntries: 2,
		})
		require.NoError(t, err)
		defer c.Close()
		bg := context.Background()
		l0, err := c.Acquire(bg, 0)
		require.NoError(t, err)
		l1, err := c.Acquire(bg, 1)
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		got := make(chan error, 1)
		go func() {
			_, err := c.Get(ctx, 2)
			got <- err
		}()
		synctest.Wait() // in line: both values are leased
		require.EqualValues(t, 1, c.Stats().RoomWaits)

		l0.Release() // its value goes for the waiter; its Release blocks
		synctest.Wait()
		require.EqualValues(t, 1, c.Stats().Evictions)
		l1.Release() // kicks the line, which is not short of room
		synctest.Wait()
		_, held := c.Load(1)
		assert.True(t, held, "value 1 evicted for a waiter whose room was on its way")
		assert.EqualValues(t, 1, c.Stats().Evictions)
		select {
		case err := <-got:
			t.Fatalf("the waiter was answered (%v) before the Release of the value evicted for it returned", err)
		default:
		}

		close(gate)
		require.NoError(t, <-got)
		assert.Equal(t, 2, c.Len())
		assert.EqualValues(t, 1, c.Stats().Evictions, "one eviction for one waiter")
	})
}
