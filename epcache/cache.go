package epcache

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"github.com/epcache/epcache/shard"
)

// Cache holds at most one value per key, created on first use by exactly one
// Create, and releases every value it created exactly once. Its methods are
// safe for concurrent use. Make one with [New].
//
// A Create that returned v with a nil error synchronizes before every Get or
// Load that returns v, and before the Release of v.
type Cache[K comparable, V any] struct {
	table   *shard.Table[K, V] // closing it is Close's first step: hits end there
	stats   stripes            // counters, and the gates of creations and invalidations
	closing chan struct{}      // closed by Close: wakes waiting Gets

	create  func(context.Context, K) (V, error)
	release func(K, V)
	retry   func(int, error) (time.Duration, bool)
	timeout time.Duration
	ttl     time.Duration

	room  *room[K, V] // MaxEntries; nil without
	sweep *sweeper    // IdleTimeout; nil without

	timeoutErr error         // the cause of a CreateTimeout
	closeDone  chan struct{} // closed when the first Close returns

	lastReleases gate       // ends of leases off the fast path, and the Releases of last leases they run, which Close waits for
	lingerers    sync.Map   // *shard.Slot of each lingering value → when it was given up (Peers)
	latency      *latencies // of creations and of waits for room

	errMu       sync.Mutex
	releaseErrs []error // panics of Release outside Invalidate, reported by Close
}

// New returns an empty cache, or an error naming the first invalid field of
// cfg.
func New[K comparable, V any](cfg Config[K, V]) (*Cache[K, V], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t, err := shard.New[K, V](shard.Options[K]{Shards: cfg.Shards, Hash: cfg.Hash})
	if err != nil {
		return nil, err
	}
	c := &Cache[K, V]{
		table:      t,
		stats:      newStripes(),
		closing:    make(chan struct{}),
		create:     cfg.Create,
		release:    cfg.Release,
		retry:      cfg.Retry,
		timeout:    cfg.CreateTimeout,
		ttl:        cfg.ErrorTTL,
		timeoutErr: fmt.Errorf("%w of %v: %w", ErrCreateTimeout, cfg.CreateTimeout, context.DeadlineExceeded),
		closeDone:  make(chan struct{}),
		latency:    new(latencies),

		lastReleases: newGate(),
	}
	if cfg.MaxEntries > 0 {
		c.room = newRoom[K, V](cfg.MaxEntries)
		t.SetProbation()
	}
	if cfg.IdleTimeout > 0 {
		c.sweep = &sweeper{every: max(cfg.IdleTimeout/shard.IdleSteps, 1)}
	}
	t.SetMiss(c.getSlow)
	t.SetLeaseMiss(c.acquireSlow)
	t.SetOwner(c)
	return c, nil
}

// Get returns key's value, creating it if the cache holds none; the
// package documentation states what a creation guarantees.
//
// A hit does not look at ctx. With IdleTimeout or MaxEntries set, the first
// hit after an idle sweep or eviction's clock hand passed the value takes
// the slow path once and records the use with one compare-and-swap of the
// slot's state; the hits after it write nothing. On a miss, Get waits for
// the creation's outcome: the value, or the error of the final attempt
// (remembered only with ErrorTTL), or ctx.Err() as soon as its own ctx
// ends, while the creation goes on for the others. A Get whose ctx has
// ended already is a probe: on a miss it returns ctx.Err() at once, and
// starts no creation and waits for none (an Acquire likewise leases a
// ready value and nothing else).
//
// Once Close has begun, Get returns ErrClosed.
func (c *Cache[K, V]) Get(ctx context.Context, key K) (V, error) {
	return c.table.Get(ctx, key) // a miss comes back to getSlow
}

// Load returns key's value if the cache holds one. It never creates, never
// waits, takes no lock and allocates nothing. After Close it finds nothing.
func (c *Cache[K, V]) Load(key K) (v V, ok bool) {
	v, err := c.table.Get(shard.NoMiss, key) // Get's hit path, never its miss
	return v, err == nil
}

