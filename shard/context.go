package shard

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// flightCtx is the context of one creation ([Flight.Context]): the values of
// the context its claimer gave, and a cancellation of its own, ended by
// [Flight.Cancel]. It is made lazily: a Create that never looks at its
// context costs nothing but the flight it lives in, and the first call of
// any of its methods makes a context.WithCancelCause of the parent, to which
// that call and every later one is passed on. So Cause, AfterFunc and the
// contexts derived from it behave as with any cancelCtx, and derive from it
// without a goroutine to watch it.
// Most Creates of a cache that creates often never look at their context
// (a dial hands it to net.Dialer, a Create that finds its endpoint ready
// does not): for them an eager WithCancelCause is an allocation and a
// cancellation for nothing, on every creation.
type flightCtx struct {
	parent context.Context
	made   atomic.Value // the context.Context made from parent, once made

	mu     sync.Mutex // guards the fields below, and making made
	cancel context.CancelCauseFunc
	cause  error // of a Cancel before made was made
	ended  bool  // Cancel was called
}

// get returns the context made from parent, making it on the first call.
func (c *flightCtx) get() context.Context {
	if m := c.made.Load(); m != nil {
		return m.(context.Context)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.made.Load(); m != nil {
		return m.(context.Context)
	}
	ctx, cancel := context.WithCancelCause(c.parent)
	if c.ended {
		cancel(c.cause)
	}
	c.cancel = cancel
	c.made.Store(ctx)
	return ctx
}

func (c *flightCtx) end(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		c.cancel(cause) // the first cause stays, as with any CancelCauseFunc
		return
	}
	if !c.ended {
		c.ended, c.cause = true, cause
	}
}

func (c *flightCtx) Deadline() (time.Time, bool) { return c.get().Deadline() }
func (c *flightCtx) Done() <-chan struct{}       { return c.get().Done() }
func (c *flightCtx) Err() error                  { return c.get().Err() }
func (c *flightCtx) Value(key any) any           { return c.get().Value(key) }
func (c *flightCtx) String() string              { return "shard.Flight.Context" }
