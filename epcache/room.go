package epcache

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/epcache/epcache/shard"
)

// room is the bound of Config.MaxEntries: a count of units, one taken by
// each creation before its Create starts (or by an Offer) and given back
// when its value's Release returns, or when the creation ends without a
// value. Waiters are served in the order they came, a unit given back
// handed straight to the first of them, so that a newcomer never takes a
// unit freed for somebody who waited; the exception is the unit of a value
// a waiter's own kick evicted, which that waiter takes over after running
// its Release (takeRoom): every waiter kicks for itself, and one whose
// kick found nothing to evict waits for the first unit given back.
//
// Only creations, releases and Offers touch it: a hit never does.
type room[K comparable, V any] struct {
	// Set by newRoom, read only.
	max  int64
	freq *sketch // how often keys reach the slow path (sketch.go)
	_    [linePair]byte

	// Written by every creation, release and kick.
	used atomic.Int64 // units taken; written under mu
	// line holds two counts in one word (see lineCounts), so that short
	// reads both at one instant: the waiters in the queue (len(queue)),
	// and the units on their way to the line, those of evicted values
	// whose Release has not returned. A unit stops being on its way in
	// the step that hands it to the first in line (putEvicted), so that
	// no moment shows the line short of a unit that is about to reach
	// it: were the two counts changed one after the other, or the unit
	// taken off its way before its Release returns, a kick in between
	// would evict a second value for one waiter.
	line  atomic.Int64
	kicks atomic.Uint64 // calls of kick, so that an evictor sees one that found it evicting
	mu    sync.Mutex
	queue []*roomWaiter // in arrival order
	_     [linePair]byte

	// The evictor's, under handMu: no other goroutine writes these lines
	// while it walks. (A kicker's TryLock reads handMu's word, on the line
	// of the hand's first fields, so the evictor's next write there
	// fetches that line back; the counters every creation writes no
	// longer share it.)
	handMu  sync.Mutex
	hand    clock[K, V]       // the clock hand of eviction; guarded by handMu
	picks   []candidate[K, V] // evictOne's candidates; guarded by handMu
	evicted []evicted[K, V]   // values evictOne took, for drainEvicted; guarded by handMu
	_       [linePair]byte

	// Written by every publish. The room holds handles of values, never
	// slots (see track).
	freshMu sync.Mutex
	fresh   []*shard.Handle[K, V] // published, not yet on the clock; guarded by freshMu
	// recent are the values published last, which every eviction weighs
	// beside the hand's: a value asked for once (the tail of a Zipf
	// distribution) goes before the hand comes round to it, as W-TinyLFU's
	// admission window lets a newcomer go first.
	recent [recentValues]atomic.Pointer[shard.Handle[K, V]]
	next   atomic.Uint64
}

// Steps of room.line: a waiter joining or leaving the queue, a unit setting
// out or arriving.
const (
	oneWaiter   = 1 << 32
	oneEvicting = 1
)

// lineCounts splits room.line into its two counts.
func lineCounts(line int64) (waiting, evicting int64) {
	return line >> 32, line & (oneWaiter - 1)
}

// evicting returns how many units of evicted values are on their way to
// the line now.
func (r *room[K, V]) evicting() int64 {
	_, e := lineCounts(r.line.Load())
	return e
}

// setOut counts a unit on its way to the line: an evicted value's, until
// its Release returns (putEvicted).
func (r *room[K, V]) setOut() { r.line.Add(oneEvicting) }

// recall takes a unit off its way: its evictor took it over (evictForSelf).
func (r *room[K, V]) recall() { r.line.Add(-oneEvicting) }

// linePair separates the room's groups of fields by who writes them, so
// that the evictor's walk, the counters every creation writes and the
// handles every publication records are on lines of their own. 128 bytes,
// not 64, for the reason shard's shardPadded gives.
const linePair = 128

type roomWaiter struct {
	granted chan struct{} // closed when a unit is handed to it; guarded by room.mu
	served  bool          // guarded by room.mu
}

func newRoom[K comparable, V any](max int) *room[K, V] {
	return &room[K, V]{
		max:  int64(max),
		freq: newSketch(max),
		// Room for the recent values evictPick weighs too: it appends them
		// (and evictOne clears no more than it used).
		picks: make([]candidate[K, V], 0, evictionSample+recentWeighed),
	}
}

// tryTake takes a unit if one is free and nobody waits for one.
func (r *room[K, V]) tryTake() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.takeLocked()
}

func (r *room[K, V]) takeLocked() bool {
	if len(r.queue) == 0 && r.used.Load() < r.max {
		r.used.Add(1)
		return true
	}
	return false
}

