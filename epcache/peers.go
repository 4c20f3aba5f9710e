package epcache

import (
	"iter"
	"time"

	"github.com/epcache/epcache/shard"
)

// PeerState is the state of one key of a cache, as [Cache.Peers] reports
// it.
type PeerState uint8

const (
	PeerReady      PeerState = iota // a value is held
	PeerCreating                    // a creation is in flight
	PeerFailed                      // a failure is remembered (ErrorTTL), or a timed-out creation still runs
	PeerStraggling                  // a creation an Offer answered still runs: the key's next creation waits for it
	PeerLingering                   // a value given up (Invalidate, eviction, Close) that leases still hold
)

var peerStateNames = [...]string{"ready", "creating", "failed", "straggling", "lingering"}

// String returns the state's name: ready, creating, failed, straggling,
// lingering.
func (s PeerState) String() string {
	if int(s) < len(peerStateNames) {
		return peerStateNames[s]
	}
	return "invalid"
}

// Peer describes one key of a cache, as [Cache.Peers] reports it: what an
// operator asks of a peer that does not connect.
type Peer[K comparable] struct {
	Key   K
	State PeerState
	// Since is when the state began: for a creation, when it was claimed
	// (a wait for room included); for a remembered failure, when it
	// failed, and for a timed-out creation still running, when it was
	// claimed; for a lingering value, when it was given up; for a ready
	// value, when it was published, with MaxEntries set (otherwise the
	// cache does not keep it, and Since is zero).
	Since time.Time
	// Idle is, for a ready value with IdleTimeout set, how long it has been
	// unused at least, in steps of IdleTimeout/4; 0 otherwise.
	Idle    time.Duration
	Leases  int       // leases held now (ready and lingering values)
	Waiting int       // callers waiting for the creation now (creating)
	Err     error     // the error answered (failed)
	Until   time.Time // when the failure is forgotten; zero while a timed-out creation still runs (failed)
}

// Peers yields every key the cache holds something for: a value, a
// creation, a failure or a straggler, and the values given up that leases
// still hold. It is weakly consistent, as All is: it walks the table
// without a lock and sees each key once, but may miss changes made while
// it walks. It blocks neither hits nor creations, and costs O(keys the
// table holds) per walk. Once Close has begun it yields only lingering
// values. It is meant for a debug page and for tests, not for a hot path:
// it allocates a little per peer.
func (c *Cache[K, V]) Peers() iter.Seq[Peer[K]] {
	return func(yield func(Peer[K]) bool) {
		for s := range c.table.All() {
			if c.table.Closed() {
				break
			}
			if p, ok := c.describe(s); ok && !yield(p) {
				return
			}
		}
		c.lingerers.Range(func(k, since any) bool {
			at, ok := since.(time.Time)
			if !ok {
				return true // released
			}
			s := k.(*shard.Slot[K, V])
			return yield(Peer[K]{Key: s.Key(), State: PeerLingering, Since: at, Leases: s.Leased()})
		})
	}
}

// Peer reports what the cache holds for key, as Peers would yield it: a
// value, a creation, a failure or a straggler; ok is false if it holds
// none of those. A value given up that leases still hold (lingering) is
// not key's any more, and Peer does not report it: Peers does. Peer takes
// no lock and costs a lookup: it is the one-key Peers, for a caller that
// must know whether a key has a creation in flight or a failure
// remembered, which Load does not say. After Close it reports nothing.
func (c *Cache[K, V]) Peer(key K) (p Peer[K], ok bool) {
	s := c.table.Lookup(key)
	if s == nil || c.table.Closed() {
		return p, false
	}
	return c.describe(s)
}

// describe returns what Peers reports of s, and false for a slot that
// holds nothing.
func (c *Cache[K, V]) describe(s *shard.Slot[K, V]) (p Peer[K], ok bool) {
	st := s.State()
	p.Key = s.Key()
	switch st.Status() {
	case shard.Ready:
		p.State, p.Since, p.Leases = PeerReady, s.Published(), s.Leased()
		if c.sweep != nil {
			p.Idle = time.Duration(st.IdleSweeps()) * c.sweep.every
		}
	case shard.Creating:
		f := st.Flight()
		p.State, p.Since, p.Waiting = PeerCreating, f.Started(), f.Waiters()
	case shard.Failed:
		f := st.Flight()
		if !f.Finished() {
			return p, false // being settled
		}
		_, err := f.Result()
		if err == errNoRoomClaimer {
			return p, false // about to be Empty
		}
		p.State, p.Since, p.Err, p.Until = PeerFailed, f.Started(), err, f.Until()
		if !p.Until.IsZero() && !time.Now().Before(p.Until) {
			return p, false // expired: holds nothing
		}
	case shard.Straggling:
		f := st.Flight()
		if f.Finished() {
			return p, false // its straggler has returned: Empty in all but name
		}
		p.State, p.Since = PeerStraggling, f.Started()
	default:
		return p, false
	}
	return p, true
}

// linger records that s's value, given up, waits for its last lease, which
// may have ended already: linger and unlinger are called once each for a
// lingering value, in either order, and whichever comes second removes the
// entry the first made (LoadOrStore arbitrates).
func (c *Cache[K, V]) linger(st *stripe, s *shard.Slot[K, V]) {
	st.lingering.Add(1)
	if _, loaded := c.lingerers.LoadOrStore(s, time.Now()); loaded {
		c.lingerers.Delete(s) // released already
	}
}

// unlinger records that s's lingering value has been released.
func (c *Cache[K, V]) unlinger(s *shard.Slot[K, V]) {
	if _, loaded := c.lingerers.LoadOrStore(s, released{}); loaded {
		c.lingerers.Delete(s)
	}
}

// released is what unlinger leaves for a value whose linger has not come
// yet.
type released struct{}
