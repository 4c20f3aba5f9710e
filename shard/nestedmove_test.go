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
