package epcache

import (
	"context"
	"fmt"

	"github.com/epcache/epcache/shard"
)

// Lease is a hold on a value of the cache, from [Cache.Acquire] to
// [Lease.Release]: until then the cache does not release the value, even
// once it has left the cache by any way: Invalidate, CompareAndInvalidate,
// an eviction (MaxEntries), an idle removal (IdleTimeout) or Close. A Lease
// is a small value: copy it freely, but release it exactly once. Its zero
// value holds nothing.
type Lease[K comparable, V any] struct {
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

// Release ends the lease. If the value has left the cache meanwhile
// (Invalidate, CompareAndInvalidate, eviction, idle removal, Close) and
// this was its last lease, Config.Release runs now, on the calling
// goroutine, before Release returns; a panic in it propagates, as from
// Invalidate. Releasing a lease (or a copy
// of one) already released, or a Lease that Acquire returned with an error,
// panics with a message that says so: it is a bug that would otherwise
// release an endpoint still in use or release one twice. Releasing the zero
// Lease panics with a nil dereference, as a method of a nil pointer does:
// the check that would name it is what keeps Release small enough to
// inline. A lease's Release takes no lock and allocates nothing, with two
// exceptions: the last lease of a value that has left the cache runs
// Config.Release, and, under MaxEntries, the end of a lease of a value an
// eviction found leased (a creation waits for room) evicts for that
// creation on the calling goroutine, which may lock the value's shard,
// call Config.Hash and allocate.
func (l Lease[K, V]) Release() {
	// The common case inlines into the caller: a lease of a value still
	// in the cache, which no eviction watches, ended by one
	// compare-and-swap.
	if !shard.TryEnd[uint64](l.tk) {
		l.release()
	}
}

// release is Release for every other lease, and for misuse.
func (l Lease[K, V]) release() {
	if l.s == nil {
		panic("epcache: Release of a Lease that Acquire returned with an error")
	}
	if shard.TryEndRecording(l.tk) {
		return // a lease of a value in the cache, whose ticket records its P
	}
	c := owner(l.s)
	last, watched, err := c.endLease(l.s, l.tk, false) // a last lease's Release: its room comes back
	if err != nil {
		panic(fmt.Sprintf("epcache: Lease of key %v released twice", l.s.Key()))
	}
	if watched && !last {
		// An eviction found the value leased: it may take it now. Only
		// a watched lease kicks: other leases end here too (an overflow
		// lease), and a kick for each would be work for nothing.
		c.kick()
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
// atomic compare-and-swap to take and one to end). The exceptions: a
// value's first lease allocates its lease table (128 bytes); a value whose
// leases keep coming from goroutines on different Ps grows lines of
// tickets, one group per P, so that the leases of each core write lines of
// its own and a hot peer's leases scale with cores (once per value: 1 KiB
// at GOMAXPROCS 2, 2 KiB at 3 and 4, 4 KiB at 5 to 8, 8 KiB at 9 and
// beyond); and a lease that finds every ticket held allocates its own. A
// goroutine is told apart from another by its identity, the same at any
// call depth and after it moves between Ps (on amd64 and arm64; elsewhere
// by where its stack is, so that one leasing from call depths far apart,
// or whose stack moved, may count as two); two whose identities hash alike
// (one pair in 256) count as one. A value leased from one P at a time
// never grows: one goroutine holding several leases of it at once, moving
// between Ps or not, or goroutines taking turns on one P, or each leasing
// it on the P where the last lease of it ended. Once a value's leases have
// come from two goroutines at GOMAXPROCS above 1, until it grows, the end
// of each of its leases also reads the P it runs on (a call beside the
// compare-and-swap).
func (c *Cache[K, V]) Acquire(ctx context.Context, key K) (l Lease[K, V], err error) {
	l.s, l.tk, err = c.table.Acquire(ctx, key) // a miss comes back to acquireSlow
	return l, err
}

// acquireSlow answers an Acquire that found no value to lease
// (shard.Table.SetLeaseMiss). With an error it returns shard.Unheld(), not
// the zero Ticket: the Lease that Acquire returns then is not the zero
// Lease, and its Release reaches release and says what went wrong,
// rather than dereferencing a nil ticket on the inlined fast path.
func (c *Cache[K, V]) acquireSlow(ctx context.Context, key K, stale *shard.Slot[K, V], tk shard.Ticket) (*shard.Slot[K, V], shard.Ticket, error) {
	if stale != nil {
		c.endStale(stale, tk) // an eviction took the value as the lease was taken
	}
	l, err := c.acquire(ctx, key)
	if err != nil {
		return nil, shard.Unheld(), err
	}
	return l.s, l.tk, nil
}

// endStale ends a lease taken as an eviction or an idle removal took its
// value out of the cache (shard.Table.InvalidateState): the lease is not
// handed out, and if the removal counted it, its end releases the value.
func (c *Cache[K, V]) endStale(s *shard.Slot[K, V], tk shard.Ticket) {
	c.endLease(s, tk, true)
	c.kick()
}

// leaseHeld leases s's value for an Acquire's slow path: ok is false if
// the value left the cache first, or as the lease was taken (then the
// caller looks again).
func (c *Cache[K, V]) leaseHeld(s *shard.Slot[K, V]) (l Lease[K, V], ok bool) {
	tk, ok := s.Lease(c)
	if !ok {
		return l, false
	}
	if !c.table.Holds(s) {
		c.endStale(s, tk)
		return l, false
	}
	return Lease[K, V]{s, tk}, true
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
			return Lease[K, V]{s: s, tk: tk}, nil
		}
		if tk.Valid() {
			c.endStale(s, tk)
		}
	}
}

// owner returns the cache of s, a slot whose value is leased: every call
// that may make a slot's lease table (a lease, a watch, a straggler's mark,
// eviction's handle) gives the cache as its owner, so a Lease need not
// carry it, and stays four words.
func owner[K comparable, V any](s *shard.Slot[K, V]) *Cache[K, V] {
	c, ok := s.Owner().(*Cache[K, V])
	if !ok {
		panic(fmt.Sprintf("epcache: the lease of key %v was not made by a Cache[K, V] of these types", s.Key()))
	}
	return c
}
