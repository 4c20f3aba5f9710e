package epcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/require"
)

// Close's promise about the Release of a value's last lease, read as a
// user reads it: a Lease.Release that has begun (its value no longer counts
// in Stats.Lingering) before Close is called has run Config.Release to its
// end when Close returns, so that the caller may then tear down what
// Release needs. Thirty-two goroutines each end the last lease of a value
// that Invalidate gave up; Close is called once none lingers, and every
// Config.Release must have returned before Close does.
func TestCloseWaitsForLastLeasesWhoseReleaseBegan(t *testing.T) {
	const values = 32
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}
	for round := range rounds {
		var finished atomic.Int32
		c, err := epcache.New(epcache.Config[int, *conn]{
			Create:  func(_ context.Context, k int) (*conn, error) { return newConn(k, 0), nil },
			Release: func(int, *conn) { finished.Add(1) },
		})
		require.NoError(t, err)
		leases := make([]epcache.Lease[int, *conn], values)
		for k := range leases {
			leases[k], err = c.Acquire(context.Background(), k)
			require.NoError(t, err)
			require.True(t, c.Invalidate(k))
		}
		require.EqualValues(t, values, c.Stats().Lingering)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, l := range leases {
			wg.Go(func() {
				<-start
				l.Release()
			})
		}
		close(start)
		deadline := time.Now().Add(hang)
		for c.Stats().Lingering != 0 {
			require.True(t, time.Now().Before(deadline), "round %d: values still lingering after every lease's Release began", round)
		}
		require.NoError(t, c.Close())
		got := finished.Load()
		wg.Wait()
		require.EqualValues(t, values, got, "round %d: %d of %d Config.Release calls finished when Close returned, though each lease's Release had begun before Close was called", round, got, values)
	}
}
