package bench

import (
	"context"

	"github.com/epcache/epcache/epcache"
)

// Watch, if set, is called with every cache the epcache comparators build
// (an *epcache.Cache[uint64, *Endpoint] or *epcache.Cache[string,
// *Endpoint]) before a workload uses it, and the function it returns, if
// not nil, once the cache's Close has returned: epbench -debug shows the
// caches of the runs on its debug page this way. Set it before the runs
// begin and leave it during them; it may be called from several goroutines
// at once.
var Watch func(cache any) (unwatch func())

type epcacheCache[K comparable] struct {
	c       *epcache.Cache[K, *Endpoint]
	unwatch func() // Watch's, or nil
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
	e := epcacheCache[K]{c: c}
	if Watch != nil {
		e.unwatch = Watch(c)
	}
	return e, nil
}

func (e epcacheCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	return e.c.Get(ctx, key)
}

func (e epcacheCache[K]) Report(key K, ep *Endpoint) bool { return e.c.CompareAndInvalidate(key, ep) }
func (e epcacheCache[K]) Invalidate(key K) bool           { return e.c.Invalidate(key) }
func (e epcacheCache[K]) Close() error {
	err := e.c.Close()
	if e.unwatch != nil {
		e.unwatch()
	}
	return err
}

func (e epcacheCache[K]) Lease(ctx context.Context, key K, use func(*Endpoint)) error {
	l, err := e.c.Acquire(ctx, key)
	if err != nil {
		return err
	}
	use(l.Value())
	l.Release()
	return nil
}
