package shard

import (
	"context"
	"sync/atomic"
	"time"
	"unsafe"
)

// A slot's life is a small state machine, driven only by compare-and-swap on
// one atomic pointer to an immutable [State]:
//
//	Empty ──Claim──▶ Creating ──Publish──▶ Ready ──Invalidate──▶ Dead
//	  ▲                 │
//	  └────Settle───────┤
//	                    └──Settle(failure)──▶ Failed ──Claim──▶ Creating
//	Empty, expired Failed ──(table compaction)──▶ Dead     any ──Seal──▶ Sealed
//
// A creation that an Offer answered (publishing the offered value on its
// claim) while its Create still runs is a straggler (MarkStraggler). Until
// its Create returns, the key's next slot starts Straggling rather than
// Empty, so that no second creation of the key overlaps it:
//
//	Ready (a straggler's answer) ──Invalidate──▶ Dead; the next slot: Straggling
//	Straggling ──the straggler returns; ClearStraggler──▶ Empty
//	Straggling ──ClaimResolved (an Offer)──▶ Creating ──Publish──▶ Ready
//
// Leases run beside the state, on the value of a Ready slot (lease.go):
//
//	Ready ──Lease──▶ Ready, leased ──EndLease──▶ Ready
//	Ready, leased ──Invalidate, Seal; Abandon──▶ Dead or Sealed, draining
//	draining ──last EndLease──▶ released (by that EndLease's caller)
//
// Exactly one goroutine wins the Claim of an Empty slot or a remembered
// failure; it alone may Publish or Settle the claim, so for a key at most one
// creation is ever in flight. Everybody else who finds the slot Creating
// parks on the [Flight]'s Done channel and reads the outcome once it is
// closed: no spinning, and no placeholder is ever mistaken for a value (the
// bug of ompi PR #12863), because a Ready state is the only one without a
// Flight.
//
// A slot holds at most one value in its life, in the slot itself, so that a
// hit reads the slot's cache line and no other (all Ready slots point to one
// shared Ready state, always in cache). The value is written before the
// state pointer is switched to Ready by CAS, so the publication synchronizes
// before every Load that returns the value, and it is never written again:
// Invalidate ends the slot (Dead) and the table puts a fresh Empty slot for
// the key in its place in the array, which also lets the collector free a
// released value as soon as its last reader is done.
//
// Failed is either a remembered failure (Until is set: answer the error until
// then) or a creation that was abandoned by a timeout while its function is
// still running (Until is zero: answer the error until the creator settles
// the slot, so that a second creation never overlaps the first).
//
// Dead marks a slot that left the table (invalidated, or Empty or an expired
// remembered failure when its shard's array was rebuilt): the key must be
// looked up again. Sealed is final: the table is closed.

// Status is the state a slot is in; see [State.Status].
type Status uint8

const (
	Empty      Status = iota // no value and no creation: Claim may start one
	Creating                 // a creation is in flight: wait on its Flight
	Ready                    // a value is published
	Failed                   // a failure is being answered: see Flight.Until
	Dead                     // removed from the table: look the key up again
	Sealed                   // the table is closed
	Straggling               // empty, but a straggler still runs: wait on its Flight, then ClearStraggler
)

var statusNames = [...]string{"empty", "creating", "ready", "failed", "dead", "sealed", "straggling"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "invalid"
}

// State is an immutable snapshot of a slot. The nil *State is Empty. All
// Ready slots of a table share one Ready state; the value lives in the slot.
type State[V any] struct {
	flight *Flight[V] // nil exactly when the state is Ready
	age    uint8      // of a Ready state: 0 young, else 1 + its step (age.go)
}

// Status reports which state st is. It does not block. A snapshot of a
// claim whose flight has since succeeded reports Creating: its Flight's Done
// is closed and its Result is the published value.
func (st *State[V]) Status() Status {
	if st == nil {
		return Empty
	}
	f := st.flight
	if f == nil {
		return Ready
	}
	switch f.kind {
	case flightDead:
		return Dead
	case flightSealed:
		return Sealed
	case flightStraggler:
		return Straggling
	}
	if f.Finished() {
		if f.err == nil {
			// A snapshot taken before the slot was published: the flight
			// succeeded, and waiting on it returns the value at once.
			return Creating
		}
		return Failed
	}
	return Creating
}

// expired reports whether st is a remembered failure (Failed, non-zero
// Until) whose Until is not after now, or a Straggling state whose creation
// has returned: a state that holds nothing any more.
func (st *State[V]) expired(now time.Time) bool {
	switch st.Status() {
	case Failed:
		return !st.flight.until.IsZero() && !now.Before(st.flight.until)
	case Straggling:
		return st.flight.Finished()
	}
	return false
}

