package epcache

import (
	"runtime"
	"slices"
	"unsafe"

	"github.com/epcache/epcache/shard"
)

// recentValues is how many of the values published last the room keeps
// in its ring, and recentWeighed how many of them, the oldest, an eviction
// weighs beside the hand's: a newcomer is weighed about recentWeighed
// times in its life (a publication moves the ring on by one, and an
// eviction comes with each), not once per eviction while it is among the
// recent, so an eviction's cost does not grow with the ring.
const (
	recentValues  = 16
	recentWeighed = 2
)

// freshBatch is how many handles wait in room.fresh before a publication
// puts them on the clock itself (if the hand is free; otherwise its holder
// does). With clock.compact, it bounds what the room keeps of values that
// have left the cache: handles, which no longer refer to them, at most
// twice the room taken plus two batches, however many values come and go.
const freshBatch = 64

// track makes s's value, about to be published, known to eviction: on the
// clock, and among the recent. The room holds a handle of s (shard.Track),
// not s: a slot holds its value for its whole life, and a value that left
// the cache by any way (Invalidate, an idle removal, an eviction) must not
// stay reachable from the room until the hand comes round to it, which,
// while the cache is not full, it never does.
//
// now is the time of the publication (shard.Nanotime). It does not wait
// for the hand, which an eviction may hold for a while.
func (r *room[K, V]) track(s *shard.Slot[K, V], c *Cache[K, V], now int64) {
	h := s.Track(c, now)
	r.recent[r.next.Add(1)%recentValues].Store(h)
	r.freshMu.Lock()
	r.fresh = append(r.fresh, h)
	n := len(r.fresh)
	r.freshMu.Unlock()
	if n >= freshBatch && r.handMu.TryLock() {
		r.joinFresh()
		r.handMu.Unlock()
	}
}

// joinFresh puts the values published since the clock last took them in on
// the clock, and compacts the clock. The caller holds handMu.
func (r *room[K, V]) joinFresh() {
	r.freshMu.Lock()
	for _, h := range r.fresh {
		if h.Slot() != nil { // not gone already
			r.hand.slots = append(r.hand.slots, h)
		}
	}
	clear(r.fresh)
	r.fresh = r.fresh[:0]
	r.freshMu.Unlock()
	r.hand.compact(r.used.Load())
}

// clock is the face of eviction's CLOCK: the handles of the values
// published under MaxEntries, which the hand walks round and round. It
// holds the values only, not the table's every slot: a table that has seen
// many more keys than it holds values (every eviction leaves an empty slot
// behind, until its shard is rebuilt) would make a hand over the table
// walk many empty slots for each value. A handle whose value has left the
// cache is dropped when the hand meets it, or by compact. Guarded by
// room.handMu.
type clock[K comparable, V any] struct {
	slots []*shard.Handle[K, V]
	pos   int
	laps  int // times the hand came back to the start
}

// next returns the slot under the hand and moves on, or nil when the
// clock is empty.
func (h *clock[K, V]) next() *shard.Slot[K, V] {
	for len(h.slots) > 0 {
		if h.pos >= len(h.slots) {
			h.pos = 0
			h.laps++
		}
		s := h.slots[h.pos].Slot()
		if s == nil {
			// Gone for good (a slot holds one value in its life): drop it.
			last := len(h.slots) - 1
			h.slots[h.pos], h.slots[last] = h.slots[last], nil
			h.slots = h.slots[:last]
			continue
		}
		h.pos++
		return s
	}
	return nil
}

// compact drops the handles of values that have left the cache once they
// may be more than half the clock: live is the room taken, which no fewer
// handles than values on the clock can be. It keeps the order of the rest
// and the hand's place among them. Its walk is paid for by the handles
// added since the last one, at least as many as it drops.
func (h *clock[K, V]) compact(live int64) {
	if int64(len(h.slots)) <= 2*live+freshBatch {
		return
	}
	kept, pos := h.slots[:0], 0
	for i, hd := range h.slots {
		if hd.Slot() == nil {
			continue
		}
		if i < h.pos {
			pos++
		}
		kept = append(kept, hd)
	}
	clear(h.slots[len(kept):])
	h.slots, h.pos = kept, pos
}

// candidate is a value the clock hand found unused and unleased.
type candidate[K comparable, V any] struct {
	s      *shard.Slot[K, V]
	st     *shard.State[V]
	freq   int
	recent bool // one of the values published last, not the hand's
	forced bool // in use, taken all the same (evictOne): its state is loaded afresh
	leased bool // found leased by evictPick: passed over, watched if none can go
}

// evictionSample is how many unused values evictOne compares by frequency
// before it evicts the least asked for.
const evictionSample = 8

