package epcache

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/epcache/epcache/shard"
)

// run is the goroutine of one creation. It runs on its own goroutine, not on
// the Get that claimed the slot, so that this Get too can leave on its own
// context, and so that a runtime.Goexit in Create ends only this goroutine.
//
// The flight is resolved exactly once, by whichever comes first: the outcome
// of the attempts, or the end of the creation's context (CreateTimeout or
// Close), which answers the waiters even if Create ignores its context. The
// slot is settled only when the creation really ends, so no second creation
// of the key can overlap this one.
func (c *Cache[K, V]) run(callerCtx context.Context, s *shard.Slot[K, V], claim *shard.State[V], f *shard.Flight[V]) {
	defer c.gate.exit()
	// The creation's context ends when Create returns, as a context passed
	// to a call does, whether or not there is a CreateTimeout.
	var ctx context.Context = creationCtx{c.stoppingFor(s), callerCtx}
	var last *atomic.Pointer[failure] // the latest failed attempt, for the timeout's error
	stopAbandon := func() bool { return false }
	if c.timeout <= 0 {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ctx = cctx
	} else {
		// The timeout answers the waiters even if Create ignores ctx. (Close
		// needs no such hook: it answers the waiters itself.)
		tctx, cancel := context.WithTimeoutCause(ctx, c.timeout, c.timeoutErr)
		defer cancel()
		ctx, last = tctx, new(atomic.Pointer[failure])
		stopAbandon = context.AfterFunc(ctx, func() {
			if f.TryResolve() {
				c.stats.of(unsafe.Pointer(s)).createErrors.Add(1)
				err := context.Cause(ctx)
				if p := last.Load(); p != nil {
					err = ended(ctx, p.attempts, p.err)
				}
				// A zero Until keeps the slot answering this error until the
				// running Create returns and settles it.
				f.Finish(*new(V), err, time.Time{})
			}
		})
	}
	// Deferred, so that it also runs when Create calls runtime.Goexit.
	var (
		v        V
		err      error
		returned bool
	)
	defer func() {
		stopAbandon()
		if !returned {
			err = ErrGoexit
		}
		c.settle(s, claim, f, v, err)
	}()
	v, err = c.attempt(ctx, s, last)
	returned = true
}

// creationCtx is the context of one creation: the values of the Get that
// started it, and the cancellation of Close (stopping is a context Close
// cancels), without the caller's cancellation. It costs one small allocation,
// and what derives from it registers with a per-stripe context, not one that
// every creation of the cache locks.
type creationCtx struct {
	context.Context                 // stopping: Done, Err, Deadline
	values          context.Context // the caller's
}

// Value asks stopping first: it holds no values but the context package's
// own link to the nearest cancelable context, so contexts that Create derives
// from this one attach to stopping directly (no goroutine to watch it), and
// every other key is the caller's.
func (c creationCtx) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

// failure is one failed attempt.
type failure struct {
	attempts int
	err      error
}

// attempt calls Create, and again as long as Retry says so. A panic in Create
// or Retry ends the creation with a *PanicError. Each failed attempt is
// stored in last, if not nil, so that a timeout can report it.
func (c *Cache[K, V]) attempt(ctx context.Context, s *shard.Slot[K, V], last *atomic.Pointer[failure]) (v V, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = *new(V), &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	st := c.stats.of(unsafe.Pointer(s))
	for n := 1; ; n++ {
		st.attempts.Add(1)
		if v, err = c.create(ctx, s.Key()); err == nil {
			return v, nil
		}
		if last != nil {
			last.Store(&failure{n, err})
		}
		if ctx.Err() != nil {
			return v, ended(ctx, n, err)
		}
		if c.retry == nil {
			return v, err
		}
		wait, again := c.retry(n, err)
		if !again {
			return v, err
		}
		if !sleep(ctx, wait) {
			return v, ended(ctx, n, err)
		}
	}
}

// ended is the error of a creation whose context ended (CreateTimeout,
// Close): the context's cause, which says which, and the last attempt's
// error unless it only repeats the context's.
func ended(ctx context.Context, attempts int, last error) error {
	cause := context.Cause(ctx)
	if last == ctx.Err() || last == cause {
		return cause
	}
	return fmt.Errorf("%w (after %d attempts; last error: %w)", cause, attempts, last)
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return ctx.Err() == nil
}

// settle delivers a finished creation's outcome: to the slot and the waiters
// if the flight is still unresolved, and otherwise (a timeout or Close
// answered the waiters already) by releasing a value nobody asked for any
// more and freeing the slot.
func (c *Cache[K, V]) settle(s *shard.Slot[K, V], claim *shard.State[V], f *shard.Flight[V], v V, err error) {
	st := c.stats.of(unsafe.Pointer(s))
	if err == nil {
		st.creates.Add(1)
		st.live.Add(1)
	}
	if f.TryResolve() {
		if err == nil {
			// Publish cannot fail: Close seals the table only after every
			// creation has left the gate.
			c.table.Publish(s, claim, v)
			st.ready.Add(1)
			f.Finish(v, nil, time.Time{})
			return
		}
		st.createErrors.Add(1)
		var zero V // a failed Create's value, if any, is not kept or handed out
		if c.ttl > 0 {
			// The claim itself becomes the remembered failure.
			f.Finish(zero, err, time.Now().Add(c.ttl))
			return
		}
		s.Settle(claim, nil) // free the slot before waking the waiters
		f.Finish(zero, err, time.Time{})
		return
	}
	<-f.Done() // the party that resolved the flight may still be finishing it
	var failure *shard.State[V]
	if _, ferr := f.Result(); c.ttl > 0 {
		failure = shard.NewFailure[V](ferr, time.Now().Add(c.ttl))
	}
	s.Settle(claim, failure)
	// Released last, so that a Release that calls runtime.Goexit leaves the
	// slot settled (and run's deferred gate exit still runs).
	if err == nil {
		c.releaseQuietly(st, s.Key(), v)
	}
}
