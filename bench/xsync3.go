package bench

import (
	"context"

	xsync3 "github.com/puzpuzpuz/xsync/v3"
)

// xsync3Cache uses xsync/v3 MapOf.LoadOrTryCompute: one creation per key, made
// under the key's bucket lock, so a slow creation blocks the other keys of
// its bucket, and a failed one makes the next waiter try in turn.
type xsync3Cache[K comparable] struct {
	*computeMapCache[K]
	m *xsync3.MapOf[K, *Endpoint]
}

// Get calls the map's Load directly: the hit path is the map's own.
func (c xsync3Cache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	if ep, ok := c.m.Load(key); ok {
		return ep, nil
	}
	return c.miss(ctx, key)
}

func newXsync3[K comparable](env Env[K]) xsync3Cache[K] {
	m := xsync3.NewMapOf[K, *Endpoint]()
	return xsync3Cache[K]{m: m, computeMapCache: &computeMapCache[K]{
		env:           env,
		loadOrCompute: m.LoadOrTryCompute,
		loadAndDelete: m.LoadAndDelete,
		rangeAll:      m.Range,
		compareAndDelete: func(key K, ep *Endpoint) (dropped bool) {
			m.Compute(key, func(old *Endpoint, loaded bool) (*Endpoint, bool) {
				dropped = loaded && old == ep
				return old, dropped || !loaded // delete it, or leave it as it was
			})
			return dropped
		},
	}}
}

// computeMapCache is what the comparators over a map with a load-or-compute
// that holds a lock while it computes share: xsync v3's MapOf and v4's Map,
// whose methods have the same shapes. Their hit paths call the maps
// directly; everything here is off the hit path.
type computeMapCache[K comparable] struct {
	env              Env[K]
	loadOrCompute    func(K, func() (*Endpoint, bool)) (*Endpoint, bool)
	loadAndDelete    func(K) (*Endpoint, bool)
	rangeAll         func(func(K, *Endpoint) bool)
	compareAndDelete func(K, *Endpoint) bool
}

// miss creates key's endpoint under the map's lock, unless it is there.
func (c *computeMapCache[K]) miss(ctx context.Context, key K) (*Endpoint, error) {
	var err error
	ep, _ := c.loadOrCompute(key, func() (*Endpoint, bool) {
		var ep *Endpoint
		ep, err = c.env.Create(ctx, key)
		return ep, err != nil // cancel on error: nothing is stored
	})
	if ep == nil {
		return nil, err
	}
	return ep, nil
}

func (c *computeMapCache[K]) Report(key K, ep *Endpoint) bool {
	dropped := c.compareAndDelete(key, ep)
	if dropped {
		c.env.Release(key, ep)
	}
	return dropped
}

func (c *computeMapCache[K]) Invalidate(key K) bool {
	ep, ok := c.loadAndDelete(key)
	if ok {
		c.env.Release(key, ep)
	}
	return ok
}

func (c *computeMapCache[K]) Close() error {
	c.rangeAll(func(k K, _ *Endpoint) bool {
		if ep, ok := c.loadAndDelete(k); ok {
			c.env.Release(k, ep)
		}
		return true
	})
	return nil
}
