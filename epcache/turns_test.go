package epcache_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/require"
)

// Acquire's doc: "a value whose leases keep coming from goroutines on
// different Ps grows lines". Two goroutines, each holding a P (they spin
// while they wait), take turns at a few leases each, never two at once:
// every turn moves the value's line from one core to the other, and the
// value grows; so it does beside one lease that the test holds throughout
// (a lease held across a long call, on the value's first ticket). Two
// goroutines whose identities hash alike count as one (one pair in 256):
// a pair that grows nothing stays parked, alive, and another pair, with
// other identities, tries again.
func TestBurstsOfLeasesFromTwoPsGrow(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	ctx := context.Background()
	for _, tc := range []struct {
		burst int
		held  bool
	}{{2, false}, {3, false}, {1, true}, {2, true}} {
		burst := tc.burst
		c := intCache(t)
		if tc.held {
			long, err := c.Acquire(ctx, 1)
			require.NoError(t, err)
			defer long.Release()
		}
		parked := make(chan struct{})
		grown := false
		for pair := 0; pair < 4 && !grown; pair++ {
			var turn atomic.Int64
			var stop atomic.Bool
			var held sync.WaitGroup
			held.Add(2)
			for i := range 2 {
				go func() {
					defer func() { held.Done(); <-parked }()
					for n := int64(i); n < 200000 && !stop.Load(); n += 2 {
						for turn.Load() != n {
							if stop.Load() {
								return
							}
						}
						for range burst {
							l, err := c.Acquire(ctx, 1)
							if err != nil {
								t.Error(err)
								stop.Store(true)
								return
							}
							l.Release()
						}
						if epcache.LeaseLines(c, 1) > 0 {
							stop.Store(true)
						}
						turn.Add(1)
					}
					stop.Store(true)
				}()
			}
			held.Wait()
			grown = epcache.LeaseLines(c, 1) > 0
		}
		close(parked)
		require.True(t, grown, "bursts of %d leases from two goroutines taking turns on two Ps, four pairs, another lease held throughout %v: no lease lines grown", burst, tc.held)
	}
}

// Acquire's doc: a value never grows when "each [goroutine leases] it on
// the P where the last lease of it ended". Goroutines take turns, each
// moving to another P while it holds its lease (a blocking send) and
// handing the turn over on the P where it ended it, so that the next
// lease is taken there: one core writes the value's line at a time.
func TestTurnsOnThePOfTheLastReleaseDoNotGrow(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	ctx := context.Background()
	const turns = 64
	for attempt := 0; attempt < 100; attempt++ {
		c := intCache(t)
		var ended, taken [turns]int
		handoff := [2]chan int{make(chan int), make(chan int)}
		done := make(chan struct{})
		for i := range 2 {
			go func() {
				defer func() { done <- struct{}{} }()
				for n := range handoff[i] {
					if n == turns {
						return
					}
					l, err := c.Acquire(ctx, 1)
					if err != nil {
						t.Error(err)
						return
					}
					taken[n] = currentP()
					ended[n] = moveOffP(t, taken[n])
					l.Release()
					handoff[1-i] <- n + 1
				}
			}()
		}
		handoff[0] <- 0
		<-done
		close(handoff[0])
		close(handoff[1])
		<-done
		good := true
		for n := 1; n < turns; n++ {
			good = good && taken[n] == ended[n-1]
		}
		if !good {
			continue // a lease taken on another P than the last release: try again
		}
		require.Zero(t, epcache.LeaseLines(c, 1), "attempt %d: %d turns, each lease taken on the P where the last was released: the value grew lease lines", attempt, turns)
		return
	}
	t.Skip("no attempt whose every lease was taken on the P of the last release")
}
