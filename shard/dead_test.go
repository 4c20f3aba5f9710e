package shard

import (
	"context"
	"testing"
)

// An invalidation makes its slot Dead and puts the key's fresh slot in its
// place in one step, which no rebuild of the shard can come between: a
// rebuild leaves Dead slots behind, and the fresh slot is what carries a
// straggler (Slot.MarkStraggler). Had a rebuild dropped the Dead slot
// first, the key's next slot would start Empty, and a second creation of
// the key would start while the first still ran. The test hook rebuilds the
// shard the moment the slot is Dead, if it can take the shard's mutex then.
func TestNoRebuildBetweenDeathAndRenewal(t *testing.T) {
	tb, err := New[int, int](Options[int]{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := tb.LoadOrInsert(1)
	claim, f, ok := s.Claim(nil, context.Background())
	if !ok {
		t.Fatal("claim")
	}
	// An Offer answers the creation, whose Create still runs.
	if !f.TryResolve() {
		t.Fatal("resolve")
	}
	s.MarkStraggler(f, nil)
	tb.Publish(s, claim, 10)
	f.Finish(10, nil, claim.flight.until)

	rebuilt := false
	testHookDead = func(shd any) {
		sh := shd.(*shard[int, int])
		if sh.mu.TryLock() {
			tb.rebuild(sh, sh.cells.Load())
			sh.mu.Unlock()
			rebuilt = true
		}
	}
	defer func() { testHookDead = nil }()
	if _, ok := tb.Invalidate(s); !ok {
		t.Fatal("invalidate")
	}
	next := tb.LoadOrInsert(1)
	if got := next.State().Status(); got != Straggling {
		t.Fatalf("the key's next slot is %v (a rebuild ran between the death and the renewal: %t); want blocked until the first Create returns", got, rebuilt)
	}
	f.MarkReturned()
	if !next.ClearStraggler(next.State()) {
		t.Fatal("the block did not end when the first Create returned")
	}
}
