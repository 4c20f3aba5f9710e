package bench

import (
	"context"

	xsync4 "github.com/puzpuzpuz/xsync/v4"
)

// xsync4Cache uses xsync/v4 Map.LoadOrCompute, today's strongest concurrent
// map; like v3 it creates under the bucket lock.
type xsync4Cache[K comparable] struct {
	env Env[K]
	m   *xsync4.Map[K, *Endpoint]
}

func newXsync4[K comparable](env Env[K]) *xsync4Cache[K] {
	return &xsync4Cache[K]{env: env, m: xsync4.NewMap[K, *Endpoint]()}
}

func (c *xsync4Cache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	if ep, ok := c.m.Load(key); ok {
		return ep, nil
	}
	var err error
	ep, _ := c.m.LoadOrCompute(key, func() (*Endpoint, bool) {
		var ep *Endpoint
		ep, err = c.env.Create(ctx, key)
		return ep, err != nil
	})
	if ep == nil {
		return nil, err
	}
	return ep, nil
}

func (c *xsync4Cache[K]) Report(key K, ep *Endpoint) bool {
	dropped := false
	c.m.Compute(key, func(old *Endpoint, loaded bool) (*Endpoint, xsync4.ComputeOp) {
		if dropped = loaded && old == ep; dropped {
			return nil, xsync4.DeleteOp
		}
		return old, xsync4.CancelOp
	})
	if dropped {
		c.env.Release(key, ep)
	}
	return dropped
}

func (c *xsync4Cache[K]) Invalidate(key K) bool {
	ep, ok := c.m.LoadAndDelete(key)
	if ok {
		c.env.Release(key, ep)
	}
	return ok
}

func (c *xsync4Cache[K]) Close() error {
	c.m.Range(func(k K, _ *Endpoint) bool {
		if ep, ok := c.m.LoadAndDelete(k); ok {
			c.env.Release(k, ep)
		}
		return true
	})
	return nil
}
