package bench

import (
	"context"
	"sync"
)

// syncMapCache is what Go users write today: Load; on a miss, create, then
// LoadOrStore. Racing callers each create; the losers' endpoints are released
// (a user who forgets this leaks them, as Open MPI did).
type syncMapCache[K comparable] struct {
	env Env[K]
	m   sync.Map
}

func newSyncMap[K comparable](env Env[K]) *syncMapCache[K] { return &syncMapCache[K]{env: env} }

func (c *syncMapCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	if v, ok := c.m.Load(key); ok {
		return v.(*Endpoint), nil
	}
	ep, err := c.env.Create(ctx, key)
	if err != nil {
		return nil, err
	}
	if v, loaded := c.m.LoadOrStore(key, ep); loaded {
		c.env.Release(key, ep)
		return v.(*Endpoint), nil
	}
	return ep, nil
}

func (c *syncMapCache[K]) Report(key K, ep *Endpoint) bool {
	ok := c.m.CompareAndDelete(key, ep)
	if ok {
		c.env.Release(key, ep)
	}
	return ok
}

func (c *syncMapCache[K]) Invalidate(key K) bool {
	v, ok := c.m.LoadAndDelete(key)
	if ok {
		c.env.Release(key, v.(*Endpoint))
	}
	return ok
}

func (c *syncMapCache[K]) Close() error {
	return releaseSyncMap(&c.m, c.env.Release)
}

// releaseSyncMap empties m, releasing every endpoint it held.
func releaseSyncMap[K comparable](m *sync.Map, release func(K, *Endpoint)) error {
	m.Range(func(k, v any) bool {
		if _, ok := m.LoadAndDelete(k); ok {
			release(k.(K), v.(*Endpoint))
		}
		return true
	})
	return nil
}
