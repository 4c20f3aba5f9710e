package epcache

import (
	"unsafe"

	"github.com/epcache/epcache/shard"
)

// Offer gives the cache a value made elsewhere, such as a connection a peer
// opened to this process and a listener accepted.
//
// If key holds no value and no creation (a remembered failure, see
// Config.ErrorTTL, counts as neither), v is stored, the cache owns it (it
// is released exactly once, like a created value) and Offer returns true.
//
// If a creation of key is in flight, v answers it: the Gets waiting for the
// creation, the one running Create included, get v at once, v is stored and
// owned by the cache, and Offer returns true. The creation's context is
// cancelled, with ErrOffered as its cause, so that Create may stop; the value
// it returns anyway is released as soon as it returns, and no other Create
// of key starts before it does. That is the rule a
// transport's simultaneous-connect tie-break can rely on: whichever of the
// accepted and the dialed connection reaches the cache first is the
// endpoint, and the other is released. A creation already answered by its
// CreateTimeout, whose Create is still running, cannot be answered twice:
// Offer returns false.
//
// If key holds a value, or Close has begun, Offer returns false and v stays
// the caller's: the cache never releases it. So it does under
// Config.MaxEntries when the cache is full: an Offer takes room only if
// some is free, and neither evicts nor waits (it does not block).
//
// Offer does not block and calls nothing of the caller's.
func (c *Cache[K, V]) Offer(key K, v V) bool {
	if c.table.Closed() {
		return false
	}
	if c.room != nil {
		if !c.room.tryTake() {
			return false // full: v stays the caller's
		}
		if !c.offerKey(key, v) {
			c.room.put()
			return false
		}
		return true
	}
	return c.offerKey(key, v)
}

func (c *Cache[K, V]) offerKey(key K, v V) bool {
	s := c.table.LoadOrInsert(key)
	for {
		st := s.State()
		switch st.Status() {
		case shard.Ready, shard.Sealed:
			return false
		case shard.Dead:
			s = c.table.LoadOrInsert(key)
			continue
		}
		if done, ok := c.offerIn(s, st, v); done {
			return ok
		}
	}
}

// offerIn is offer inside s's gate, so that Close waits for a value it
// stores; once Close has shut the gate, it stores nothing (done, not ok).
func (c *Cache[K, V]) offerIn(s *shard.Slot[K, V], st *shard.State[V], v V) (done, ok bool) {
	g := &c.stats.of(unsafe.Pointer(s)).gate
	if !g.enter() {
		return true, false // Close has begun
	}
	done, ok = c.offer(s, st, v)
	g.exit()
	return done, ok
}

// offer tries to store v in s, whose state was st; done is false when s
// changed first (look again). Called inside s's gate, so that Close waits
// for a value it stores.
func (c *Cache[K, V]) offer(s *shard.Slot[K, V], st *shard.State[V], v V) (done, ok bool) {
	stats := c.stats.of(unsafe.Pointer(s))
	if st.Status() == shard.Creating {
		f := st.Flight()
		if !f.TryResolve() {
			// The creation finished first (its value is being published,
			// or its error settled), or its timeout answered its callers
			// while its Create runs on.
			<-f.Done()
			if _, err := f.Result(); err == nil || f.Until().IsZero() && s.State() == st {
				return true, false
			}
			return false, false
		}
		// The creation's claim becomes Ready with v, and the creation a
		// straggler: its Create's own value is released when it returns
		// (settle), and until then the key may not be created again,
		// even if v is invalidated.
		s.MarkStraggler(f, c)
		stats.offers.Add(1)
		c.publish(s, st, f, v, shard.Nanotime())
		f.Cancel(ErrOffered) // its value is no longer wanted: Create may stop
		return true, true
	}
	// Empty, a remembered failure, or Straggling (a straggler still runs: v
	// may be stored, no Create may start): claimed like a creation,
	// published at once.
	claim, f, claimed := s.ClaimResolved(st)
	if !claimed {
		// Another goroutine moved the slot first, or it holds a timed-out
		// creation still running, which nothing may overlap.
		if s.State() == st {
			return true, false
		}
		return false, false
	}
	if st.Status() == shard.Straggling {
		s.MarkStraggler(st.Flight(), c) // the straggler carries over to v's successor
	}
	stats.offers.Add(1)
	c.publish(s, claim, f, v, shard.Nanotime())
	return true, true
}
