package epcache_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The buckets double from 1µs, the last has no bound, and a quantile is
// the bound of the bucket that holds it.
func TestHistogramBuckets(t *testing.T) {
	assert.Equal(t, time.Microsecond, epcache.HistogramBound(0))
	assert.Equal(t, 4*time.Microsecond, epcache.HistogramBound(2))
	assert.Equal(t, time.Duration(1<<26)*time.Microsecond, epcache.HistogramBound(epcache.HistogramBuckets-2))
	assert.Equal(t, time.Duration(math.MaxInt64), epcache.HistogramBound(epcache.HistogramBuckets-1))
	var h epcache.Histogram
	assert.Zero(t, h.Quantile(0.5), "no durations")
	h.Counts[3], h.Counts[10] = 9, 1
	assert.Equal(t, uint64(10), h.Count())
	assert.Equal(t, 8*time.Microsecond, h.Quantile(0.5))
	assert.Equal(t, 8*time.Microsecond, h.Quantile(0.9))
	assert.Equal(t, 1024*time.Microsecond, h.Quantile(0.99))
	assert.Equal(t, 8*time.Microsecond, h.Quantile(0), "the first duration's bucket")
	assert.Equal(t, "offered", epcache.OutcomeOffered.String())
	assert.Equal(t, "invalid", epcache.Outcome(-1).String())
}

// Each creation is counted once, when its Create returns, under how it
// ended, with how long it took on the fake clock: a value, an error after a
// retry wait, a panic, one that CreateTimeout answered (counted when its
// Create returns, later), and one an Offer answered. A wait for room is
// counted in RoomWait.
func TestCreateLatencyByOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		proceed := make(chan struct{})
		c, err := epcache.New(epcache.Config[int, *conn]{
			Create: func(ctx context.Context, k int) (*conn, error) {
				switch k {
				case 1:
					time.Sleep(3 * time.Millisecond)
					return newConn(k, 0), nil
				case 2:
					return nil, errors.New("refused")
				case 3:
					panic("boom")
				case 4, 5:
					<-proceed // ignores ctx: a timeout or an Offer answers first
					return newConn(k, 0), nil
				}
				return newConn(k, 0), nil
			},
			Retry:         func(n int, _ error) (time.Duration, bool) { return 10 * time.Millisecond, n < 2 },
			CreateTimeout: time.Second,
		})
		require.NoError(t, err)
		defer c.Close()
		bg := context.Background()
		_, err = c.Get(bg, 1)
		require.NoError(t, err)
		_, err = c.Get(bg, 2)
		require.Error(t, err)
		_, err = c.Get(bg, 3)
		var pe *epcache.PanicError
		require.ErrorAs(t, err, &pe)
		_, err = c.Get(bg, 4)
		require.ErrorIs(t, err, context.DeadlineExceeded) // after a second
		got := goGet(c, bg, 5)
		synctest.Wait()
		require.True(t, c.Offer(5, newConn(5, 1)))
		require.NoError(t, (<-got).err)
		time.Sleep(time.Second)
		close(proceed) // the Creates of 4 and 5 return now, two seconds and one after they began
		synctest.Wait()

		st := c.Stats()
		want := func(outcome epcache.Outcome, d time.Duration) {
			t.Helper()
			h := st.CreateLatency[outcome]
			assert.Equal(t, uint64(1), h.Count(), "%v: one creation", outcome)
			assert.Equal(t, d, h.Sum, "%v: its duration", outcome)
		}
		want(epcache.OutcomeValue, 3*time.Millisecond)
		want(epcache.OutcomeError, 10*time.Millisecond) // two attempts, one wait
		want(epcache.OutcomePanic, 0)
		want(epcache.OutcomeTimeout, 2*time.Second)
		want(epcache.OutcomeOffered, time.Second)
		assert.Zero(t, st.RoomWait.Count(), "no MaxEntries: no wait for room")
	})
	synctest.Test(t, func(t *testing.T) {
		c, err := epcache.New(epcache.Config[int, *conn]{
			MaxEntries: 1,
			Create:     func(_ context.Context, k int) (*conn, error) { return newConn(k, 0), nil },
		})
		require.NoError(t, err)
		defer c.Close()
		bg := context.Background()
		a, err := c.Acquire(bg, 0)
		require.NoError(t, err)
		got := goGet(c, bg, 1) // waits for room until the lease ends
		synctest.Wait()
		time.Sleep(5 * time.Millisecond)
		a.Release()
		require.NoError(t, (<-got).err)
		st := c.Stats()
		assert.Equal(t, uint64(1), st.RoomWaits)
		assert.Equal(t, uint64(1), st.RoomWait.Count())
		assert.Equal(t, 5*time.Millisecond, st.RoomWait.Sum)
	})
}

// A Stats printed with %+v shows each histogram as its count, sum and the
// buckets that counted something, by their bounds, and the creation
// latencies by outcome: no array of 28 unnamed buckets.
func TestStatsPrintReadably(t *testing.T) {
	var h epcache.Histogram
	h.Counts[5], h.Counts[6], h.Counts[epcache.HistogramBuckets-1] = 5, 6, 1
	h.Sum = 823 * time.Microsecond
	if got, want := h.String(), "n=12 sum=823µs [≤32µs:5 ≤64µs:6 >1m7.108864s:1]"; got != want {
		t.Errorf("Histogram.String() = %q, want %q", got, want)
	}
	var st epcache.Stats
	st.CreateLatency[epcache.OutcomeError] = h
	got := fmt.Sprintf("%+v", st)
	for _, want := range []string{"CreateLatency:error: n=12 sum=823µs [≤32µs:5", "RoomWait:n=0"} {
		if !strings.Contains(got, want) {
			t.Errorf("%%+v of Stats is\n%s\nwithout %q", got, want)
		}
	}
}
