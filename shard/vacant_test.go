package shard

import (
	"context"
	"testing"
)

// publish claims key's slot in tb and publishes v on it.
func publish(t *testing.T, tb *Table[int, int], key, v int) *Slot[int, int] {
	t.Helper()
	s := tb.LoadOrInsert(key)
	claim, f, ok := s.Claim(s.State(), context.Background())
	if !ok {
		t.Fatalf("claim of key %d", key)
	}
	f.TryResolve()
	if !tb.Publish(s, claim, v) {
		t.Fatalf("publish of key %d", key)
	}
	f.Finish(v, nil, claim.flight.until)
	return s
}

// An invalidated key's cell holds the table's vacant slot, which no lookup
// takes for a live slot: not the zero key's, whose slot is K's zero value
// like the vacant one's key, even when the invalidated key has the zero
// key's tag (the vacant slot's control byte is never that tag), nor any
// other key's. All and Seal pass it over, and a rebuild drops it.
func TestVacantSlotMatchesNoLookup(t *testing.T) {
	tb, err := New[int, int](Options[int]{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	zeroTag := tagOf(tb.Hash(0))
	// Keys with the zero key's tag, and others.
	var same, other []int
	for k := 1; len(same) < 4 || len(other) < 20; k++ {
		if tagOf(tb.Hash(k)) == zeroTag {
			if len(same) < 4 {
				same = append(same, k)
			}
		} else if len(other) < 20 {
			other = append(other, k)
		}
	}
	keys := append(append([]int{}, same...), other...)
	for _, k := range keys {
		publish(t, tb, k, 100+k)
	}
	// Invalidate every one: each cell takes the vacant slot.
	for _, k := range keys {
		if _, ok := tb.Invalidate(tb.Lookup(k)); !ok {
			t.Fatalf("invalidate %d", k)
		}
	}
	vacant := 0
	sh := tb.shardOf(0)
	sh.cells.Load().each(func(s *Slot[int, int]) bool {
		if s == tb.vacant {
			vacant++
		}
		return true
	})
	if vacant != len(keys) {
		t.Fatalf("%d cells hold the vacant slot after %d invalidations; want one each", vacant, len(keys))
	}
	// The zero key was never inserted: no lookup of it finds a slot.
	if s := tb.Lookup(0); s != nil {
		t.Fatalf("Lookup(0) found a slot (vacant: %t) though key 0 was never inserted", s == tb.vacant)
	}
	if _, ok := tb.Load(0); ok {
		t.Fatal("Load(0) found a value though key 0 was never inserted")
	}
	for _, k := range keys {
		if s := tb.Lookup(k); s != nil {
			t.Fatalf("Lookup(%d) found a slot (vacant: %t) after its invalidation", k, s == tb.vacant)
		}
	}
	// The zero key and the others are inserted and found as usual.
	publish(t, tb, 0, 7)
	if v, ok := tb.Load(0); !ok || v != 7 {
		t.Fatalf("Load(0) = %d, %t; want 7, true", v, ok)
	}
	for _, k := range same {
		publish(t, tb, k, 200+k)
		if v, ok := tb.Load(k); !ok || v != 200+k {
			t.Fatalf("Load(%d) = %d, %t; want %d, true", k, v, ok, 200+k)
		}
	}
	for s := range tb.All() {
		if s == tb.vacant {
			t.Fatal("All yielded the vacant slot")
		}
	}
	// A rebuild drops the tombstones and keeps the live slots.
	sh.mu.Lock()
	a := tb.rebuild(sh, sh.cells.Load())
	sh.mu.Unlock()
	n := 0
	a.each(func(s *Slot[int, int]) bool {
		if s == tb.vacant {
			t.Fatal("a rebuild kept the vacant slot")
		}
		n++
		return true
	})
	if n != 1+len(same) {
		t.Fatalf("%d slots after the rebuild; want %d, the live ones", n, 1+len(same))
	}
	// A tombstone just above a slot of the zero key's tag, in one group:
	// the match of seven control bytes at once may flag the byte above a
	// match (a borrow), which the key comparison then sorts out, and the
	// vacant slot's key is the zero key's. A fresh table of one shard has
	// one group until its sixth slot.
	tb2, err := New[int, int](Options[int]{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	var a2, b2 int
	for k := 1; a2 == 0 || b2 == 0; k++ {
		if tagOf(tb2.Hash(k)) == tagOf(tb2.Hash(0)) {
			if a2 == 0 {
				a2 = k
			}
		} else if b2 == 0 {
			b2 = k
		}
	}
	publish(t, tb2, a2, 1) // slot 0 of the group, the zero key's tag
	publish(t, tb2, b2, 2) // slot 1
	if _, ok := tb2.Invalidate(tb2.Lookup(b2)); !ok {
		t.Fatal("invalidate")
	}
	if s := tb2.Lookup(0); s != nil {
		t.Fatalf("Lookup(0) found a slot (vacant: %t) beside key %d, of the zero key's tag, though key 0 was never inserted", s == tb2.vacant, a2)
	}
	if s := tb2.LoadOrInsert(0); s == tb2.vacant || s.State() == tb2.dead {
		t.Fatal("LoadOrInsert(0) returned a Dead slot")
	}

	// Seal leaves the vacant slot Dead.
	for _, k := range same {
		tb.Invalidate(tb.Lookup(k))
	}
	if err := tb.Seal(func(*Slot[int, int], *State[int]) {}); err != nil {
		t.Fatal(err)
	}
	if st := tb.vacant.State(); st != tb.dead {
		t.Fatalf("the vacant slot is %v after Seal; want Dead", st.Status())
	}
}