// put gives a unit back: to the first waiter, if any.
func (r *room[K, V]) put() { r.give(0) }

// putEvicted is put for the unit of an evicted value whose Release has
// returned: it arrives, and stops being on its way, in one step.
func (r *room[K, V]) putEvicted() { r.give(oneEvicting) }

// give gives a unit back, and takes arrived (0 or oneEvicting) off line.
func (r *room[K, V]) give(arrived int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queue) > 0 {
		w := r.queue[0]
		r.queue[0] = nil
		r.queue = r.queue[1:]
		r.line.Add(-oneWaiter - arrived)
		w.served = true
		close(w.granted)
		return
	}
	if arrived != 0 {
		r.line.Add(-arrived)
	}
	r.used.Add(-1)
}

// takeOrEnqueue takes a unit if one is free and nobody waits (nil), or
// else adds a waiter at the end of the line, in one step: a unit given back
// in between would otherwise reach nobody.
func (r *room[K, V]) takeOrEnqueue() *roomWaiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.takeLocked() {
		return nil
	}
	w := &roomWaiter{granted: make(chan struct{})}
	r.queue = append(r.queue, w)
	r.line.Add(oneWaiter)
	return w
}

// leave takes w out of the line; if a unit was handed to it meanwhile, the
// unit goes on to the next waiter.
func (r *room[K, V]) leave(w *roomWaiter) {
	r.mu.Lock()
	if !w.served {
		for i, q := range r.queue {
			if q == w {
				r.queue = append(r.queue[:i], r.queue[i+1:]...)
				r.line.Add(-oneWaiter)
				break
			}
		}
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	r.put()
}

// leaveTakingOver takes w out of the line and reports true, unless a unit
// was handed to it already (false: the unit is w's). w is leaving to take
// over the unit of a value its kick evicted (on its way): the value stops
// counting as on its way and w as waiting in one step, so that a kick
// never sees the line short of room in between, nor the other way round.
func (r *room[K, V]) leaveTakingOver(w *roomWaiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.served {
		return false
	}
	r.queue = slices.DeleteFunc(r.queue, func(q *roomWaiter) bool { return q == w })
	r.line.Add(-oneWaiter - oneEvicting)
	return true
}

// errNoRoomClaimer is the outcome a claimer gives the waiters of its claim
// when it leaves while waiting for room: the slot is Empty again, and each
// of them goes round again (one claims it, and waits for room itself).
var errNoRoomClaimer = fmt.Errorf("epcache: the claimer left while waiting for room")

// takeRoom is a claimer's wait for room before its Create starts: a unit at
// once if one is free, else a place in line, and an eviction for it. It
// ends when a unit is handed over (nil), when f is answered meanwhile (an
// Offer: nil too, and f's Done is closed, with no unit taken), or with the
// caller's context or Close (an error). The claimer holds s's gate.
//
// A claimer that finds the cache full and nobody in line evicts a value
// for itself, if it can take the clock hand at once, and does not queue
// (evictForSelf); otherwise it queues and kicks. A waiter whose kick
// evicted a value leaves the line, and either way the claimer takes that
// value's unit over when its Release returns: on the claimer's goroutine
// if its context never ends (takeOverInline), else on a goroutine of its
// own, so that the claimer may leave on its context meanwhile
// (takeOverAside), the rule that places Create. Out of the line, it is
// handed no unit while Release runs, so a Release that calls Get for a key
// that needs room waits for one like anybody else's Get, not for its own
// caller. A panic in Release is recovered and reported by Close.
func (c *Cache[K, V]) takeRoom(ctx context.Context, s *shard.Slot[K, V], claim *shard.State[V], f *shard.Flight[V], lease bool) (took bool, err error) {
	r := c.room
	var w *roomWaiter
	e, ok := evicted[K, V]{}, false
	if r.line.Load() == 0 && r.used.Load() >= r.max {
		// Full, nobody waits, and no evicted value's unit is on its
		// way (to nobody: it will be free): evict for this creation,
		// without a place in line (a waiter, its channel, and the
		// line's lock twice). Read without the lock, the two are a
		// hint: at worst a unit given back meanwhile stays free for
		// the next comer.
		e, ok = c.evictForSelf()
	}
	if !ok {
		if w = r.takeOrEnqueue(); w == nil {
			return true, nil
		}
	}
	c.stats.of(unsafe.Pointer(s)).roomWaits.Add(1)
	// Timed from the claim, which made f just before: a creation that
	// finds room at once reads no clock.
	defer func() { c.latency.room.record(time.Duration(shard.Nanotime() - f.StartedNanos())) }()
	if !ok {
		e, ok = c.kickAndTake()
		if ok && !r.leaveTakingOver(w) {
			// A unit reached w meanwhile: it is w's, and e's goes to
			// the line.
			go c.releaseEvicted(e, false)
			return true, nil
		}
	}
	if ok {
		if ctx.Done() == nil {
			return c.takeOverInline(ctx, s, claim, f, lease, e)
		}
		return c.takeOverAside(ctx, s, f, e)
	}
	select {
	case <-w.granted:
		return true, nil
	case <-f.Done():
		r.leave(w)
		return false, nil
	case <-ctx.Done():
		r.leave(w)
		why := "every value is leased or being created"
		if r.evicting() > 0 {
			why = "the values evicted for the creations in line were still being released"
		}
		return false, c.noRoomError(s, ctx, why)
	case <-c.closing:
		r.leave(w)
		return false, ErrClosed
	}
}

// takeOverInline releases e, which the claimer evicted for itself, on the
// claimer's goroutine, and takes its unit over: the claimer's context never
// ends, so it would wait for that Release anyway, and running it here
// spares a goroutine and two trips through the scheduler per eviction. A
// runtime.Goexit in Release ends the claimer's goroutine, which gives the
// unit back and its claim up on the way, as a claimer that left would.
func (c *Cache[K, V]) takeOverInline(ctx context.Context, s *shard.Slot[K, V], claim *shard.State[V], f *shard.Flight[V], lease bool, e evicted[K, V]) (took bool, err error) {
	returned := false
	defer func() {
		if !returned { // runtime.Goexit in Release
			c.room.put()
			c.noRoom(ctx, s, claim, f, lease, ErrGoexit)
		}
	}()
	c.releaseEvicted(e, true)
	returned = true
	return c.tookOver(ctx, s, f)
}

// takeOverAside is takeOverInline for a claimer whose context may end:
// e's Release runs on a goroutine of its own, and the claimer waits for it,
// for its context, for Close or for an Offer that answers its claim,
// whichever comes first, as it would in line. If it leaves first, e's
// unit is on its way to the line again, as any evicted value's is, until
// Release returns: a creation that comes meanwhile waits for it in line
// rather than evicting a second value.
func (c *Cache[K, V]) takeOverAside(ctx context.Context, s *shard.Slot[K, V], f *shard.Flight[V], e evicted[K, V]) (took bool, err error) {
	r := c.room
	var settled atomic.Bool // set by the first of the Release's return and the claimer's leaving
	released := make(chan struct{})
	go func() {
		defer func() { // also after a runtime.Goexit in Release
			if !settled.CompareAndSwap(false, true) {
				r.putEvicted() // the claimer has left: the unit arrives to the first in line
			}
			close(released)
		}()
		c.releaseEvicted(e, true)
	}()
	select {
	case <-released:
		return c.tookOver(ctx, s, f)
	case <-f.Done():
	case <-ctx.Done():
		err = c.noRoomError(s, ctx, fmt.Sprintf("the Release of key %v, evicted for it, had not returned", e.key))
	case <-c.closing:
		err = ErrClosed
	}
	r.setOut() // before the claimer lets go: the line never sees the unit lost
	if !settled.CompareAndSwap(false, true) {
		<-released // it has returned just now: the unit is the claimer's, which leaves
		r.recall()
		r.put()
	}
	return false, err
}

// tookOver is the end of a claimer's wait once the unit of a value it
// evicted is its: the unit is its to keep, unless the wait ended meanwhile
// as it would have in line (an Offer answered the claim, whose value is
// the claimer's at once and no Create starts; the context; Close).
func (c *Cache[K, V]) tookOver(ctx context.Context, s *shard.Slot[K, V], f *shard.Flight[V]) (took bool, err error) {
	// Looked at one by one: f.Done() would make a channel for a check.
	if f.Finished() {
		c.room.put()
		return false, nil
	}
	select {
	case <-ctx.Done():
		c.room.put()
		return false, c.noRoomError(s, ctx, "the wait ended as the value evicted for it was released")
	default:
	}
	select {
	case <-c.closing:
		c.room.put()
		return false, ErrClosed
	default:
	}
	return true, nil
}

// noRoomError counts a wait for room that ctx ended, and says why.
func (c *Cache[K, V]) noRoomError(s *shard.Slot[K, V], ctx context.Context, why string) error {
	c.stats.of(unsafe.Pointer(s)).cancels.Add(1)
	return fmt.Errorf("epcache: no room for key %v within MaxEntries %d: %s (waiting for room: %w)", s.Key(), c.room.max, why, ctx.Err())
}
