package shard_test

import (
	"testing"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/require"
)

// Two goroutines on two Ps that take turns leasing a value, a few leases a
// turn, never two at once, move its line between the cores at every turn,
// as goroutines that take one lease a turn do (TestLeaseLinesGrowWhenLeasesMove):
// the value grows lines. The leases after the first of a turn are taken
// by the goroutine that took the ticket last, and read no P.
func TestLeaseLinesGrowWhenBurstsMove(t *testing.T) {
	atProcs(t, 2)
	for _, burst := range []int{2, 3, 8} {
		tb, s := readySlot(t)
		one := leaseAndEnd(t, tb, s)
		grown := -1
		takeTurnsTold(t, func() (tk shard.Ticket, ok bool) {
			for range burst {
				if tk, ok = one(); !ok {
					break
				}
			}
			return tk, ok
		}, func(turn int) bool {
			if shard.LeaseLines(s) > 0 {
				grown = turn
				return false
			}
			return turn <= 100000 // beyond, a hang: the check below fails
		})
		require.GreaterOrEqual(t, grown, shard.GrowAfter, "bursts of %d leases taking turns on two Ps: lines grown after %d turns (-1: none in 100,000), before GrowAfter moves", burst, grown)
		require.Zero(t, s.Leased())
	}
}

// Goroutines that take turns leasing a value, each handing the turn over
// on the P where it ended its lease, having moved there while it held the
// lease, write its line from one core at a time: a lease taken on the P
// where the last one ended finds the line in its core's cache, wherever
// that lease was taken. The value grows nothing.
func TestTurnsOnThePOfTheLastEndDoNotGrow(t *testing.T) {
	atProcs(t, 2)
	const turns = 4 * shard.GrowAfter
	for attempt := 0; attempt < 100; attempt++ {
		tb, s := readySlot(t)
		// Each goroutine, at its turn: lease, move, end, and hand over;
		// an unbuffered channel's receiver runs on the sender's P, as
		// a rule. ended is the P of the last end, taken the P of the
		// lease after it.
		var ended, taken [turns]int
		var hints [2]uint64
		handoff := [2]chan int{make(chan int), make(chan int)}
		done := make(chan struct{})
		for i := range 2 {
			go func() {
				defer func() { done <- struct{}{} }()
				for n := range handoff[i] {
					if n == turns {
						return
					}
					_, tk, ok := tb.Lease(1)
					if !ok {
						t.Error("no lease of a ready value")
						return
					}
					taken[n] = shard.PID()
					hints[i], _ = shard.Hint(tk)
					ended[n] = moveToAnotherP(t, taken[n])
					if _, err := s.EndLease(tk); err != nil {
						t.Error(err)
						return
					}
					handoff[1-i] <- n + 1
				}
			}()
		}
		handoff[0] <- 0
		<-done
		close(handoff[0])
		close(handoff[1])
		<-done
		good := hints[0] != hints[1]
		for n := 1; n < turns; n++ {
			good = good && taken[n] == ended[n-1]
		}
		if !good {
			continue // a lease taken on another P than the last end, or two goroutines with one hint: try again
		}
		require.Zero(t, shard.LeaseLines(s), "attempt %d: %d turns, each lease taken on the P where the last ended, grew %d lines", attempt, turns, shard.LeaseLines(s))
		return
	}
	t.Skip("no attempt whose every lease was taken on the P of the last end")
}