func (c *Cache[K, V]) getSlow(ctx context.Context, key K) (V, error) {
	v, _, err := c.obtain(ctx, key, false)
	return v, err
}

// obtain is the slow path of Get and Acquire: it returns key's value,
// creating it or waiting for its creation, and with lease a lease of it. A
// zero Lease with a nil error means the value left the cache before it
// could be leased: the caller tries again.
func (c *Cache[K, V]) obtain(ctx context.Context, key K, lease bool) (v V, l Lease[K, V], err error) {
	if c.table.Closed() {
		return v, l, ErrClosed
	}
	if c.room != nil {
		c.room.freq.add(c.table.Hash(key)) // what eviction weighs (sketch.go)
	}
	s := c.table.LoadOrInsert(key)
	for {
		st := s.State()
		status := st.Status()
		if status != shard.Ready {
			if err := ctx.Err(); err != nil {
				return v, l, err // nobody to create or wait for
			}
		}
		again := false
		switch status {
		case shard.Ready:
			v, l, again, err = c.slowHit(s, st, lease)
		case shard.Creating:
			c.stats.of(unsafe.Pointer(s)).waits.Add(1)
			v, l, err = c.wait(ctx, s, st.Flight(), false, lease)
			again = err == errNoRoomClaimer // its claimer left while waiting for room: claim it
		case shard.Failed:
			var expired bool
			if expired, again, err = c.failure(s, st); expired {
				v, l, again, err = c.claimAndCreate(ctx, s, st, lease) // create again
			}
		case shard.Empty:
			v, l, again, err = c.claimAndCreate(ctx, s, st, lease)
		case shard.Dead:
			s, again = c.table.LoadOrInsert(key), true
		case shard.Sealed:
			err = ErrClosed
		case shard.Straggling:
			err = c.awaitStraggler(ctx, s, st)
			again = err == nil
		}
		if !again {
			return v, l, err
		}
	}
}

// slowHit is obtain's answer for a Ready slot that the hit path passed by:
// a value the clock hand or an idle sweep aged, which this use makes young
// again, or any value that an Acquire's slow path leases. again: the value
// left meanwhile; look at the slot again.
func (c *Cache[K, V]) slowHit(s *shard.Slot[K, V], st *shard.State[V], lease bool) (v V, l Lease[K, V], again bool, err error) {
	if c.table.Closed() {
		return v, l, false, ErrClosed
	}
	if !c.table.Touch(s, st) {
		return v, l, true, nil // evicted or removed meanwhile
	}
	if lease {
		var ok bool
		if l, ok = c.leaseHeld(s); !ok {
			return v, l, false, nil // removed meanwhile: the caller looks again
		}
	}
	return s.Value(), l, false, nil
}

// failure is obtain's answer for a Failed slot: the remembered error (or a
// timed-out creation's, whose Create still runs), or expired (the failure
// has passed its ErrorTTL: create again), or again (look again).
func (c *Cache[K, V]) failure(s *shard.Slot[K, V], st *shard.State[V]) (expired, again bool, err error) {
	f := st.Flight()
	if _, err := f.Result(); err == errNoRoomClaimer {
		// A claim whose claimer left the wait for room, seen between its
		// answer and its settling: the slot is about to be Empty.
		runtime.Gosched()
		return false, true, nil
	}
	// A zero Until marks a timed-out Create still running.
	if until := f.Until(); until.IsZero() || time.Now().Before(until) {
		c.stats.of(unsafe.Pointer(s)).errorHits.Add(1)
		_, err := f.Result()
		return false, false, err
	}
	return true, false, nil
}

