package bench

import (
	"context"

	"github.com/epcache/epcache/epcache"
)

type epcacheCache[K comparable] struct {
	c *epcache.Cache[K, *Endpoint]
}

// newEpcache bounds the cache by Env.Cap (MaxEntries); with idle (the
// epcache-idle comparator), values unused for Env.Idle are removed as well
// (IdleTimeout).
func newEpcache[K comparable](env Env[K], idle bool) (Cache[K], error) {
	cfg := epcache.Config[K, *Endpoint]{
		Create:     env.Create,
		Release:    env.Release,
		Retry:      env.Retry,
		MaxEntries: env.Cap,
	}
	if idle {
		cfg.IdleTimeout = env.Idle
	}
	c, err := epcache.New(cfg)
	if err != nil {
		return nil, err
	}
	return epcacheCache[K]{c}, nil
}

func (e epcacheCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	return e.c.Get(ctx, key)
}

func (e epcacheCache[K]) Report(key K, ep *Endpoint) bool { return e.c.CompareAndInvalidate(key, ep) }
func (e epcacheCache[K]) Invalidate(key K) bool           { return e.c.Invalidate(key) }
func (e epcacheCache[K]) Close() error                    { return e.c.Close() }

func (e epcacheCache[K]) Lease(ctx context.Context, key K, use func(*Endpoint)) error {
	l, err := e.c.Acquire(ctx, key)
	if err != nil {
		return err
	}
	use(l.Value())
	l.Release()
	return nil
}