// Flight returns the creation of a Creating or Failed state, or what a
// Straggling state waits for (its Done closes when the creation returns), or
// nil.
func (st *State[V]) Flight() *Flight[V] {
	if st == nil || st.flight == nil || st.flight.kind != flightNormal && st.flight.kind != flightStraggler {
		return nil
	}
	return st.flight
}

type flightKind uint8

const (
	flightNormal flightKind = iota
	flightDead
	flightSealed
	flightStraggler // Straggling: done when a creation an Offer answered returns
)

// Flight is one creation of one key: the goroutines that find the slot
// Creating park on Done and read Result when it is closed.
//
// Exactly one party resolves a flight: TryResolve arbitrates between the
// creator and, for example, a timeout. The winner sets the outcome with
// Finish, which closes Done; writing the outcome synchronizes before every
// Result call that follows a receive from Done.
//
// A flight carries its own Creating state, and makes its Done channel only
// when somebody waits, so that a creation nobody waits for costs one
// allocation.
type Flight[V any] struct {
	state      State[V]             // the Creating (later Failed) state of this flight
	done       atomic.Pointer[byte] // Done's channel (chanWord): nil until a waiter or Finish; closed's once finished
	resolved   atomic.Bool
	kind       flightKind
	returned   atomic.Bool               // the creator's function has returned (MarkReturned)
	lease      flightLease               // a lease of the created value for the claimer (lease.go)
	straggling atomic.Pointer[Flight[V]] // a Straggling state's flight, done when this creation returns
	ctx        flightCtx                 // the creation's context
	started    int64                     // when the flight was made (Nanotime): the claim, or the failure
	waiters    atomic.Int32              // callers waiting on Done now (AddWaiters)
	value      V
	err        error
	until      time.Time
}

// newFlight returns a flight and its state.
func newFlight[V any](parent context.Context) (*State[V], *Flight[V]) {
	f := &Flight[V]{started: Nanotime()}
	f.ctx.parent = parent
	f.state.flight = f
	return &f.state, f
}

// closed is the Done channel of every finished flight.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Finished reports whether Finish has been called (the outcome is set),
// without making Done's channel.
func (f *Flight[V]) Finished() bool { return f.done.Load() == closedWord }

// closedWord is closed as flight.done holds it.
var closedWord = chanWord(closed)

// Done is closed when the outcome is set. The first call before then makes
// the channel.
func (f *Flight[V]) Done() <-chan struct{} {
	if p := f.done.Load(); p != nil {
		return wordChan(p)
	}
	ch := make(chan struct{})
	if f.done.CompareAndSwap(nil, chanWord(ch)) {
		return ch
	}
	return wordChan(f.done.Load()) // Finish, or another waiter, came first
}

// TryResolve reports whether the caller won the right to call Finish. It
// returns true once per flight.
func (f *Flight[V]) TryResolve() bool { return f.resolved.CompareAndSwap(false, true) }

// Finish records the outcome and wakes every waiter. Only the goroutine whose
// TryResolve returned true may call it, and only once. until, for a failure,
// is the time up to which the failure should be answered without a new
// creation; the zero time means "until the creator settles the slot".
func (f *Flight[V]) Finish(v V, err error, until time.Time) {
	f.value, f.err, f.until = v, err, until
	if p := f.done.Swap(closedWord); p != nil {
		close(wordChan(p)) // a waiter made it: wake them
	}
}

// Started returns when the flight was made: when its creation was claimed,
// or, for a remembered failure (NewFailure), when the failure was.
func (f *Flight[V]) Started() time.Time { return Time(f.started) }

// StartedNanos is Started as a Nanotime reading.
func (f *Flight[V]) StartedNanos() int64 { return f.started }

// AddWaiters adds n (which may be negative) to the count of callers
// waiting on f, which Waiters reports: for statistics, not for
// synchronization.
func (f *Flight[V]) AddWaiters(n int) { f.waiters.Add(int32(n)) }

// Waiters returns the callers waiting on f now, as counted by AddWaiters.
func (f *Flight[V]) Waiters() int { return int(f.waiters.Load()) }

// Result returns the outcome. Call it only after Done is closed.
func (f *Flight[V]) Result() (V, error) { return f.value, f.err }

// Until returns the time up to which a failed flight's error is answered; see
// Finish. Call it only after Done is closed.
func (f *Flight[V]) Until() time.Time { return f.until }

// Context returns the creation's context: the values of the parent given to
// [Slot.Claim], without its cancellation (the parent's Done must be nil),
// cancelled by Cancel. It costs nothing until one of its methods is called.
func (f *Flight[V]) Context() context.Context { return &f.ctx }