// claimAndCreate claims s, found in state st (Empty, or an expired failure), and
// runs its creation: on the caller's goroutine if nothing could answer the
// caller before Create returns, else on a goroutine of its own, while the
// caller waits, able to leave. again: another goroutine moved the slot
// first, or the claim was given up; look again.
func (c *Cache[K, V]) claimAndCreate(ctx context.Context, s *shard.Slot[K, V], st *shard.State[V], lease bool) (v V, l Lease[K, V], again bool, err error) {
	g := &c.stats.of(unsafe.Pointer(s)).gate
	if !g.enter() {
		return v, l, false, ErrClosed
	}
	claim, f, ok := s.Claim(st, valuesOf(ctx))
	if !ok {
		g.exit()
		return v, l, true, nil // somebody else moved the slot first
	}
	if lease {
		f.WantLease() // leased before it is published: see shard.Flight.WantLease
	}
	// Close cancels the creations it finds in the table after it closed
	// it; this one may have been claimed too late to be found.
	if c.table.Closed() {
		f.Cancel(ErrClosed)
	}
	if c.room != nil {
		if took, err := c.takeRoom(ctx, s, claim, f, lease); !took {
			v, l, err = c.noRoom(ctx, s, claim, f, lease, err)
			return v, l, false, err
		}
	}
	if ctx.Done() == nil && c.timeout <= 0 {
		// Nothing could answer this caller before Create returns: not
		// its context, which never ends, nor a CreateTimeout. It runs
		// Create itself, which spares it a goroutine, a fresh stack for
		// Create and two trips through the scheduler.
		c.run(s, claim, f)
		v, l, err = c.outcome(s, f, true, lease)
		return v, l, false, err
	}
	go c.run(s, claim, f)
	v, l, err = c.wait(ctx, s, f, true, lease)
	return v, l, false, err
}

// awaitStraggler waits for the straggler a Straggling slot s (in state st)
// waits for: no second creation of the key may start before it returns.
// A nil error: it has returned, and s is Empty (look again).
func (c *Cache[K, V]) awaitStraggler(ctx context.Context, s *shard.Slot[K, V], st *shard.State[V]) error {
	select {
	case <-st.Flight().Done():
		s.ClearStraggler(st)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closing:
		return ErrClosed
	}
}

// noRoom ends a claim whose creation never started: its claimer left while
// waiting for room (err), or an Offer answered it meanwhile (err nil).
// The waiters of the claim go round again, and one of them claims the key
// anew and waits for room itself.
func (c *Cache[K, V]) noRoom(ctx context.Context, s *shard.Slot[K, V], claim *shard.State[V], f *shard.Flight[V], lease bool, err error) (v V, l Lease[K, V], _ error) {
	defer c.stats.of(unsafe.Pointer(s)).gate.exit()
	if err != nil && f.TryResolve() {
		s.Settle(claim, nil)
		f.Finish(v, errNoRoomClaimer, time.Time{})
	}
	f.Cancel(context.Canceled)
	f.MarkReturned() // no Create runs: a slot Straggling on this claim may be cleared
	if err != nil {
		return v, l, err
	}
	// An Offer answered the claim: its value, leased if asked.
	return c.outcome(s, f, true, lease)
}

// wait parks until f's outcome, ctx's end or Close, whichever comes first.
// claimer says that the caller started the creation.
func (c *Cache[K, V]) wait(ctx context.Context, s *shard.Slot[K, V], f *shard.Flight[V], claimer, lease bool) (v V, l Lease[K, V], err error) {
	if f.Finished() {
		return c.outcome(s, f, claimer, lease) // no select: see outcome
	}
	f.AddWaiters(1) // for Peers
	defer f.AddWaiters(-1)
	select {
	case <-f.Done():
		return c.outcome(s, f, claimer, lease)
	case <-ctx.Done():
		c.stats.of(unsafe.Pointer(s)).cancels.Add(1)
		c.leave(s, f, claimer, lease)
		return v, l, ctx.Err()
	case <-c.closing:
		c.leave(s, f, claimer, lease)
		return v, l, ErrClosed
	}
}

