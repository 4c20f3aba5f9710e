package bench

import (
	"context"
	"sync/atomic"
)

// arrayCache is the physical floor for dense integer peers: a slice of atomic
// pointers indexed by peer number. A hit is one load and one comparison; a
// miss claims the slot by CAS and parks the others on a channel, like
// epcache without the hash table (and without timeouts, retries or Close
// semantics).
type arrayCache[K comparable] struct {
	env   Env[K]
	slots []atomic.Pointer[arraySlot[K]]
}

// arraySlot is ready when done is nil; otherwise a creation is in flight and
// ep, err are set before done is closed.
type arraySlot[K comparable] struct {
	key  K
	ep   *Endpoint
	err  error
	done chan struct{}
}

func newArray[K comparable](env Env[K]) *arrayCache[K] {
	return &arrayCache[K]{env: env, slots: make([]atomic.Pointer[arraySlot[K]], env.Peers)}
}

func (c *arrayCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	slot := &c.slots[c.env.Index(key)]
	if s := slot.Load(); s != nil && s.done == nil {
		return s.ep, nil
	}
	for {
		s := slot.Load()
		switch {
		case s == nil:
			claim := &arraySlot[K]{done: make(chan struct{})}
			if !slot.CompareAndSwap(nil, claim) {
				continue
			}
			ep, err := c.env.Create(ctx, key)
			claim.ep, claim.err = ep, err
			if err == nil {
				slot.Store(&arraySlot[K]{key: key, ep: ep})
			} else {
				slot.Store(nil)
			}
			close(claim.done)
			return ep, err
		case s.done == nil:
			return s.ep, nil
		default:
			select {
			case <-s.done:
				if s.err != nil {
					return nil, s.err
				}
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
}

func (c *arrayCache[K]) Report(key K, ep *Endpoint) bool {
	slot := &c.slots[c.env.Index(key)]
	s := slot.Load()
	if s == nil || s.done != nil || s.ep != ep || !slot.CompareAndSwap(s, nil) {
		return false
	}
	c.env.Release(key, ep)
	return true
}

func (c *arrayCache[K]) Invalidate(key K) bool {
	slot := &c.slots[c.env.Index(key)]
	for {
		s := slot.Load()
		if s == nil || s.done != nil {
			return false
		}
		if slot.CompareAndSwap(s, nil) {
			c.env.Release(key, s.ep)
			return true
		}
	}
}

func (c *arrayCache[K]) Close() error {
	for i := range c.slots {
		if s := c.slots[i].Swap(nil); s != nil && s.done == nil {
			c.env.Release(s.key, s.ep)
		}
	}
	return nil
}