// Cancel cancels the creation's context (see Context) with cause; the first
// cause given is kept. It may be called any number of times, by anyone, at
// any time.
func (f *Flight[V]) Cancel(cause error) { f.ctx.end(cause) }

// Slot holds one key, the atomic pointer to its current [State], the one
// value it may ever hold, and the leases of that value. A slot stays at one
// address for its whole life, so a goroutine may keep a *Slot across
// transitions; once it is Dead, [Table.LoadOrInsert] gives the key's new
// slot.
type Slot[K comparable, V any] struct {
	key    K
	state  atomic.Pointer[State[V]]
	value  V                          // written once, by Publish, before the state becomes Ready
	leases atomic.Pointer[leaseTable] // made by the first Lease (see lease.go)
}

// Key returns the slot's key.
func (s *Slot[K, V]) Key() K { return s.key }

// Value returns the value of a slot that is, or was, Ready (the zero value
// if it never was). It never changes once published.
func (s *Slot[K, V]) Value() V { return s.value }

// State returns the slot's current state (nil when Empty).
func (s *Slot[K, V]) State() *State[V] { return s.state.Load() }

// Load returns the value of a Ready slot. It takes no lock, allocates nothing
// and writes nothing: one atomic load and one comparison.
func (s *Slot[K, V]) Load() (v V, ok bool) {
	if st := s.state.Load(); st != nil && st.flight == nil {
		return s.value, true
	}
	return v, false
}

// Claim moves the slot from old, which must be the Empty (nil) state or a
// remembered failure (a Failed state with a non-zero Until) the caller has
// observed, to Creating. (A creation waits for a Straggling slot's
// straggler, then ClearStraggler; ClaimResolved may claim one for a value
// that is not created.) It returns the new state and its flight; ok is
// false when another goroutine changed the slot first (load the state again
// and decide anew). The winner owns the flight: it must later call Publish or
// Settle with the returned state. parent gives the values of the creation's
// context ([Flight.Context]); its Done must be nil (see
// context.WithoutCancel).
func (s *Slot[K, V]) Claim(old *State[V], parent context.Context) (claim *State[V], f *Flight[V], ok bool) {
	// A Failed state with a zero Until belongs to a creation still running,
	// and so does a Straggling one: claiming it would start a second one.
	if old != nil && (old.Status() != Failed || old.flight.until.IsZero()) {
		return nil, nil, false
	}
	return s.claim(old, parent, false)
}

// ClaimResolved is Claim for a value the claimer already has (an offered
// one): the flight is resolved before the claim is visible, so that nobody
// else may answer it, and the claimer goes on to Publish and Finish.
func (s *Slot[K, V]) ClaimResolved(old *State[V]) (claim *State[V], f *Flight[V], ok bool) {
	if old != nil && old.Status() != Straggling && (old.Status() != Failed || old.flight.until.IsZero()) {
		return nil, nil, false
	}
	return s.claim(old, nil, true)
}

func (s *Slot[K, V]) claim(old *State[V], parent context.Context, resolved bool) (claim *State[V], f *Flight[V], ok bool) {
	claim, f = newFlight[V](parent)
	f.resolved.Store(resolved)
	if !s.state.CompareAndSwap(old, claim) {
		return nil, nil, false
	}
	return claim, f, true
}

// Settle ends a claim that produced no value: the slot becomes Empty, or, with
// a non-nil failure (see [NewFailure]), Failed. It reports whether the slot
// still held claim.
func (s *Slot[K, V]) Settle(claim, failure *State[V]) bool {
	return s.state.CompareAndSwap(claim, failure)
}

// NewFailure returns a Failed state that answers err until the given time,
// which must not be zero.
func NewFailure[V any](err error, until time.Time) *State[V] {
	st, f := newFlight[V](context.Background())
	f.resolved.Store(true)
	f.Finish(*new(V), err, until)
	return st
}

// MarkStraggler records that the creation of flight f, claimed on s, is a
// straggler: someone other than its creator (an Offer) answered it, and
// publishes a value on s, while the creator's function still runs. Until
// f's creator calls MarkReturned, a fresh slot that replaces s (after an
// Invalidate of that value) starts Straggling, so that no second creation
// of the key starts while the first still runs. f may also be the flight
// of a Straggling state that an Offer claimed: the straggler then carries
// over to the offered value's successor. Call it before the value is
// published.
func (s *Slot[K, V]) MarkStraggler(f *Flight[V], owner any) {
	s.leaseTable(owner).straggler = unsafe.Pointer(f)
}

