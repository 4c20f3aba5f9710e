package shard_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/require"
)

// Two goroutines whose stacks share a hint (fresh goroutines' 2 KiB stacks
// lie four to an 8 KiB block) are not told apart by a ticket, yet leasing
// one value from two cores, each holding a lease while the other takes
// one, grows lines as two goroutines with hints of their own do: the
// first lease that finds the first ticket held with its own hint makes
// every later lease record its P, and from then on each hold the other
// core catches counts.
func TestLeaseLinesGrowForGoroutinesThatShareAHint(t *testing.T) {
	atProcs(t, 2)
	for pair := 0; ; pair++ {
		if pair == 2000 {
			t.Skip("no pair of fresh goroutines shared a hint in 2000 (the allocator's placement): TestLeaseLinesGrowForLeasesThatShareAHint holds the rule")
		}
		tb, s := readySlot(t)
		var hints [4]uint64
		var held [2]shard.Ticket
		shared, grownAt := false, -1
		takeTurns(func(turn int) bool {
			me := turn % 2
			if held[me].Valid() {
				_, err := s.EndLease(held[me])
				require.NoError(t, err)
			}
			got, tk, ok := tb.Lease(1)
			require.True(t, ok)
			require.Equal(t, s, got)
			held[me] = tk // held while the other goroutine leases
			if turn < len(hints) {
				hints[turn], _ = shard.Hint(tk)
			}
			// From turn 2 on, goroutine 0 takes the first ticket on the
			// table's fast path, and goroutine 1, finding it held, a
			// ticket beside it: what matters is whether the hints of
			// those leases are one.
			if turn == 3 {
				if shared = hints[2] == hints[3]; !shared {
					return false
				}
			}
			if shard.LeaseLines(s) > 0 {
				grownAt = turn
				return false
			}
			return turn <= 100000 // beyond, a hang: the check below fails
		})
		for _, tk := range held {
			if tk.Valid() {
				_, err := s.EndLease(tk)
				require.NoError(t, err)
			}
		}
		if !shared {
			continue
		}
		require.GreaterOrEqual(t, grownAt, shard.GrowAfter, "two goroutines sharing hint %#x on two Ps grew lines after %d leases, before GrowAfter", hints[2], grownAt)
		require.Zero(t, s.Leased())
		return
	}
}

// The rule of TestLeaseLinesGrowForGoroutinesThatShareAHint on the lease
// path alone, whatever the allocator does: two goroutines on two Ps that
// lease as one hint, each holding a lease while the other takes one, grow
// lines after GrowAfter holds caught, and not before.
func TestLeaseLinesGrowForLeasesThatShareAHint(t *testing.T) {
	atProcs(t, 2)
	const hint = 0xa5 << 50
	_, s := readySlot(t)
	var held [2]shard.Ticket
	grownAt := -1
	takeTurns(func(turn int) bool {
		me := turn % 2
		if held[me].Valid() {
			_, err := s.EndLease(held[me])
			require.NoError(t, err)
		}
		tk, ok := shard.LeaseWithHint(s, hint)
		require.True(t, ok)
		held[me] = tk
		if shard.LeaseLines(s) > 0 {
			grownAt = turn
			return false
		}
		return turn <= 100000 // beyond, a hang: the check below fails
	})
	for _, tk := range held {
		_, err := s.EndLease(tk)
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, grownAt, 2*shard.GrowAfter, "two goroutines leasing as one hint on two Ps grew lines after %d leases, before GrowAfter holds were caught", grownAt)
	require.Zero(t, s.Leased())
}

// takeTurns is takeTurnsApart with both goroutines' steps at the top of
// their stacks, as fresh goroutines (RunParallel's, a worker pool's) take
// their leases: their stacks are the smallest, which is when they share
// a hint.
func takeTurns(step func(turn int) bool) {
	var turn atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			for n := int64(i); ; n += 2 {
				for turn.Load() != n {
					if stop.Load() {
						return
					}
				}
				if stop.Load() || !step(int(n)) {
					stop.Store(true)
					return
				}
				turn.Add(1)
			}
		})
	}
	wg.Wait()
}
