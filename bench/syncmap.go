package bench

import (
	"context"
	"sync"
)

// syncMapCache is what Go users write today: Load; on a miss, create, then
// LoadOrStore. Racing callers each create; the losers' endpoints are released
// (a user who forgets this leaks them, as Open MPI did).
type syncMapCache[K comparable] struct {
	syncMapStore[K]
}

func newSyncMap[K comparable](env Env[K]) *syncMapCache[K] {
	return &syncMapCache[K]{syncMapStore[K]{env: env}}
}

func (c *syncMapCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	if v, ok := c.m.Load(key); ok {
		return v.(*Endpoint), nil
	}
	ep, err := c.env.Create(ctx, key)
	if err != nil {
		return nil, err
	}
	return c.store(key, ep), nil
}

// syncMapStore is a sync.Map of endpoints with the operations that give them
// up: the part syncmap and singleflight share.
type syncMapStore[K comparable] struct {
	env Env[K]
	m   sync.Map
}

// store keeps ep for key unless another endpoint got there first, in which
// case ep is released and the other returned.
func (c *syncMapStore[K]) store(key K, ep *Endpoint) *Endpoint {
	if v, loaded := c.m.LoadOrStore(key, ep); loaded {
		c.env.Release(key, ep)
		return v.(*Endpoint)
	}
	return ep
}

func (c *syncMapStore[K]) Report(key K, ep *Endpoint) bool {
	ok := c.m.CompareAndDelete(key, ep)
	if ok {
		c.env.Release(key, ep)
	}
	return ok
}

func (c *syncMapStore[K]) Invalidate(key K) bool {
	v, ok := c.m.LoadAndDelete(key)
	if ok {
		c.env.Release(key, v.(*Endpoint))
	}
	return ok
}

func (c *syncMapStore[K]) Close() error {
	c.m.Range(func(k, v any) bool {
		if _, ok := c.m.LoadAndDelete(k); ok {
			c.env.Release(k.(K), v.(*Endpoint))
		}
		return true
	})
	return nil
}
