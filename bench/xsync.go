package bench

import (
	"context"

	xsync3 "github.com/puzpuzpuz/xsync/v3"
)

// xsyncCache uses xsync/v3 MapOf.LoadOrTryCompute: one creation per key, made
// under the key's bucket lock, so a slow creation blocks the other keys of
// its bucket, and a failed one makes the next waiter try in turn.
type xsyncCache[K comparable] struct {
	env Env[K]
	m   *xsync3.MapOf[K, *Endpoint]
}

func newXsync[K comparable](env Env[K]) *xsyncCache[K] {
	return &xsyncCache[K]{env: env, m: xsync3.NewMapOf[K, *Endpoint]()}
}

func (c *xsyncCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	if ep, ok := c.m.Load(key); ok {
		return ep, nil
	}
	var err error
	ep, _ := c.m.LoadOrTryCompute(key, func() (*Endpoint, bool) {
		var ep *Endpoint
		ep, err = c.env.Create(ctx, key)
		return ep, err != nil
	})
	if ep == nil {
		return nil, err
	}
	return ep, nil
}

func (c *xsyncCache[K]) Report(key K, ep *Endpoint) bool {
	dropped := false
	c.m.Compute(key, func(old *Endpoint, loaded bool) (*Endpoint, bool) {
		dropped = loaded && old == ep
		return old, dropped || !loaded // delete it, or leave it as it was
	})
	if dropped {
		c.env.Release(key, ep)
	}
	return dropped
}

func (c *xsyncCache[K]) Invalidate(key K) bool {
	ep, ok := c.m.LoadAndDelete(key)
	if ok {
		c.env.Release(key, ep)
	}
	return ok
}

func (c *xsyncCache[K]) Close() error {
	c.m.Range(func(k K, _ *Endpoint) bool {
		if ep, ok := c.m.LoadAndDelete(k); ok {
			c.env.Release(k, ep)
		}
		return true
	})
	return nil
}