// outcome is what a Get or Acquire gets from f, whose Done is closed or
// about to be.
func (c *Cache[K, V]) outcome(s *shard.Slot[K, V], f *shard.Flight[V], claimer, lease bool) (v V, l Lease[K, V], err error) {
	if !f.Finished() {
		// A receive from a finished flight's Done, the one closed channel
		// of every finished flight, would take that channel's lock: a
		// lock every core's misses share.
		<-f.Done()
	}
	if c.table.Closed() {
		c.leave(s, f, claimer, lease)
		return v, l, ErrClosed // the value, if any, is being released
	}
	if v, err = f.Result(); err != nil || !lease {
		return v, l, err
	}
	if claimer {
		if tk, ok := f.TakeLease(); ok {
			return v, Lease[K, V]{s, tk}, nil
		}
	}
	// A waiter, or a claimer whose creation an Offer answered: v is
	// published on s, unless it was removed already. Leasing it is a use.
	c.table.Touch(s, s.State())
	if l, ok := c.leaseHeld(s); ok {
		return v, l, nil
	}
	return *new(V), l, nil
}

// leave is what a claimer that asked for a lease does when it leaves
// without the outcome: the lease its creator may have taken for it ends.
func (c *Cache[K, V]) leave(s *shard.Slot[K, V], f *shard.Flight[V], claimer, lease bool) {
	if !claimer || !lease {
		return
	}
	if tk, taken := f.ClaimerLeaves(); taken {
		c.endLease(s, tk, true)
		c.kick()
	}
}

// Invalidate drops key's value and releases it, reporting true, if the cache
// holds one. A key that is absent or still being created gives false, and a
// creation in flight is not disturbed. Release runs on the calling goroutine
// before Invalidate returns; if it panics, the panic propagates to the
// caller, and the value counts as released all the same. A value that a
// Lease holds (see Acquire) leaves the cache at once all the same, but is
// released by the Release of its last lease, not here.
//
// The value leaves the cache before Release is called, so a Get of the key
// from another goroutine may start a new creation while this Release is
// still running: a Create must not assume the previous value is gone.
func (c *Cache[K, V]) Invalidate(key K) bool {
	return c.invalidate(key, nil)
}

// CompareAndInvalidate is Invalidate, done only if the value held for key
// equals old. Use it to report a failed endpoint: a late report about an
// old endpoint never removes its replacement. Values are compared like
// sync.Map.CompareAndDelete compares them (as interfaces): it panics if
// they are of a type that is not comparable.
func (c *Cache[K, V]) CompareAndInvalidate(key K, old V) bool {
	return c.invalidate(key, func(v V) bool { return any(v) == any(old) })
}

func (c *Cache[K, V]) invalidate(key K, match func(V) bool) bool {
	s := c.table.Lookup(key)
	if s == nil {
		return false
	}
	st := c.stats.of(unsafe.Pointer(s))
	if !st.gate.enter() {
		return false
	}
	defer st.gate.exit()
	v, ok := c.table.InvalidateIf(s, match)
	if !ok {
		return false
	}
	st.ready.Add(-1)
	if s.Abandon() {
		c.releaseNow(st, key, v)
	} else {
		c.linger(st, s) // released by the end of its last lease
	}
	return true
}

// endLease ends the lease tk of s off Release's fast path, and releases
// s's value if this was its last lease (quiet: see releaseLast). It counts
// itself in lastReleases before the lease ends, and Close stops counting
// before it returns: so the Release of a last lease whose end came before
// Close stopped counting has returned when Close does, and one whose end
// came after runs once Close has returned. Nothing a caller can see of a
// lease's end (Stats.Lingering, Peers) comes before it is counted. It
// returns what EndWatchedLease does.
func (c *Cache[K, V]) endLease(s *shard.Slot[K, V], tk shard.Ticket, quiet bool) (last, watched bool, err error) {
	counted := c.lastReleases.enter()
	if counted {
		defer c.lastReleases.exit() // also after a panic or runtime.Goexit in Release
	}
	last, watched, err = s.EndWatchedLease(tk)
	if last {
		c.releaseLast(s, quiet, counted)
	}
	return last, watched, err
}