// evicted is a value an eviction took out of the cache, its Release not
// yet begun: its stripe's gate is held, and it counts in room.evicting.
type evicted[K comparable, V any] struct {
	p   *stripe
	key K
	v   V
}

// evictForSelf evicts a value for a creation that is not in line, if it
// can take the hand at once, and returns it (ok) for the caller to release
// and take the room of; it evicts for the line too, as kick does. The value
// does not count as on its way (evicting) once returned: a creation that
// queued meanwhile, and found the line not short of room because it did,
// is kicked for.
func (c *Cache[K, V]) evictForSelf() (mine evicted[K, V], ok bool) {
	r := c.room
	if !r.handMu.TryLock() {
		return mine, false
	}
	seen := r.kicks.Load()
	// The hand comes with room.evicted empty, so what is in it after the
	// first eviction is this one's value, unless a lease caught the value
	// as it left (remove: it lingers, and the lease's end releases it).
	took, _ := c.evictOne()
	took = took && len(r.evicted) > 0
	c.evictWhileShort()
	mine, ok = c.drainEvicted(took)
	r.handMu.Unlock()
	if ok {
		r.recall()
	}
	if r.kicks.Load() != seen || r.short() {
		c.kick()
	}
	return mine, ok
}

// kick evicts a value if more creations wait for room than evictions are
// on their way to them: when a creation joins the line, and after anything
// that may have made a value evictable (a value published, a lease of a
// value an eviction watched ended). An eviction's unit goes to the first in
// line, whoever asked for it, so a waiter that finds enough evictions on
// their way is served by one of them: a kick evicts no more values than
// there are waiters to take their room, and most lease ends and
// publications, finding no one short, write nothing.
//
// Evictions are combined: a kick that finds another evicting leaves the
// work to it (TryLock, never a wait for the hand), and the evictor goes on
// while evictions are short, and looks again after it lets go of the hand
// if any kick came meanwhile, so that no kick is lost.
func (c *Cache[K, V]) kick() {
	if e, ok := c.kickAndTake(); ok {
		go c.releaseEvicted(e, false)
	}
}

// kickAndTake is kick, which hands the caller one of the values it evicted
// to release (ok), and releases the others on goroutines of their own.
func (c *Cache[K, V]) kickAndTake() (first evicted[K, V], ok bool) {
	r := c.room
	if r == nil || !r.short() {
		return first, false // (and no write: most lease ends and publications find no one short)
	}
	r.kicks.Add(1) // before TryLock: an evictor that lets go after this sees it
	for r.short() && r.handMu.TryLock() {
		seen := r.kicks.Load()
		c.evictWhileShort()
		if e, took := c.drainEvicted(!ok); took {
			first, ok = e, true
		}
		r.handMu.Unlock()
		if r.kicks.Load() == seen {
			break // no kick since this one looked: whatever it missed, a later one will not
		}
	}
	return first, ok
}

// drainEvicted empties room.evicted, keeping its array: with take, the
// first value is returned (ok) for the caller to release, and the others
// are released on goroutines of their own. The caller holds room.handMu.
func (c *Cache[K, V]) drainEvicted(take bool) (first evicted[K, V], ok bool) {
	r := c.room
	for _, e := range r.evicted {
		if take && !ok {
			first, ok = e, true
			continue
		}
		go c.releaseEvicted(e, false)
	}
	clear(r.evicted)
	r.evicted = r.evicted[:0]
	return first, ok
}

// releaseEvicted releases a value an eviction took: the unit comes back
// when Release returns (or panics), to the first in line, and stops being
// on its way then (putEvicted); with keepRoom, it goes to the caller,
// which took it off its way already (leaveTakingOver, evictForSelf). So a
// Release that does not return keeps one unit from the line: the waiter
// it would reach waits for it, or for a later eviction, or leaves on its
// context.
func (c *Cache[K, V]) releaseEvicted(e evicted[K, V], keepRoom bool) {
	defer e.p.gate.exit()
	if !keepRoom {
		defer c.room.putEvicted()
	}
	c.releaseQuietlyKeeping(e.p, e.key, e.v, true)
}

// short reports whether more creations wait for room than evictions are on
// their way to them.
func (r *room[K, V]) short() bool {
	waiting, evicting := lineCounts(r.line.Load())
	return waiting > evicting
}

