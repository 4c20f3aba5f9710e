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

// Config.MaxEntries: a Release may call Get, but not of the key whose
// creation evicted its value: that creation waits for the Release, and
// the Get waits for the creation, until the Get's context ends. Then
// both go on: the Get with its context's error, the creation with its
// value.
func TestAReleaseThatGetsTheKeyThatEvictedItWaitsForItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c *epcache.Cache[int, int]
		inner := make(chan error, 1)
		c, err := epcache.New(epcache.Config[int, int]{
			MaxEntries: 1,
			Create:     func(_ context.Context, k int) (int, error) { return k, nil },
			Release: func(k, _ int) {
				if k == 1 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
					defer cancel()
					_, err := c.Get(ctx, 2)
					inner <- err
				}
			},
		})
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Get(context.Background(), 1)
		require.NoError(t, err)
		start := time.Now()
		v, err := c.Get(context.Background(), 2) // evicts 1: Release(1) runs here
		require.NoError(t, err)
		assert.Equal(t, 2, v)
		assert.ErrorIs(t, <-inner, context.DeadlineExceeded, "the Get in Release(1) waits for the creation that waits for it")
		assert.Equal(t, time.Hour, time.Since(start), "until its context ends")
	})
}
