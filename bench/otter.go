package bench

import (
	"context"
	"sync"

	"github.com/maypok86/otter/v2"
)

// otterCache is otter v2 the way its documentation offers it to an
// endpoint cache: Cache.Get with a Loader that creates the endpoint
// (otter coalesces concurrent loads of a key), MaximumSize = Env.Cap (its
// W-TinyLFU policy evicts past it, "temporarily exceeding the threshold
// while evicting") and an OnDeletion handler that releases whatever leaves
// the cache. Handlers run on otter's Executor, goroutines by default; this
// one counts them so that Close can wait for the last release. otter has no
// lease: an endpoint Get returned may be evicted, and released, while its
// caller still uses it. Nor is it exactly once: an Invalidate while a key
// loads discards the load, and the next Get loads again.
type otterCache[K comparable] struct {
	env   Env[K]
	c     *otter.Cache[K, *Endpoint]
	tasks sync.WaitGroup // otter's deletion handlers and maintenance, run on goroutines
}

func newOtter[K comparable](env Env[K]) (*otterCache[K], error) {
	o := &otterCache[K]{env: env}
	c, err := otter.New(&otter.Options[K, *Endpoint]{
		MaximumSize:     env.Cap, // 0: no bound
		InitialCapacity: env.Cap,
		OnDeletion:      func(e otter.DeletionEvent[K, *Endpoint]) { env.Release(e.Key, e.Value) },
		// otter's default executor, go fn(), with a count: every task is
		// submitted by a caller of the cache or by another task, so the
		// count never rises from zero while Close waits.
		Executor: func(fn func()) {
			o.tasks.Go(fn)
		},
	})
	if err != nil {
		return nil, err
	}
	o.c = c
	return o, nil
}

func (o *otterCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	// The hit, as otter.Cache.Get serves it, without building a loader.
	if ep, ok := o.c.GetIfPresent(key); ok {
		return ep, nil
	}
	// A load that a write or an invalidation of the key overtakes is
	// discarded: Get returns the key's value then, or loads again. A
	// discarded value never entered the cache, so no deletion event
	// releases it; the caller must, as a user whose values are
	// connections must close them.
	var made []*Endpoint
	ep, err := o.c.Get(ctx, key, otter.LoaderFunc[K, *Endpoint](func(ctx context.Context, key K) (*Endpoint, error) {
		ep, err := o.env.Create(ctx, key)
		if err == nil {
			made = append(made, ep)
		}
		return ep, err
	}))
	for _, m := range made {
		if m != ep {
			o.env.Release(key, m)
		}
	}
	return ep, err
}

func (o *otterCache[K]) Report(key K, ep *Endpoint) bool {
	dropped := false
	o.c.ComputeIfPresent(key, func(held *Endpoint) (*Endpoint, otter.ComputeOp) {
		if held != ep {
			return held, otter.CancelOp
		}
		dropped = true
		return held, otter.InvalidateOp
	})
	return dropped
}

func (o *otterCache[K]) Invalidate(key K) bool {
	_, ok := o.c.Invalidate(key)
	return ok
}

// Close invalidates every entry and waits for the deletion handlers.
func (o *otterCache[K]) Close() error {
	o.c.InvalidateAll()
	o.c.StopAllGoroutines()
	o.tasks.Wait()
	return nil
}
