package shard_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/require"
)

// Fresh goroutines (RunParallel's, a worker pool's) leasing one value from
// two cores, each holding a lease while the other takes one, grow lines,
// also when their 2 KiB stacks lie in one 8 KiB block (where a hint from
// the stack's address would not tell them apart): their hints come from
// their g's. A pair whose hints hash alike (one in 256) is taken for one
// goroutine and skipped.
func TestFreshGoroutinesLeaseAsTwo(t *testing.T) {
	if !shard.GoroutineHints {
		t.Skip("hints come from the stack on this architecture")
	}
	atProcs(t, 2)
	const pairs = 40
	oneBlock, grew := 0, 0
	for pair := range pairs {
		tb, s := readySlot(t)
		var hints [2]uint64
		var blocks [2]uintptr
		var held [2]shard.Ticket
		grownAt := -1
		takeTurns(func(turn int) bool {
			me := turn % 2
			if turn < 2 {
				var anchor byte
				blocks[me] = uintptr(unsafe.Pointer(&anchor)) >> 13
			}
			if held[me].Valid() {
				_, err := s.EndLease(held[me])
				require.NoError(t, err)
			}
			_, tk, ok := tb.Lease(1)
			require.True(t, ok)
			held[me] = tk // held while the other goroutine leases
			if turn < 2 {
				hints[me], _ = shard.Hint(tk)
			}
			if turn == 1 && hints[0] == hints[1] {
				return false
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
		require.Zero(t, s.Leased())
		if hints[0] == hints[1] {
			continue
		}
		if blocks[0] == blocks[1] {
			oneBlock++
		}
		require.GreaterOrEqual(t, grownAt, shard.GrowAfter, "pair %d: two fresh goroutines (hints %#x, %#x; stacks in one 8 KiB block: %v) grew lines after %d leases, or never",
			pair, hints[0], hints[1], blocks[0] == blocks[1], grownAt)
		grew++
	}
	t.Logf("%d pairs of %d grew lines; %d of them had stacks in one 8 KiB block", grew, pairs, oneBlock)
}

// Leases that carry one hint are one goroutine's, whichever P they come
// from: two goroutines leasing as one hint on two Ps, each holding a lease
// while the other takes one, grow no lines, however long they go on. It is
// the rule that keeps one goroutine that moves between Ps while it nests
// leases from growing lines, and the price of a hint of eight bits: two
// goroutines whose hints hash alike are taken for one.
func TestLeasesThatShareAHintGrowNoLines(t *testing.T) {
	atProcs(t, 2)
	const hint = 0x1a5 << 48
	_, s := readySlot(t)
	var held [2]shard.Ticket
	var pids [2]int
	apart := 0
	takeTurns(func(turn int) bool {
		me := turn % 2
		if held[me].Valid() {
			_, err := s.EndLease(held[me])
			require.NoError(t, err)
		}
		tk, ok := shard.LeaseWithHint(s, hint)
		require.True(t, ok)
		held[me] = tk
		if pids[me] = shard.PID(); pids[0] != pids[1] {
			apart++
		}
		return turn <= 20*shard.GrowAfter
	})
	for _, tk := range held {
		_, err := s.EndLease(tk)
		require.NoError(t, err)
	}
	require.Zero(t, s.Leased())
	require.Zero(t, shard.LeaseLines(s), "leases of one hint grew lines (%d turns on two Ps)", apart)
}

// Each hold of the first ticket that leases from another P catch counts
// once, whatever its generation: goroutine 0 takes and ends perTurn-1
// leases before each lease it holds, and goroutine 1 leases three times
// while it holds, on another P. Lines grow at the GrowAfter-th hold caught
// from another P, and not before.
func TestEveryCaughtHoldCountsOnce(t *testing.T) {
	for _, perTurn := range []int{1, 255, 256, 257, 512, 4096} {
		t.Run(fmt.Sprint(perTurn), func(t *testing.T) {
			atProcs(t, 2)
			hints := [2]uint64{0x1a5 << 48, 0x15a << 48}
			_, s := readySlot(t)
			var held shard.Ticket
			caught, unsure, grownAt := 0, 0, -1
			lease := func(me int) shard.Ticket {
				tk, ok := shard.LeaseWithHint(s, hints[me])
				require.True(t, ok)
				return tk
			}
			end := func(tk shard.Ticket) {
				_, err := s.EndLease(tk)
				require.NoError(t, err)
			}
			takeTurns(func(turn int) bool {
				if turn%2 == 0 {
					if held.Valid() {
						end(held)
					}
					for range perTurn - 1 {
						end(lease(0))
					}
					held = lease(0)
					return true
				}
				p := shard.PID()
				for range 3 {
					end(lease(1))
				}
				switch _, hp := shard.Hint(held); {
				case shard.PID() != p:
					unsure++
				case int(hp) != p:
					caught++
				}
				if shard.LeaseLines(s) > 0 {
					grownAt = caught
					return false
				}
				require.Less(t, caught, shard.GrowAfter, "GrowAfter holds caught from another P, and no lines")
				return turn <= 100000
			})
			end(held)
			require.Zero(t, s.Leased())
			require.GreaterOrEqual(t, grownAt, 0, "no lines grown after %d holds caught", caught)
			require.LessOrEqual(t, shard.GrowAfter, caught+unsure, "lines grown after %d holds caught from another P (%d more maybe), before GrowAfter", caught, unsure)
		})
	}
}

// takeTurns is takeTurnsApart with both goroutines' steps at the top of
// their stacks, as fresh goroutines (RunParallel's, a worker pool's) take
// their leases.
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
