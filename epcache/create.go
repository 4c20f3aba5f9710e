package epcache

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/epcache/epcache/shard"
)

// valuesOf returns ctx's values without its cancellation: the parent of a
// creation's context (shard.Flight.Context), which ends only when Create
// returns, or by CreateTimeout or Close.
func valuesOf(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx // nothing to take away, and nothing to allocate
	}
	return context.WithoutCancel(ctx)
}

// run is one creation, in the context of its flight. It runs on the
// goroutine of the Get that claimed the slot when that Get can never leave
// (its context has no Done channel), and otherwise on a goroutine of its
// own, so that the Get can leave on its own context while the creation goes
// on for the others.
//
// The flight is resolved exactly once, by whichever comes first: the outcome
// of the attempts, or the end of a CreateTimeout, which answers the waiters
// even if Create ignores its context. (Close needs no such hook: it answers
// the waiters itself.) The slot is settled only when the creation really
// ends, so no second creation of the key can overlap this one.
func (c *Cache[K, V]) run(s *shard.Slot[K, V], claim *shard.State[V], f *shard.Flight[V]) {
	defer c.stats.of(unsafe.Pointer(s)).gate.exit()
	start := shard.Nanotime()
	ctx := f.Context()
	var last *atomic.Pointer[failure] // the latest failed attempt, for the timeout's error
	stopAbandon := func() bool { return false }
	if c.timeout > 0 {
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
		// The creation's context ends when Create returns, as a context
		// passed to a call does, and before anybody hears of the outcome.
		f.Cancel(context.Canceled)
		f.MarkReturned() // a slot Straggling on this creation (see Offer) may be cleared
		if !returned {
			err = ErrGoexit
		}
		// One reading of the clock for the creation's latency and its
		// value's publication, which follows at once.
		end := shard.Nanotime()
		outcome := c.settle(s, claim, f, v, err, end)
		c.latency.create[outcome].record(time.Duration(end - start))
	}()
	v, err = c.attempt(ctx, s, last)
	returned = true
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
		if v, err = c.attemptOnce(ctx, s.Key()); err == nil {
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

// attemptOnce is one call of Create. With Retry set, the call gets a context
// of its own that ends when it returns, as a context passed to a call does,
// so that nothing the call bound to it lives on into the backoff and the
// next attempt. Without Retry, the creation's context ends when the one
// call returns (run), and no second context is needed.
func (c *Cache[K, V]) attemptOnce(ctx context.Context, key K) (V, error) {
	if c.retry == nil {
		return c.create(ctx, key)
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	return c.create(actx, key)
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
// if the flight is still unresolved, and otherwise (a timeout answered the
// waiters already, or an Offer did) by releasing a value nobody asked for
// any more and settling the slot. It returns how the creation ended, for
// Stats.CreateLatency. now is the time (shard.Nanotime) its Create
// returned.
func (c *Cache[K, V]) settle(s *shard.Slot[K, V], claim *shard.State[V], f *shard.Flight[V], v V, err error, now int64) Outcome {
	st := c.stats.of(unsafe.Pointer(s))
	if err == nil {
		st.creates.Add(1)
	}
	if f.TryResolve() {
		if err == nil {
			s.LeaseFor(f, c) // an Acquire that claimed: leased before anyone can invalidate
			c.publish(s, claim, f, v, now)
			return OutcomeValue
		}
		st.createErrors.Add(1)
		c.putRoom() // no value: the creation's room comes back
		var zero V  // a failed Create's value, if any, is not kept or handed out
		// Settle the slot before waking the waiters: free, or answering
		// the error for ErrorTTL. A failure state of its own, not the
		// claim, is remembered: the claim's flight holds the creation's
		// context, and through it the values of the caller's.
		var failure *shard.State[V]
		if c.ttl > 0 {
			failure = shard.NewFailure[V](err, time.Now().Add(c.ttl))
		}
		s.Settle(claim, failure)
		f.Finish(zero, err, time.Time{})
		var pe *PanicError
		if errors.As(err, &pe) || err == ErrGoexit {
			return OutcomePanic
		}
		return OutcomeError
	}
	<-f.Done() // the party that resolved the flight may still be finishing it
	var failure *shard.State[V]
	outcome := OutcomeOffered
	if _, ferr := f.Result(); ferr != nil {
		outcome = OutcomeTimeout
		if c.ttl > 0 {
			failure = shard.NewFailure[V](ferr, time.Now().Add(c.ttl))
		}
	}
	// An Offer that answered the flight has made the claim Ready already:
	// then this changes nothing.
	s.Settle(claim, failure)
	// Released last, so that a Release that calls runtime.Goexit leaves the
	// slot settled (and run's deferred gate exit still runs).
	if err == nil {
		c.releaseQuietly(st, s.Key(), v) // its room comes back
	} else {
		c.putRoom()
	}
	return outcome
}

// publish makes v the value of s, which the caller claimed (claim), and
// answers f's waiters with it. It cannot fail: Close seals the table only
// after every creation and Offer has left its gate, and the caller is
// inside one. now is the time of the publication (shard.Nanotime).
func (c *Cache[K, V]) publish(s *shard.Slot[K, V], claim *shard.State[V], f *shard.Flight[V], v V, now int64) {
	if c.room != nil {
		c.room.track(s, c, now) // before v can leave the cache, which clears the handle
	}
	c.table.Publish(s, claim, v)
	c.stats.of(unsafe.Pointer(s)).ready.Add(1)
	f.Finish(v, nil, time.Time{})
	c.armSweep()
	c.kick() // a waiter for room may evict v, or another
}

// putRoom gives back the room of a creation that made no value.
func (c *Cache[K, V]) putRoom() {
	if c.room != nil {
		c.room.put()
	}
}
