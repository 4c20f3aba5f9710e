package bench

import (
	"context"
	"sync"
)

// rwmutexCache reads under RLock; on a miss it takes the write lock, checks
// again and creates under it.
type rwmutexCache[K comparable] struct {
	lockedMap[K]
	mu sync.RWMutex
}

func newRWMutex[K comparable](env Env[K]) *rwmutexCache[K] {
	c := &rwmutexCache[K]{lockedMap: lockedMap[K]{env: env, m: make(map[K]*Endpoint)}}
	c.lock = &c.mu
	return c
}

func (c *rwmutexCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	c.mu.RLock()
	ep, ok := c.m[key]
	c.mu.RUnlock()
	if ok {
		return ep, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.createLocked(ctx, key)
}