// evictOne evicts one unleased value, one not used since the hand last
// passed it and, of those, the least asked for, and reports whether it
// found one. The clock hand
// cools young values and collects up to evictionSample unused, unleased
// ones; of those, the one the frequency sketch says was asked for least
// goes: a peer asked for once makes room before one that comes back
// (the hit ratio of each policy is what epbench -workload hotset reports
// beside otter's). The value goes to room.evicted, for drainEvicted (the
// Get whose kick evicted it releases it itself, or a goroutine of its own
// does); its unit comes back when Release returns. Leases are asked of the
// candidate about to go, not of every value weighed (evictPick): one found
// leased is marked watched, so that the end of its lease calls kick, and
// the next is tried.
//
// A candidate used or leased before it could be removed is passed over,
// and the hand goes on: the walk ends when it evicts, or after a whole lap
// that met no unleased value (every value leased or being created: the end
// of a lease or a creation kicks the waiters), or after maxLaps laps, which
// it reports as gaveUp: unleased values were met, but uses kept saving
// them, and a use kicks nobody.
//
// The caller holds room.handMu.
func (c *Cache[K, V]) evictOne() (ok, gaveUp bool) {
	c.slowdemo() // nothing, but in the epcache_slowdemo build (slowdemo.go)
	const maxLaps = 8
	r := c.room
	picks := r.picks[:0]
	defer func() { clear(picks[:cap(picks)]); r.picks = picks[:0] }()
	r.joinFresh()
	start, lap, unleased := r.hand.laps, r.hand.laps, false
	for r.hand.laps-start < maxLaps {
		if r.hand.laps != lap { // a lap ended: a slot is met once a lap
			if len(picks) > 0 {
				ok, free := c.evictPick(picks)
				if ok {
					return true, false
				}
				unleased = unleased || free
			}
			picks = picks[:0]
			if !unleased && r.hand.laps-start > 1 {
				return false, false
			}
			lap, unleased = r.hand.laps, false
		}
		s := r.hand.next()
		if s == nil || c.table.Closed() {
			return false, false
		}
		st := s.State()
		used := !c.table.Cool(s, st) // a young value, cooled now: not a candidate yet
		if !c.table.Holds(s) {
			continue // not a value
		}
		forced := false
		if used && r.hand.laps-start >= 2 {
			// Two laps met no value unused since the lap before: every
			// unleased value is in use all the time. One of them goes
			// all the same, or a waiter would wait for as long as the
			// others keep using theirs: with its state loaded again
			// as it is removed, young or not, for a use of a cooled
			// value (Touch) between Cool and the removal saved it
			// every time when uses came that often, and a use does not
			// kick.
			used, forced = false, true
		}
		if used {
			// Not a candidate, leased or not: its lease is looked at
			// when the hand comes round again and finds it unused, or
			// two laps from now (forced), so a lap that ends the walk
			// (every value leased) has looked at every value's, and
			// watched those it found leased.
			unleased = true
			continue
		}
		// A candidate, leased or not: evictPick asks its lease table
		// only if it is the one to go, so that an eviction reads one
		// lease table, not one per value it weighs, and it watches a
		// leased one then. Every candidate of a lap is asked before
		// the lap ends (evictPick, at the latest when the lap does).
		picks = append(picks, candidate[K, V]{s, st, r.freq.estimate(c.table.Hash(s.Key())), false, forced, false})
		if len(picks) < evictionSample {
			continue
		}
		ok, free := c.evictPick(picks)
		if ok {
			return true, false
		}
		unleased = unleased || free
		picks = picks[:0] // every one was used or leased meanwhile: go on
	}
	if len(picks) > 0 {
		if ok, _ := c.evictPick(picks); ok {
			return true, false
		}
	}
	return false, true
}

// evictWhileShort evicts while more creations wait for room than
// evictions are on their way to them, and something can be evicted. An
// eviction that gave up on values in use all the time (evictOne) is tried
// again a few times, letting their users run first: no use will kick.
//
// The caller holds room.handMu.
func (c *Cache[K, V]) evictWhileShort() {
	r := c.room
	for again := 0; r.short(); {
		ok, gaveUp := c.evictOne()
		if ok {
			continue
		}
		if !gaveUp || again == 16 {
			return
		}
		again++
		runtime.Gosched()
	}
}

