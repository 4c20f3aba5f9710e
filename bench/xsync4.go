package bench

import (
	"context"

	xsync4 "github.com/puzpuzpuz/xsync/v4"
)

// xsync4Cache uses xsync/v4 Map.LoadOrCompute, today's strongest concurrent
// map; like v3 it creates under the bucket lock.
type xsync4Cache[K comparable] struct {
	*computeMapCache[K]
	m *xsync4.Map[K, *Endpoint]
}

// Get calls the map's Load directly: the hit path is the map's own.
func (c xsync4Cache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	if ep, ok := c.m.Load(key); ok {
		return ep, nil
	}
	return c.miss(ctx, key)
}

func newXsync4[K comparable](env Env[K]) xsync4Cache[K] {
	m := xsync4.NewMap[K, *Endpoint]()
	return xsync4Cache[K]{m: m, computeMapCache: &computeMapCache[K]{
		env:           env,
		loadOrCompute: m.LoadOrCompute,
		loadAndDelete: m.LoadAndDelete,
		rangeAll:      m.Range,
		compareAndDelete: func(key K, ep *Endpoint) (dropped bool) {
			m.Compute(key, func(old *Endpoint, loaded bool) (*Endpoint, xsync4.ComputeOp) {
				if dropped = loaded && old == ep; dropped {
					return nil, xsync4.DeleteOp
				}
				return old, xsync4.CancelOp
			})
			return dropped
		},
	}}
}