// releaseLast releases s's value, which had left the cache, after its last
// lease ended: outside any gate, on the goroutine of the call that ended
// the lease, which endLease counted for Close to wait for (counted), or
// not, once Close has stopped counting. With quiet, a panic (or
// runtime.Goexit) in Release is recorded for Close to report, as from a
// creation's goroutine, as long as Close will still read it; once Close has
// stopped counting, and always without quiet, it propagates to the caller.
func (c *Cache[K, V]) releaseLast(s *shard.Slot[K, V], quiet, counted bool) {
	st := c.stats.of(unsafe.Pointer(s))
	st.lingering.Add(-1)
	c.unlinger(s)
	// An eviction's value, which a lease caught as it left: its room is
	// on its way to the first in line (remove), and arrives when Release
	// returns, as in releaseEvicted.
	evicted := c.room != nil && s.Noted()
	if evicted {
		defer c.room.putEvicted() // after Release returns, or panics
	}
	if quiet && counted {
		c.releaseQuietlyKeeping(st, s.Key(), s.Value(), evicted)
		return
	}
	c.releaseNowKeeping(st, s.Key(), s.Value(), evicted)
}

// releaseNow gives up v: it counts the release first, so that a panicking
// Release (which propagates) is still counted once.
func (c *Cache[K, V]) releaseNow(st *stripe, key K, v V) {
	c.releaseNowKeeping(st, key, v, false)
}

// releaseNowKeeping is releaseNow; with keepRoom, the value's unit of room
// (MaxEntries) does not come back when Release returns, or panics: the
// caller takes it over.
func (c *Cache[K, V]) releaseNowKeeping(st *stripe, key K, v V, keepRoom bool) {
	st.releases.Add(1)
	if c.room != nil && !keepRoom {
		defer c.room.put() // after Release returns, or panics
	}
	if c.release != nil {
		defer func() {
			if r := recover(); r != nil {
				st.releasePanics.Add(1)
				panic(r)
			}
		}()
		c.release(key, v)
	}
}

// releaseQuietly is releaseNow for goroutines that are not the caller's
// (creations, Close): a panic, or a runtime.Goexit, is recorded and
// reported by Close.
func (c *Cache[K, V]) releaseQuietly(st *stripe, key K, v V) {
	c.releaseQuietlyKeeping(st, key, v, false)
}

// releaseQuietlyKeeping is releaseQuietly, and releaseNowKeeping's keepRoom.
func (c *Cache[K, V]) releaseQuietlyKeeping(st *stripe, key K, v V, keepRoom bool) {
	returned := false
	defer func() {
		if returned {
			return
		}
		var err error
		if r := recover(); r != nil {
			err = fmt.Errorf("epcache: Release of key %v: %w", key, &PanicError{Value: r, Stack: debug.Stack()})
		} else {
			err = fmt.Errorf("epcache: Release of key %v called runtime.Goexit", key)
		}
		c.errMu.Lock()
		c.releaseErrs = append(c.releaseErrs, err)
		c.errMu.Unlock()
	}()
	c.releaseNowKeeping(st, key, v, keepRoom)
	returned = true
}

// held is a value Close gives up.
type held[K comparable, V any] struct {
	slot *shard.Slot[K, V]
	v    V
}

// releaseAll releases the values, then closes done. It runs on a goroutine of
// its own, so that a Release calling runtime.Goexit ends that goroutine and
// not Close's caller; the rest are then released by a new goroutine.
func (c *Cache[K, V]) releaseAll(values []held[K, V], done chan struct{}) {
	i := 0
	defer func() {
		if i < len(values) {
			go c.releaseAll(values[i+1:], done) // values[i]'s Release called Goexit
			return
		}
		close(done)
	}()
	for ; i < len(values); i++ {
		st := c.stats.of(unsafe.Pointer(values[i].slot))
		st.ready.Add(-1)
		if !values[i].slot.Abandon() {
			c.linger(st, values[i].slot) // released by the end of its last lease
			continue
		}
		c.releaseQuietly(st, values[i].slot.Key(), values[i].v)
	}
}