// evictPick evicts the candidate asked for least that is still unused and
// unleased, and reports whether there was one (ok). It asks a candidate's
// lease table only when it is the one to go; one that is leased is passed
// over for the next, and watched only if no candidate could go, so that
// its last lease's end kicks then: a watch writes every ticket of the
// value and sends the end of its lease to the slow path, which buys
// nothing when another candidate makes the room. free reports whether it
// met a candidate that was not leased (but used meanwhile), for
// evictOne's end of a walk that met no unleased value.
func (c *Cache[K, V]) evictPick(picks []candidate[K, V]) (ok, free bool) {
	r := c.room
	n := r.next.Load()
	for i := range uint64(recentWeighed) {
		hd := r.recent[(n+1+i)%recentValues].Load()
		if hd == nil {
			continue
		}
		s := hd.Slot()
		if s == nil {
			continue
		}
		if st := s.State(); c.table.Holds(s) && !c.table.Young(st) {
			picks = append(picks, candidate[K, V]{s, st, r.freq.estimate(c.table.Hash(s.Key())), true, false, false})
		}
	}
	for {
		// The least asked for first, then the next: usually the first
		// will do. Of those asked for as often, a newcomer goes before
		// the hand's (as TinyLFU admits a newcomer only if it was asked
		// for more often than the value it would replace), else the
		// hand's oldest. One found leased stays in picks, passed over.
		i := -1
		for j := range picks {
			if picks[j].leased {
				continue
			}
			if i < 0 || picks[j].freq < picks[i].freq || picks[j].freq == picks[i].freq && picks[j].recent && !picks[i].recent {
				i = j
			}
		}
		if i < 0 {
			break
		}
		p := &picks[i]
		if p.s.LeaseHeld() {
			p.leased = true
			continue
		}
		if c.tryEvict(p) {
			return true, true
		}
		free = c.watchUnlessFree(p) || free
		picks = slices.Delete(picks, i, i+1)
	}
	// None could go: every leased one is watched now, so that the end of
	// its last lease (on the slow path) kicks; one whose last lease ended
	// before its watch is free, and goes.
	for i := range picks {
		p := &picks[i]
		if p.s.Watch(c); p.s.LeaseHeld() {
			continue // its last lease ends on the slow path, which kicks
		}
		if c.tryEvict(p) {
			return true, true
		}
		free = c.watchUnlessFree(p) || free
	}
	return false, free
}

// watchUnlessFree is evictPick's step after p could not be removed: used
// meanwhile, or leased as it was being removed. A leased p is watched, so
// that its lease's end kicks; it reports whether p is free (not leased),
// which it is also when that end came before the watch.
func (c *Cache[K, V]) watchUnlessFree(p *candidate[K, V]) bool {
	if !p.s.LeaseHeld() {
		return true
	}
	p.s.Watch(c)
	return !p.s.LeaseHeld()
}

// tryEvict removes the candidate p for an eviction (remove), unless it was
// used or leased meanwhile; a forced candidate's state is loaded afresh.
func (c *Cache[K, V]) tryEvict(p *candidate[K, V]) bool {
	if p.forced {
		p.st = p.s.State()
	}
	return c.remove(p.s, p.st, true, func(p *stripe) { p.evictions.Add(1) })
}

// remove takes s's value, found in state st, out of the cache for an
// eviction (evicting: its caller holds the hand) or an idle removal, unless
// s changed meanwhile (a use) or a lease holds the value
// (shard.Table.InvalidateState). An idle removal's value is released on a
// goroutine of its own, which the gate lets Close wait for, so that a
// Release that panics or calls runtime.Goexit (reported by Close) costs no
// caller anything; an eviction's is left in room.evicted for drainEvicted.
func (c *Cache[K, V]) remove(s *shard.Slot[K, V], st *shard.State[V], evicting bool, count func(*stripe)) bool {
	p := c.stats.of(unsafe.Pointer(s))
	if !p.gate.enter() {
		return false
	}
	v, ok := c.table.InvalidateState(s, st)
	if !ok {
		p.gate.exit()
		if !evicting && c.room != nil && c.room.short() {
			// An idle removal that a lease stopped held the value in a
			// state in which a walking hand passes it over, neither a
			// candidate nor watched: tell a waiter for room of it now, or
			// by the lease's end.
			if s.LeaseHeld() {
				s.Watch(c)
			}
			c.kick()
		}
		return false
	}
	p.ready.Add(-1)
	count(p)
	if testHookRemoved != nil {
		testHookRemoved(s)
	}
	if c.room != nil {
		// Its room is on its way to the first in line from now: also
		// if a lease caught the value as it left (Abandon reports it
		// held), whose taker ends it at once (Table.Holds), and the
		// end releases it. Counted and noted before Abandon, which
		// that end may follow at once: the note tells releaseLast that
		// the unit arrives when that Release returns. Counted as on its
		// way, the value keeps the evictor from evicting a second one
		// for the same waiter.
		s.Note(c)
		c.room.setOut()
	}
	if !s.Abandon() {
		c.linger(p, s)
		p.gate.exit()
		return true
	}
	if c.room == nil { // an idle removal
		go func() {
			defer p.gate.exit()
			c.releaseQuietly(p, s.Key(), v)
		}()
		return true
	}
	e := evicted[K, V]{p, s.Key(), v}
	if evicting {
		c.room.evicted = append(c.room.evicted, e) // for drainEvicted
	} else {
		go c.releaseEvicted(e, false)
	}
	return true
}

// testHookRemoved, set only by tests, runs in remove right after a value
// has left the table, before its leases are counted, with its slot.
var testHookRemoved func(s any)
