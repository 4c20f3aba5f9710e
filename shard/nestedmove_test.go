package shard_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/require"
)

// moveToAnotherP makes the calling goroutine run on a P other than from,
// or fails the test.
func moveToAnotherP(t *testing.T, from int) int {
	t.Helper()
	for i := 0; i < 200000; i++ {
		if p := shard.PID(); p != from {
			return p
		}
		if i%2 == 0 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Microsecond)
		}
	}
	t.Fatalf("never moved off P %d", from)
	return -1
}

// "A value leased from one P at a time never grows: one goroutine
// holding several leases of it at once" and "One goroutine that both
// leases from call depths far apart and moves to another P between leases
// is taken for two, once per move." One goroutine, one move, then only
// nested leases on one P: at most one piece of evidence, no growth.
func TestNestedLeasesAfterOneMoveDoNotGrow(t *testing.T) {
	atProcs(t, 2)
	tb, s := readySlot(t)
	// The first lease records this goroutine's hint and P.
	_, tk, ok := tb.Lease(1)
	require.True(t, ok)
	_, err := s.EndLease(tk)
	require.NoError(t, err)
	p0 := shard.PID()
	p1 := moveToAnotherP(t, p0)
	grownAt := -1
	for i := range 4 * shard.GrowAfter {
		if shard.PID() != p1 {
			t.Skip("moved again; the test needs one move")
		}
		_, outer, ok := tb.Lease(1)
		require.True(t, ok)
		_, inner, ok := tb.Lease(1)
		require.True(t, ok)
		_, err := s.EndLease(inner)
		require.NoError(t, err)
		_, err = s.EndLease(outer)
		require.NoError(t, err)
		if grownAt < 0 && shard.LeaseLines(s) > 0 {
			grownAt = i
		}
	}
	require.Zero(t, shard.LeaseLines(s), "one goroutine that moved once from P %d to P %d grew %d lines with nested leases (at iteration %d)", p0, p1, shard.LeaseLines(s), grownAt)
}

// One goroutine holds a lease across one move to another P, then takes
// (and ends) nested leases from 24 KiB further down its stack: one
// goroutine, one P at a time, no growth. Where hints come from the stack,
// the nested leases have another hint and find the outer lease's P stale:
// no evidence either.
func TestNestedLeasesFromAnotherDepthAfterOneMoveDoNotGrow(t *testing.T) {
	atProcs(t, 2)
	tb, s := readySlot(t)
	end := func(tk shard.Ticket) {
		_, err := s.EndLease(tk)
		require.NoError(t, err)
	}
	lease := func() shard.Ticket {
		_, tk, ok := tb.Lease(1)
		require.True(t, ok)
		return tk
	}
	const depth = 24 << 10
	var hints [2]uint64
	for range 2 { // the lease table, this goroutine's stack at depth
		tk := lease()
		hints[0], _ = shard.Hint(tk)
		end(tk)
		atDepth(depth, func() { tk := lease(); hints[1], _ = shard.Hint(tk); end(tk) })
	}
	if shard.GoroutineHints {
		require.Equal(t, hints[0], hints[1], "one goroutine, two hints")
	}
	outer := lease() // held across the move
	p0 := shard.PID()
	p1 := moveToAnotherP(t, p0)
	moves := 1
	for range 4 * shard.GrowAfter {
		if p := shard.PID(); p != p1 {
			moves++
			p1 = p
		}
		atDepth(depth, func() { end(lease()) })
	}
	end(outer)
	require.Zero(t, shard.LeaseLines(s), "one goroutine, %d move(s) (P %d to P %d), nested leases from 24 KiB deeper: grew %d lines", moves, p0, p1, shard.LeaseLines(s))
}

