package epcache_test

import (
	"errors"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
)

func TestBackoff(t *testing.T) {
	boom := errors.New("boom")
	t.Run("attempts is the total", func(t *testing.T) {
		retry := epcache.Backoff(time.Millisecond, time.Second, 3, nil)
		_, again := retry(1, boom)
		assert.True(t, again)
		_, again = retry(2, boom)
		assert.True(t, again)
		_, again = retry(3, boom)
		assert.False(t, again, "three attempts made: no fourth")
	})
	t.Run("one attempt means no retry", func(t *testing.T) {
		_, again := epcache.Backoff(time.Millisecond, time.Second, 1, nil)(1, boom)
		assert.False(t, again)
	})
	t.Run("zero attempts means no limit", func(t *testing.T) {
		_, again := epcache.Backoff(time.Millisecond, time.Second, 0, nil)(1_000_000, boom)
		assert.True(t, again)
	})
	t.Run("retryable decides", func(t *testing.T) {
		permanent := errors.New("no such peer")
		retry := epcache.Backoff(time.Millisecond, time.Second, 10, func(err error) bool { return !errors.Is(err, permanent) })
		_, again := retry(1, permanent)
		assert.False(t, again)
		_, again = retry(1, boom)
		assert.True(t, again)
	})
	t.Run("waits double within jitter and stop at max", func(t *testing.T) {
		base, max := 10*time.Millisecond, 300*time.Millisecond
		retry := epcache.Backoff(base, max, 0, nil)
		for attempt := 1; attempt <= 70; attempt++ {
			d := base << min(attempt-1, 20)
			if d > max || attempt > 20 {
				d = max
			}
			seen := map[time.Duration]bool{}
			for range 200 {
				wait, again := retry(attempt, boom)
				assert.True(t, again)
				assert.GreaterOrEqual(t, wait, d/2, "attempt %d", attempt)
				assert.LessOrEqual(t, wait, d, "attempt %d", attempt)
				seen[wait] = true
			}
			assert.Greater(t, len(seen), 50, "attempt %d: waits are jittered", attempt)
		}
	})
	t.Run("huge max does not overflow", func(t *testing.T) {
		retry := epcache.Backoff(time.Second, time.Duration(1<<62), 0, nil)
		for attempt := 1; attempt < 200; attempt++ {
			wait, _ := retry(attempt, boom)
			assert.Positive(t, wait, "attempt %d", attempt)
		}
	})
	t.Run("bad arguments panic with the reason", func(t *testing.T) {
		assert.PanicsWithValue(t, "epcache: Backoff base is 0s; want a positive duration", func() { epcache.Backoff(0, time.Second, 1, nil) })
		assert.PanicsWithValue(t, "epcache: Backoff max 1ms is less than base 1s", func() { epcache.Backoff(time.Second, time.Millisecond, 1, nil) })
		assert.PanicsWithValue(t, "epcache: Backoff attempts is -1; want 0 (unlimited) or a positive count", func() { epcache.Backoff(time.Second, time.Second, -1, nil) })
	})
}
