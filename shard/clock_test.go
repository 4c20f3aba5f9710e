package shard_test

import (
	"context"
	"testing"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The ages of a Ready value: the hit path sees only the young state; the
// clock hand cools, a sweep ages, a use (Touch) makes young again, and a
// removal needs the exact state it saw.
func TestAges(t *testing.T) {
	tb := newTable[int, int](t, shard.Options[int]{})
	s := publish(t, tb, 1, 10)
	hit := func() bool { _, err := tb.Get(shard.NoMiss, 1); return err == nil }
	young := func() bool { return tb.Young(s.State()) }

	require.True(t, young())
	assert.False(t, tb.Cool(s, s.State()), "a young value is kept, once")
	assert.False(t, young())
	assert.Equal(t, shard.Ready, s.State().Status())
	assert.True(t, hit(), "a lookup finds an aged value")
	assert.True(t, tb.Cool(s, s.State()), "a cooled value is a candidate")

	// A use makes it young; a removal that saw the aged state then fails.
	aged := s.State()
	require.True(t, tb.Touch(s, aged))
	assert.True(t, young())
	_, ok := tb.InvalidateState(s, aged)
	assert.False(t, ok, "removed a value used after the hand passed")

	// Idle: IdleSteps sweeps age it, the next reports it expired; a cooled
	// value has not been idle for any sweep.
	require.False(t, tb.Cool(s, s.State()))
	for i := range shard.IdleSteps {
		require.False(t, tb.Age(s, s.State()), "expired after %d sweeps", i)
	}
	require.True(t, tb.Age(s, s.State()))
	v, ok := tb.InvalidateState(s, s.State())
	require.True(t, ok)
	assert.Equal(t, 10, v)
	assert.Equal(t, shard.Dead, s.State().Status())
	assert.False(t, tb.Touch(s, s.State()))
	assert.False(t, tb.Age(s, s.State()))
	assert.False(t, tb.Cool(s, s.State()))
}

// Age and Cool leave every other state alone.
func TestAgesOfOtherStates(t *testing.T) {
	tb := newTable[int, int](t, shard.Options[int]{})
	s := tb.LoadOrInsert(1)
	assert.False(t, tb.Age(s, s.State()))
	assert.False(t, tb.Cool(s, s.State()))
	assert.False(t, tb.Touch(s, s.State()))
	claim, _, ok := s.Claim(s.State(), context.Background())
	require.True(t, ok)
	assert.False(t, tb.Age(s, claim))
	assert.False(t, tb.Cool(s, claim))
	_, ok = tb.InvalidateState(s, claim)
	assert.False(t, ok)
	assert.Equal(t, shard.Creating, s.State().Status())
}

// Want sends the end of a lease held to the slow path, once, and changes
// nothing else.
func TestWatch(t *testing.T) {
	_, s := readySlot(t)
	a, ok := s.Lease(nil)
	require.True(t, ok)
	s.Watch(nil)
	assert.False(t, shard.TryEnd[uint64](a), "a watched value's lease ended on the fast path")
	last, watched, err := s.EndWatchedLease(a)
	require.NoError(t, err)
	assert.False(t, last)
	assert.True(t, watched, "the end of a watched lease did not say so")
	assert.Zero(t, s.Leased())
	b, ok := s.Lease(nil) // the ticket a held: its end served the want
	require.True(t, ok)
	assert.Equal(t, 1, s.Leased())
	assert.True(t, shard.TryEnd[uint64](b), "a want, served by the end of the lease it found, sent the next lease to the slow path")
	c, ok := s.Lease(nil)
	require.True(t, ok)
	d, ok := s.Lease(nil) // the second ticket, free but marked by Want
	require.True(t, ok)
	_, watched, err = s.EndWatchedLease(d)
	require.NoError(t, err)
	assert.True(t, watched, "the first lease of a ticket marked free: its end did not say it was watched")
	d, ok = s.Lease(nil) // the second ticket again, whose end takes the slow path, unwatched now
	require.True(t, ok)
	_, watched, err = s.EndWatchedLease(d)
	require.NoError(t, err)
	assert.False(t, watched, "the end of a second lease, not watched, said it was")
	require.True(t, shard.TryEnd[uint64](c))
	_, err = s.EndLease(b)
	assert.ErrorIs(t, err, shard.ErrLeaseEnded)
	assert.True(t, s.Abandon())
}