// One goroutine that moves while it holds each outer lease, and takes one
// nested lease after each move, is one goroutine on one P at a time, at
// any GOMAXPROCS: no growth, however many such holds.
func TestOneGoroutineMovingWhileHoldingDoesNotGrow(t *testing.T) {
	for _, procs := range []int{2, 4, 8} {
		atProcs(t, procs)
		tb, s := readySlot(t)
		holds := 0
		for ; holds < 4*shard.GrowAfter && shard.LeaseLines(s) == 0; holds++ {
			_, outer, ok := tb.Lease(1)
			require.True(t, ok)
			moveToAnotherP(t, shard.PID())
			_, inner, ok := tb.Lease(1)
			require.True(t, ok)
			_, err := s.EndLease(inner)
			require.NoError(t, err)
			_, err = s.EndLease(outer)
			require.NoError(t, err)
		}
		require.Zero(t, shard.LeaseLines(s), "GOMAXPROCS %d: one goroutine grew %d lines after %d holds, each with one move", procs, shard.LeaseLines(s), holds)
	}
}

// One goroutine that moved once, holding nothing, then leases as before,
// an outer lease at one depth and a nested one 24 KiB further down: its
// outer leases take the ticket with its own hint and read no P (the
// ticket's P is stale), and its nested leases still grow nothing.
func TestTwoDepthsNestedAfterOneMoveBetweenLeasesDoNotGrow(t *testing.T) {
	atProcs(t, 2)
	tb, s := readySlot(t)
	end := func(tk shard.Ticket) {
		_, err := s.EndLease(tk)
		require.NoError(t, err)
	}
	lease := func() shard.Ticket {
		_, tk, ok := tb.Lease(1)
		require.True(t, ok)
		return tk
	}
	const depth = 24 << 10
	for range 2 {
		atDepth(depth, func() { end(lease()) })
		end(lease())
	}
	p0 := shard.PID()
	p1 := moveToAnotherP(t, p0) // holding nothing
	for range 4 * shard.GrowAfter {
		if shard.PID() != p1 {
			t.Skip("moved again; the test needs one move")
		}
		outer := lease()
		atDepth(depth, func() { end(lease()) })
		end(outer)
	}
	require.Zero(t, shard.LeaseLines(s), "one goroutine, one move (P %d to P %d) between leases, outer and nested leases from two depths: grew %d lines", p0, p1, shard.LeaseLines(s))
}

// Goroutine G moved once, holding nothing, and then holds a lease (taken
// with its own hint, reading no P: its ticket keeps the P before the move)
// while goroutine H, on the same P as G, takes and ends leases: two
// goroutines taking turns on one P, no growth.
func TestTwoGoroutinesOnOnePAfterAMoveDoNotGrow(t *testing.T) {
	atProcs(t, 2)
	for attempt := 0; attempt < 200; attempt++ {
		tb, s := readySlot(t)
		_, tk, ok := tb.Lease(1)
		require.True(t, ok)
		_, err := s.EndLease(tk)
		require.NoError(t, err)
		p0 := shard.PID()
		p1 := moveToAnotherP(t, p0)
		_, outer, ok := tb.Lease(1)
		require.True(t, ok)
		if shard.PID() != p1 {
			_, _ = s.EndLease(outer)
			continue
		}
		done := make(chan int)
		var hh uint64
		go func() {
			hp := shard.PID()
			for range 4 * shard.GrowAfter {
				if shard.PID() != hp {
					hp = -1
					break
				}
				_, tk, ok := tb.Lease(1)
				if !ok {
					panic("no lease")
				}
				hh, _ = shard.Hint(tk)
				if _, err := s.EndLease(tk); err != nil {
					panic(err)
				}
			}
			done <- hp
		}()
		hp := <-done
		gp := shard.PID()
		_, err = s.EndLease(outer)
		require.NoError(t, err)
		if gh, _ := shard.Hint(outer); hp != p1 || gp != p1 || hh == gh {
			continue // H ran on the other P, or moved, or G did, or H has G's hint: try again
		}
		require.Zero(t, shard.LeaseLines(s), "attempt %d: G (moved from P %d) and H both on P %d, H leasing while G held its lease: grew %d lines", attempt, p0, p1, shard.LeaseLines(s))
		return
	}
	t.Skip("H never ran on G's P")
}