// Forget drops key's remembered failure (see Config.ErrorTTL), so that the
// next Get creates at once: for a peer known to be back before the TTL
// ends. It reports whether there was one to drop: a failure whose ErrorTTL
// has not passed. A ready value, a creation in flight, and a timed-out
// creation still running are left alone.
func (c *Cache[K, V]) Forget(key K) bool {
	s := c.table.Lookup(key)
	return s != nil && s.Forget(s.State())
}

// All yields the key and value of every ready entry, like sync.Map.Range:
// weakly consistent (no entry is yielded twice; entries added or removed
// during the iteration may or may not be seen), holding no lock while the
// loop body runs. It yields nothing once Close has begun.
func (c *Cache[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for s := range c.table.All() {
			if c.table.Closed() {
				return
			}
			if v, ok := s.Load(); ok && !yield(s.Key(), v) {
				return
			}
		}
	}
}

// Len returns the number of ready entries. It is O(GOMAXPROCS), not O(n).
func (c *Cache[K, V]) Len() int {
	return int(max(c.stats.sum().Ready, 0))
}

// Stats returns the cache's counters; see [Stats].
func (c *Cache[K, V]) Stats() Stats {
	st := c.stats.sum()
	if c.room != nil {
		st.Room = c.room.used.Load()
	}
	for o := range st.CreateLatency {
		st.CreateLatency[o] = c.latency.create[o].snapshot()
	}
	st.RoomWait = c.latency.room.snapshot()
	return st
}

// Close shuts the cache down. From its first step, Get returns ErrClosed,
// to new callers and to callers waiting on creations, and Load finds
// nothing. Close then cancels the contexts of the creations in flight, waits
// for them (a Create that ignores its context delays Close until it
// returns) and for Releases already running, releases every value the cache
// still holds exactly once, and returns when every Release has returned.
//
// Close does not wait for leases (see Acquire): a value a Lease holds is
// released by the Release of its last lease, on that goroutine, after Close
// may have returned. Stats.Lingering counts the values still waiting so; one
// that stays there names a lease that was never released. But every Release
// that began before Close was called has returned when Close does, a last
// lease's included (a Lease.Release has begun, for this, once its value no
// longer counts in Stats.Lingering): once Close returns, a caller may tear
// down what Release needs. The Release of a last lease released while
// Close runs is run either before Close returns or after it.
//
// Close reports the panics of Release calls it could not propagate (those
// made by Close itself, by creations that finished after their callers were
// answered, by evictions and idle removals, and by the end of a lease that a
// Get or Acquire dropped on its way out), joined, each wrapping a
// *PanicError; every other value is still released. Once Close has returned,
// such a panic propagates to the caller whose call ended the value's last
// lease, as Lease.Release's does. A second Close waits for the first and
// returns nil.
func (c *Cache[K, V]) Close() error {
	if !c.table.Close() { // from here on Get and Load miss, and a miss says ErrClosed
		<-c.closeDone
		return nil
	}
	defer close(c.closeDone)
	close(c.closing)
	c.stopSweeps()
	// Cancel the creations in flight. One claimed after the table was
	// closed may be missed here, but then its claimer sees the table closed
	// and cancels it itself (obtain).
	for s := range c.table.All() {
		if f := s.State().Flight(); f != nil {
			f.Cancel(ErrClosed)
		}
	}
	for i := range c.stats {
		c.stats[i].gate.close()
	}
	// No creation is in flight and none can start: sealing sees every value.
	var values []held[K, V]
	_ = c.table.Seal(func(s *shard.Slot[K, V], old *shard.State[V]) {
		if old.Status() == shard.Ready {
			values = append(values, held[K, V]{s, s.Value()})
		}
	})
	done := make(chan struct{})
	go c.releaseAll(values, done)
	<-done
	c.lastReleases.close()
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return errors.Join(c.releaseErrs...)
}
