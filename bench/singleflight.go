package bench

import (
	"context"
	"fmt"
	"strconv"

	"golang.org/x/sync/singleflight"
)

// singleflightCache puts a singleflight.Group in front of a sync.Map, the key
// turned into a string as users do. Callers of one creation share it, but
// none can leave on its own context, and the first caller's context is the
// creation's.
type singleflightCache[K comparable] struct {
	syncMapStore[K]
	g singleflight.Group
}

func newSingleflight[K comparable](env Env[K]) *singleflightCache[K] {
	return &singleflightCache[K]{syncMapStore: syncMapStore[K]{env: env}}
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
		return c.store(key, ep), nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Endpoint), nil
}
