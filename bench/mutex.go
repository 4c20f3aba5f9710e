package bench

import (
	"context"
	"sync"
)

// lockedMap is a plain map guarded by one lock: the write side of the mutex
// and rwmutex comparators.
type lockedMap[K comparable] struct {
	env  Env[K]
	lock sync.Locker
	m    map[K]*Endpoint
}

func (c *lockedMap[K]) Report(key K, ep *Endpoint) bool {
	c.lock.Lock()
	ok := c.m[key] == ep
	if ok {
		delete(c.m, key)
	}
	c.lock.Unlock()
	if ok {
		c.env.Release(key, ep)
	}
	return ok
}

func (c *lockedMap[K]) Invalidate(key K) bool {
	c.lock.Lock()
	ep, ok := c.m[key]
	delete(c.m, key)
	c.lock.Unlock()
	if ok {
		c.env.Release(key, ep)
	}
	return ok
}

func (c *lockedMap[K]) Close() error {
	c.lock.Lock()
	m := c.m
	c.m = make(map[K]*Endpoint)
	c.lock.Unlock()
	for k, ep := range m {
		c.env.Release(k, ep)
	}
	return nil
}

// createLocked is the miss path of both: with the write lock held, check
// again and create under the lock.
func (c *lockedMap[K]) createLocked(ctx context.Context, key K) (*Endpoint, error) {
	if ep, ok := c.m[key]; ok {
		return ep, nil
	}
	ep, err := c.env.Create(ctx, key)
	if err != nil {
		return nil, err
	}
	c.m[key] = ep
	return ep, nil
}

// mutexCache is a map behind one mutex, with the creation under the lock:
// exactly once, and every creation in the process serialised.
type mutexCache[K comparable] struct {
	lockedMap[K]
	mu sync.Mutex
}

func newMutex[K comparable](env Env[K]) *mutexCache[K] {
	c := &mutexCache[K]{lockedMap: lockedMap[K]{env: env, m: make(map[K]*Endpoint)}}
	c.lock = &c.mu
	return c
}

func (c *mutexCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.createLocked(ctx, key)
}