// IdleSweeps returns how many idle sweeps a Ready state has stayed unused
// through (see Table.Age): 0 for a young or cooled value and for every
// other state.
func (st *State[V]) IdleSweeps() int {
	if !isValue(st) || st.age < 2 || st.age > IdleSteps+1 {
		return 0
	}
	return int(st.age) - 1
}

// Handle refers to a slot for as long as the slot holds its value, and to
// nothing from the moment the value leaves the table (Invalidate,
// InvalidateState, Seal). A structure outside the table that must find
// values again (epcache's eviction clock) holds handles rather than slots,
// so that it keeps no value reachable once the value has left: a slot
// holds its value for its whole life.
//
// A handle is 16 bytes, a size class no slot of a key of up to 8 bytes
// shares (32): handles made as values are published do not interleave
// with slots in memory, which a table's probes of many peers would feel.
type Handle[K comparable, V any] struct {
	slot  atomic.Pointer[Slot[K, V]]
	since int64 // when the value was published (Nanotime), as Track was told
}

// Slot returns the slot, or nil once its value has left the table.
func (h *Handle[K, V]) Slot() *Slot[K, V] { return h.slot.Load() }

// Track returns a new handle of s. Call it once, before s's value is
// published, with now the time of the publication (a Nanotime reading,
// which the caller may have read for other ends): the value's removal
// clears the handle. It allocates the handle, and s's lease table if s has
// none.
func (s *Slot[K, V]) Track(owner any, now int64) *Handle[K, V] {
	h := &Handle[K, V]{since: now}
	h.slot.Store(s)
	s.leaseTable(owner).handle = unsafe.Pointer(h)
	return h
}

// Published returns when s's value was published, if Track was called for
// it, and the zero time otherwise.
func (s *Slot[K, V]) Published() time.Time {
	if tb := s.leases.Load(); tb != nil {
		if h := (*Handle[K, V])(tb.handle); h != nil {
			return Time(h.since)
		}
	}
	return time.Time{}
}

// untrack clears s's handle, if Track made one: s's value has left the
// table.
func (s *Slot[K, V]) untrack() {
	if tb := s.leases.Load(); tb != nil {
		if h := (*Handle[K, V])(tb.handle); h != nil {
			h.slot.Store(nil)
		}
	}
}

// MarkReturned records that the creator of f has returned: a slot
// Straggling on f may be cleared and claimed. The creator calls it once,
// before it settles.
func (f *Flight[V]) MarkReturned() {
	f.returned.Store(true)
	if b := f.straggling.Load(); b != nil && b.TryResolve() {
		b.Finish(*new(V), nil, time.Time{})
	}
}

// stragglerState returns the state a fresh slot that replaces s starts in:
// Straggling while a straggler marked on s still runs, Empty otherwise.
// Every Straggling state of one straggler is the one state of its
// straggling flight, which MarkReturned finishes.
func (s *Slot[K, V]) stragglerState() *State[V] {
	tb := s.leases.Load()
	if tb == nil || tb.straggler == nil {
		return nil
	}
	f := (*Flight[V])(tb.straggler)
	if f.kind == flightStraggler { // an Offer stored s's value on a Straggling slot
		if f.Finished() {
			return nil
		}
		return &f.state
	}
	b := f.straggling.Load()
	if b == nil {
		_, nb := newFlight[V](context.Background())
		nb.kind = flightStraggler
		if f.straggling.CompareAndSwap(nil, nb) {
			b = nb
		} else {
			b = f.straggling.Load()
		}
	}
	// Either the creator sees the straggling flight when it returns, or
	// this sees that it has returned (both store, then load).
	if f.returned.Load() {
		return nil
	}
	return &b.state
}

// ClearStraggler moves s from old, a Straggling state whose straggler has
// returned (its Flight's Done is closed), to Empty. It reports whether s
// still held old.
func (s *Slot[K, V]) ClearStraggler(old *State[V]) bool {
	return old.Status() == Straggling && old.flight.Finished() && s.state.CompareAndSwap(old, nil)
}

// Forget moves a slot from old, a remembered failure still in force
// (Failed, Until not yet passed), to Empty, so that the next caller creates
// at once. It reports whether it did: not if the slot no longer held old,
// nor for a failure whose Until has passed, which answers nobody any more
// (the next caller creates anyway, and a rebuild may drop the slot at any
// time: reporting it would depend on when one ran). A timed-out creation
// that is still running (zero Until) cannot be forgotten: that would let a
// second one start.
func (s *Slot[K, V]) Forget(old *State[V]) bool {
	if old.Status() != Failed || old.flight.until.IsZero() || old.expired(time.Now()) {
		return false
	}
	return s.state.CompareAndSwap(old, nil)
}
