package epcache_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Close returns only once every Release that began before it has
// returned, the Release of a value's last lease included: a caller may
// tear down what Release uses (the UCX worker under its endpoints) as soon
// as Close returns. The lease ends after Invalidate gave its value up, and
// its Release blocks until the test lets it go.
func TestCloseWaitsForTheLastLeasesRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unblock := make(chan struct{})
		var started, returned atomic.Bool
		c, err := epcache.New(epcache.Config[int, *conn]{
			Create: func(_ context.Context, k int) (*conn, error) { return newConn(k, 0), nil },
			Release: func(int, *conn) {
				started.Store(true)
				<-unblock
				returned.Store(true)
			},
		})
		require.NoError(t, err)
		a, err := c.Acquire(context.Background(), 1)
		require.NoError(t, err)
		require.True(t, c.Invalidate(1)) // leased: released by the lease's end
		go a.Release()
		synctest.Wait()
		require.True(t, started.Load(), "the last lease's end began the Release")

		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while a Release that began before it was still running")
		default:
		}
		close(unblock)
		require.NoError(t, <-closed)
		assert.True(t, returned.Load())
		assert.Zero(t, c.Stats().Lingering)
	})
}

// A Get that evicts a value to make room waits for that value's Release
// before its Create starts. If the Get's context can end, it leaves when
// the context ends, with an error that says it was waiting for that
// Release, and the evicted value's room goes to whoever needs it next when
// the Release returns; if its context never ends, it waits for the Release,
// however long it takes (on the Get's own goroutine, as Create would run).
func TestRoomWaitForAnEvictedValuesRelease(t *testing.T) {
	for _, leavable := range []bool{true, false} {
		t.Run(map[bool]string{true: "the Get leaves on its context", false: "the Get's context never ends"}[leavable], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const slow = 300 * time.Millisecond
				var released atomic.Int32
				c, err := epcache.New(epcache.Config[int, *conn]{
					MaxEntries: 1,
					Create:     func(_ context.Context, k int) (*conn, error) { return newConn(k, 0), nil },
					Release: func(int, *conn) {
						time.Sleep(slow) // closing this endpoint takes a while
						released.Add(1)
					},
				})
				require.NoError(t, err)
				defer c.Close()
				bg := context.Background()
				_, err = c.Get(bg, 0)
				require.NoError(t, err)

				start := time.Now()
				if !leavable {
					v, err := c.Get(bg, 1)
					require.NoError(t, err)
					assert.Equal(t, 1, v.key)
					assert.Equal(t, slow, time.Since(start), "created once the evicted value's Release returned")
					assert.EqualValues(t, 1, released.Load())
					return
				}
				ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
				defer cancel()
				_, err = c.Get(ctx, 1)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				assert.Equal(t, 10*time.Millisecond, time.Since(start), "left when its context ended")
				assert.ErrorContains(t, err, "the Release of key 0, evicted for it, had not returned")
				assert.EqualValues(t, 1, c.Stats().Evictions)
				assert.Zero(t, released.Load())
				synctest.Wait()
				assert.EqualValues(t, 1, c.Stats().Room, "the evicted value counts until its Release returns")

				time.Sleep(slow)
				synctest.Wait()
				assert.EqualValues(t, 1, released.Load())
				assert.Zero(t, c.Stats().Room, "its room came back, to nobody in line")
				v, err := c.Get(bg, 1)
				require.NoError(t, err)
				assert.Equal(t, 1, v.key)
			})
		})
	}
}
