package shard

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// flightCtx is the context of one creation ([Flight.Context]): the values of
// the context its claimer gave, and a cancellation of its own, ended by
// [Flight.Cancel]. It costs nothing but the flight it lives in until it is
// used, and then only what that use needs:
//
//   - Err and Deadline read the flight's own state and the parent's;
//   - Done makes one channel, closed by Cancel (or a closed one, after);
//   - AfterFunc, which context.AfterFunc and the contexts derived from
//     this one (WithCancel, WithTimeout) call, keeps the function for
//     Cancel to call, with no goroutine to watch Done;
//   - a cancelCtx of the parent is made only for a lookup of a key that
//     may be the context package's own (its type is *int), which is how
//     context.Cause finds a context's cause: it is cancelled with the
//     flight's cause, so that Cause reports ErrOffered, ErrClosed and the
//     rest as with any cancelCtx.
//
// Most Creates of a cache that creates often look at their context only
// to select on Done while they wait (a dial's timer) or to poll Err: for
// them the context.WithCancelCause of every creation, its allocation, its
// cancel function and its cancellation, was work for nothing.
//
// The parent never ends (the cache passes context.WithoutCancel of the
// caller's, or a context whose Done is nil), so this context ends only by
// Cancel, and always with context.Canceled.
type flightCtx struct {
	parent context.Context
	done   atomic.Pointer[byte] // Done's channel (chanWord): nil until the first Done or Cancel (closed)
	ended  atomic.Bool          // Cancel was called: Err is Canceled

	mu     sync.Mutex // guards the fields below
	cause  error      // of the first Cancel
	afters []*afterFunc
	made   context.Context         // the cancelCtx for cause lookups, once made
	cancel context.CancelCauseFunc // made's
}

// afterFunc is one function registered by AfterFunc, until it is started
// or stopped.
type afterFunc struct {
	f       func()
	started bool // guarded by flightCtx.mu: by Cancel, or stopped
}

// chanWord and wordChan convert a channel to the pointer it is and back,
// so that flightCtx.done and Flight.done hold the channel itself: one CAS
// publishes Done's, where an atomic.Value's first Store takes three atomic
// operations and pins the P, and a pointer to a chan variable would
// allocate.
func chanWord(c chan struct{}) *byte { return *(**byte)(unsafe.Pointer(&c)) }
func wordChan(p *byte) chan struct{} { return *(*chan struct{})(unsafe.Pointer(&p)) }

func (c *flightCtx) end(cause error) {
	c.mu.Lock()
	if c.ended.Load() {
		c.mu.Unlock()
		return // the first cause stays, as with any CancelCauseFunc
	}
	c.cause = cause
	c.ended.Store(true) // before Done is closed: a closed Done finds Err set
	// Either this end stores closed, and every Done returns it, or a
	// Done's CAS came first, and this end closes its channel, which stays
	// Done's (successive Dones return one channel).
	if d := c.done.Load(); d != nil || !c.done.CompareAndSwap(nil, closedWord) {
		close(wordChan(c.done.Load()))
	}
	if c.cancel != nil {
		c.cancel(cause)
	}
	afters := c.afters
	c.afters = nil
	for _, a := range afters {
		a.started = true
	}
	c.mu.Unlock()
	// Called here, not on goroutines of their own: what the context
	// package registers is the cancellation of a derived context (or of
	// context.AfterFunc's, which starts the user's function on a
	// goroutine itself), and a derived context must have ended when
	// Cancel returns, as a cancelCtx's children have when its cancel
	// does: transport/tcp reads a dial's derived context right after the
	// Offer that answered its creation.
	for _, a := range afters {
		a.f()
	}
}

func (c *flightCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Done takes no lock: the first call's CAS publishes the channel it made,
// unless another Done, or Cancel (closed), came first.
func (c *flightCtx) Done() <-chan struct{} {
	if d := c.done.Load(); d != nil {
		return wordChan(d)
	}
	d := make(chan struct{})
	if c.done.CompareAndSwap(nil, chanWord(d)) {
		return d
	}
	return wordChan(c.done.Load())
}

func (c *flightCtx) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

func (c *flightCtx) Value(key any) any {
	if _, maybeCancelKey := key.(*int); maybeCancelKey {
		return c.cancelCtx().Value(key)
	}
	return c.parent.Value(key)
}

// cancelCtx returns the cancelCtx made from the parent, making it, and
// cancelling it with the cause if Cancel came first.
func (c *flightCtx) cancelCtx() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.made == nil {
		c.made, c.cancel = context.WithCancelCause(c.parent)
		if c.ended.Load() {
			c.cancel(c.cause)
		}
	}
	return c.made
}

// AfterFunc arranges for f to be called once the context ends: by Cancel,
// before it returns, or, if the context has ended already, on a goroutine
// of its own (the context package calls AfterFunc holding a lock that f
// takes); stop reports whether it stopped f from being called. The
// context package's propagation of a derived context's cancellation, and
// so context.AfterFunc, call it (its afterFuncer); f is theirs.
func (c *flightCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended.Load() {
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	c.afters = append(c.afters, a)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if a.started {
			return false
		}
		a.started = true
		for i, b := range c.afters {
			if b == a {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				break
			}
		}
		return true
	}
}

func (c *flightCtx) String() string { return "shard.Flight.Context" }
