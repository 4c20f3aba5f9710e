package epcache_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Config.Create documents that its ctx is cancelled by CreateTimeout, by
// Close, and when Create returns. Whether it ends with the return must not
// depend on whether a CreateTimeout is set: a Create that hands ctx to what
// it builds would otherwise see the endpoint torn down with a timeout and
// kept without one. (It once did.)
func TestCreationContextAfterCreateReturns(t *testing.T) {
	afterReturn := map[time.Duration]error{}
	for _, timeout := range []time.Duration{0, time.Hour} {
		synctest.Test(t, func(t *testing.T) {
			var got context.Context
			c, err := epcache.New(epcache.Config[int, int]{
				CreateTimeout: timeout,
				Create: func(ctx context.Context, k int) (int, error) {
					got = ctx
					return k, nil
				},
			})
			require.NoError(t, err)
			_, err = c.Get(context.Background(), 1)
			require.NoError(t, err)
			synctest.Wait() // the creation goroutine has finished
			afterReturn[timeout] = got.Err()
			require.NoError(t, c.Close())
			assert.Error(t, got.Err(), "CreateTimeout %v: Close ends the creation's context", timeout)
		})
	}
	assert.Equal(t, afterReturn[0], afterReturn[time.Hour],
		"once Create has returned, its ctx.Err() is %v without a CreateTimeout and %v with one", afterReturn[0], afterReturn[time.Hour])
	assert.ErrorIs(t, afterReturn[0], context.Canceled, "the context ends when Create returns")
}

// A creation's context costs an allocation only once Done is asked for
// (its channel): a Create that polls Err or reads a value allocates what
// one that never looks at its context does. (Run without the race
// detector by make test-norace: its instrumentation allocates.)
func TestCreationContextAllocatesNothingUntilDone(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	type key struct{}
	allocs := func(look func(context.Context)) float64 {
		c, err := epcache.New(epcache.Config[int, int]{
			Create: func(ctx context.Context, k int) (int, error) {
				look(ctx)
				return k, nil
			},
		})
		require.NoError(t, err)
		defer c.Close()
		ctx := context.WithValue(context.Background(), key{}, "v")
		k := 0
		return testing.AllocsPerRun(1000, func() {
			k++
			if _, err := c.Get(ctx, k); err != nil {
				t.Fatal(err)
			}
			c.Invalidate(k)
		})
	}
	none := allocs(func(context.Context) {})
	polled := allocs(func(ctx context.Context) {
		_ = ctx.Err()
		_ = ctx.Value(key{})
		_, _ = ctx.Deadline()
	})
	done := allocs(func(ctx context.Context) {
		select {
		case <-ctx.Done():
		default:
		}
	})
	assert.Equal(t, none, polled, "Err, Value and Deadline allocate nothing")
	assert.LessOrEqual(t, done, none+1, "Done allocates its channel and nothing else")
}

// A Get or Acquire whose ctx has ended already is a probe: it returns a
// ready value (leased, for Acquire), and for a key with no ready value
// (absent, being created, a remembered failure) ctx.Err() at once,
// starting no creation and waiting for none. transport/grpcpool's hit
// path and drains rely on it.
func TestAnEndedContextProbesWithoutCreatingOrWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		c, err := epcache.New(epcache.Config[int, int]{
			ErrorTTL: time.Hour,
			Create: func(ctx context.Context, k int) (int, error) {
				switch k {
				case 2:
					<-gate
				case 3:
					return 0, assert.AnError
				}
				return k, nil
			},
		})
		require.NoError(t, err)
		defer func() { require.NoError(t, c.Close()) }()
		_, err = c.Get(context.Background(), 1) // ready
		require.NoError(t, err)
		go func() { _, _ = c.Get(context.Background(), 2) }() // being created
		_, err = c.Get(context.Background(), 3)               // remembered failure
		require.Error(t, err)
		synctest.Wait()
		attempts := c.Stats().Attempts

		ended, cancel := context.WithCancel(context.Background())
		cancel()
		l, err := c.Acquire(ended, 1)
		require.NoError(t, err, "a ready value")
		assert.Equal(t, 1, l.Value())
		l.Release()
		v, err := c.Get(ended, 1)
		require.NoError(t, err)
		assert.Equal(t, 1, v)
		for _, k := range []int{2, 3, 4} {
			_, err := c.Acquire(ended, k)
			assert.ErrorIs(t, err, context.Canceled, "key %d", k)
			_, err = c.Get(ended, k)
			assert.ErrorIs(t, err, context.Canceled, "key %d", k)
		}
		st := c.Stats()
		assert.Equal(t, attempts, st.Attempts, "no creation started")
		assert.Zero(t, st.Waits, "no wait")
		close(gate)
	})
}
