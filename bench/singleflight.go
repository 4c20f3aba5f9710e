package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"golang.org/x/sync/singleflight"
)

// singleflightCache puts a singleflight.Group in front of a sync.Map, the key
// turned into a string as users do. Callers of one creation share it, but
// none can leave on its own context, and the first caller's context is the
// creation's.
type singleflightCache[K comparable] struct {
	env Env[K]
	g   singleflight.Group
	m   sync.Map
}

func newSingleflight[K comparable](env Env[K]) *singleflightCache[K] {
	return &singleflightCache[K]{env: env}
}

func flightKey[K comparable](key K) string {
	switch k := any(key).(type) {
	case string:
		return k
	case uint64:
		return strconv.FormatUint(k, 10)
	}
	return fmt.Sprint(key)
}

func (c *singleflightCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	if v, ok := c.m.Load(key); ok {
		return v.(*Endpoint), nil
	}
	v, err, _ := c.g.Do(flightKey(key), func() (any, error) {
		// A flight that ended just before this one started stored its endpoint.
		if v, ok := c.m.Load(key); ok {
			return v, nil
		}
		ep, err := c.env.Create(ctx, key)
		if err != nil {
			return nil, err
		}
		if v, loaded := c.m.LoadOrStore(key, ep); loaded {
			c.env.Release(key, ep)
			return v, nil
		}
		return ep, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Endpoint), nil
}

func (c *singleflightCache[K]) Report(key K, ep *Endpoint) bool {
	ok := c.m.CompareAndDelete(key, ep)
	if ok {
		c.env.Release(key, ep)
	}
	return ok
}

func (c *singleflightCache[K]) Invalidate(key K) bool {
	v, ok := c.m.LoadAndDelete(key)
	if ok {
		c.env.Release(key, v.(*Endpoint))
	}
	return ok
}

func (c *singleflightCache[K]) Close() error { return releaseSyncMap(&c.m, c.env.Release) }
