package bench

import (
	"context"
	"sync/atomic"

	xsync4 "github.com/puzpuzpuz/xsync/v4"
)

// xsync4rcCache is xsync/v4's Map of reference-counted entries, the lease a
// user writes by hand around today's fastest map: a hit loads the entry and
// raises its count; an entry given up is marked gone, and whoever brings the
// count of a gone entry to zero releases it, claiming the release with a
// CAS (rcDone). The claim is not optional: a holder that raises the count
// of an entry already released, sees gone and lowers it again also brings
// a gone count to zero. The first version of this file, without it,
// released endpoints twice in TestEveryComparatorIsCorrect.
type xsync4rcCache[K comparable] struct {
	env Env[K]
	m   *xsync4.Map[K, *rcEntry]
}

type rcEntry struct {
	ep   *Endpoint
	refs atomic.Int64 // holders, | rcGone once the entry left the map
}

const (
	rcGone = 1 << 62 // the entry has left the map
	rcDone = 1 << 61 // its endpoint has been released
)

// releaseIfLast releases e's endpoint if e is gone, unheld and not yet
// released.
func (c *xsync4rcCache[K]) releaseIfLast(key K, e *rcEntry) {
	if e.refs.CompareAndSwap(rcGone, rcGone|rcDone) {
		c.env.Release(key, e.ep)
	}
}

func newXsync4rc[K comparable](env Env[K]) *xsync4rcCache[K] {
	return &xsync4rcCache[K]{env: env, m: xsync4.NewMap[K, *rcEntry]()}
}

// hold returns key's entry with its count raised, creating it (under the
// bucket lock, as LoadOrCompute does) if there is none.
func (c *xsync4rcCache[K]) hold(ctx context.Context, key K) (*rcEntry, error) {
	for {
		e, ok := c.m.Load(key)
		if !ok {
			var err error
			e, _ = c.m.LoadOrCompute(key, func() (*rcEntry, bool) {
				ep, cerr := c.env.Create(ctx, key)
				if cerr != nil {
					err = cerr
					return nil, true // cancel: store nothing
				}
				return &rcEntry{ep: ep}, false
			})
			if err != nil {
				return nil, err
			}
			if e == nil {
				continue
			}
		}
		if e.refs.Add(1)&rcGone == 0 {
			return e, nil
		}
		c.unhold(key, e) // gone meanwhile: look again
	}
}

func (c *xsync4rcCache[K]) unhold(key K, e *rcEntry) {
	if e.refs.Add(-1) == rcGone {
		c.releaseIfLast(key, e)
	}
}

func (c *xsync4rcCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	if e, ok := c.m.Load(key); ok {
		return e.ep, nil // a hit does not hold
	}
	e, err := c.hold(ctx, key)
	if err != nil {
		return nil, err
	}
	c.unhold(key, e)
	return e.ep, nil
}

func (c *xsync4rcCache[K]) Lease(ctx context.Context, key K, use func(*Endpoint)) error {
	e, err := c.hold(ctx, key)
	if err != nil {
		return err
	}
	use(e.ep)
	c.unhold(key, e)
	return nil
}

// drop removes key's entry if match says so and marks it gone, releasing it
// if nobody holds it.
func (c *xsync4rcCache[K]) drop(key K, match func(*Endpoint) bool) bool {
	var dropped *rcEntry
	c.m.Compute(key, func(old *rcEntry, loaded bool) (*rcEntry, xsync4.ComputeOp) {
		if loaded && match(old.ep) {
			dropped = old
			return nil, xsync4.DeleteOp
		}
		return old, xsync4.CancelOp
	})
	if dropped == nil {
		return false
	}
	dropped.refs.Or(rcGone)
	c.releaseIfLast(key, dropped)
	return true
}

func (c *xsync4rcCache[K]) Report(key K, ep *Endpoint) bool {
	return c.drop(key, func(held *Endpoint) bool { return held == ep })
}

func (c *xsync4rcCache[K]) Invalidate(key K) bool {
	return c.drop(key, func(*Endpoint) bool { return true })
}

func (c *xsync4rcCache[K]) Close() error {
	c.m.Range(func(k K, _ *rcEntry) bool {
		c.Invalidate(k)
		return true
	})
	return nil
}
