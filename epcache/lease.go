package epcache

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/epcache/epcache/shard"
)

// Lease is a hold on a value of the cache, from [Cache.Acquire] to
// [Lease.Release]: until then the cache does not release the value, even
// once Invalidate, CompareAndInvalidate or Close has removed it. A Lease is
// a small value: copy it freely, but release it exactly once. Its zero value
// holds nothing.
type Lease[K comparable, V any] struct {
	c  *Cache[K, V]
	s  *shard.Slot[K, V]
	tk shard.Ticket
}

// Value returns the leased value (the zero V for the zero Lease). It stays
// valid, and unreleased, until the lease's Release.
func (l Lease[K, V]) Value() V {
	if l.s == nil {
		var zero V
		return zero
	}
	return l.s.Value()
}

// Key returns the key the lease was acquired for.
func (l Lease[K, V]) Key() K {
	if l.s == nil {
		var zero K
		return zero
	}
	return l.s.Key()
}

// Release ends the lease. If the cache has given the value up meanwhile
// (Invalidate, CompareAndInvalidate, Close) and this was its last lease,
// Config.Release runs now, on the calling goroutine, before Release returns;
// a panic in it propagates, as from Invalidate. Releasing the zero Lease, or
// a lease (or a copy of one) already released, panics with a message that
// says so: it is a bug that would otherwise release an endpoint still in use
// or release one twice. A lease's Release takes no lock and allocates
// nothing.
func (l Lease[K, V]) Release() {
	// The common case inlines into the caller: the first lease of a value
	// still in the cache, ended by one compare-and-swap.
	if !l.s.EndFirstLease(l.tk) { // false for the zero Lease, before it reads l.s
		l.release()
	}
}

// release is Release for every other lease, and for misuse.
func (l Lease[K, V]) release() {
	if l.s == nil {
		panic("epcache: Release of a zero Lease")
	}
	last, wanted, err := l.s.EndWantedLease(l.tk)
	if err != nil {
		panic(fmt.Sprintf("epcache: Lease of key %v released twice", l.s.Key()))
	}
	if last {
		l.c.releaseLast(l.s, false) // its room comes back
		return
	}
	if wanted {
		// An eviction found the value leased: it may take it now. (Not
		// every lease that ends here: the second lease of a value held
		// at once does too, and in a hot set, kicks for those were a
		// seventh of the CPU.)
		l.c.kick()
	}
}

// Acquire is Get plus a lease: it returns key's value, creating it if the
// cache holds none, as Get does (same waits, same errors, same context
// rules), held by a Lease that keeps the cache from releasing the value
// until the Lease's Release. Use it around a use that must not see the
// endpoint closed under it: a send on a connection, a call through a UCX
// endpoint. Invalidate and CompareAndInvalidate of a leased value remove it
// from the cache at once (the next Get creates another) and report true;
// Config.Release of the value then runs when its last lease ends, as it
// does for a value Close removes (Close does not wait for leases).
//
// On a hit, Acquire and the Lease's Release take no lock and allocate
// nothing, and write one cache line of the value's own (a lease is an
// atomic compare-and-swap to take and one to end), except that a value's
// first lease allocates its lease table (once per value) and more than
// eight leases of one value at a time allocate each.
func (c *Cache[K, V]) Acquire(ctx context.Context, key K) (Lease[K, V], error) {
	s, tk, ok := c.table.Lease(key)
	if ok { // a hit
		return Lease[K, V]{c: c, s: s, tk: tk}, nil
	}
	if tk.Valid() {
		c.endStale(s, tk) // an eviction took the value as the lease was taken
	}
	return c.acquire(ctx, key)
}

// endStale ends a lease taken as an eviction or an idle removal took its
// value out of the cache (shard.Table.InvalidateState): the lease is not
// handed out, and if the removal counted it, its end releases the value.
func (c *Cache[K, V]) endStale(s *shard.Slot[K, V], tk shard.Ticket) {
	if last, _ := s.EndLease(tk); last {
		c.releaseLast(s, true)
	}
	c.kick()
}

// leaseHeld leases s's value for an Acquire's slow path: ok is false if
// the value left the cache first, or as the lease was taken (then the
// caller looks again).
func (c *Cache[K, V]) leaseHeld(s *shard.Slot[K, V]) (l Lease[K, V], ok bool) {
	tk, ok := s.Lease()
	if !ok {
		return l, false
	}
	if !c.table.Holds(s) {
		c.endStale(s, tk)
		return l, false
	}
	return Lease[K, V]{c, s, tk}, true
}

// acquire is Acquire after a miss: it creates (or waits for) the value as
// Get does. A value this Acquire creates is leased before it is published;
// one it waited for may be invalidated before it is leased, and then this
// goes round again.
func (c *Cache[K, V]) acquire(ctx context.Context, key K) (Lease[K, V], error) {
	for {
		_, l, err := c.obtain(ctx, key, true)
		if err != nil || l.s != nil {
			return l, err
		}
		s, tk, ok := c.table.Lease(key)
		if ok {
			return Lease[K, V]{c: c, s: s, tk: tk}, nil
		}
		if tk.Valid() {
			c.endStale(s, tk)
		}
	}
}

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
		// The creation's claim becomes Ready with v; its Create's own
		// value is released when it returns (settle). Until then, the key
		// may not be created again, even if v is invalidated (Answered).
		s.Answered(f)
		stats.offers.Add(1)
		c.publish(s, st, f, v)
		f.Cancel(ErrOffered) // its value is no longer wanted: Create may stop
		return true, true
	}
	// Empty, a remembered failure, or Blocked (a creation an earlier Offer
	// answered still runs: v may be stored, no Create may start): claimed
	// like a creation, published at once.
	claim, f, claimed := s.ClaimResolved(st)
	if !claimed {
		// Another goroutine moved the slot first, or it holds a timed-out
		// creation still running, which nothing may overlap.
		if s.State() == st {
			return true, false
		}
		return false, false
	}
	if st.Status() == shard.Blocked {
		s.Answered(st.Flight()) // the block carries over to v's successor
	}
	stats.offers.Add(1)
	c.publish(s, claim, f, v)
	return true, true
}
