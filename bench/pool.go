package bench

import (
	"context"
	"sync"
	"time"
)

// poolCache is a connection pool the way Consul's and Nomad's are written
// (agent/pool/pool.go, helper/pool/pool.go): a map behind one mutex, a
// reference count per connection taken and given back under that mutex
// (markForUse, releaseConn), a connection given up while in use closed by
// its last user (shouldClose), and first dials coalesced through a map of
// channels (limiter) so that one goroutine dials and the others wait.
//
// With Env.Idle set (the hotset workload), a reaper goroutine closes, under
// the mutex as Consul's reap does, every connection unused for Idle and
// held by nobody, looking every Idle/4 (Consul looks every second, for
// connections unused for its MaxTime, minutes). That is the pool's only
// bound: it has no cap, so it holds whatever was used within the last Idle
// to 5/4·Idle, and creations besides.
type poolCache[K comparable] struct {
	env     Env[K]
	mu      sync.Mutex
	conns   map[K]*poolConn
	limiter map[K]chan struct{}
	reaping bool          // a reaper runs: markForUse stamps lastUsed
	stop    chan struct{} // closed by Close: the reaper returns
	reaped  sync.WaitGroup
}

type poolConn struct {
	ep          *Endpoint
	refCount    int
	shouldClose bool
	lastUsed    time.Time // stamped only while a reaper runs
}

func newPool[K comparable](env Env[K]) *poolCache[K] {
	c := &poolCache[K]{env: env, conns: map[K]*poolConn{}, limiter: map[K]chan struct{}{}}
	if env.Idle > 0 {
		c.reaping, c.stop = true, make(chan struct{})
		c.reaped.Go(c.reap)
	}
	return c
}

// reap is Consul's reaper: every interval, close the connections that
// nobody holds and nobody has used for Idle.
func (c *poolCache[K]) reap() {
	t := time.NewTicker(max(c.env.Idle/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.mu.Lock()
		now := time.Now()
		for key, pc := range c.conns {
			if now.Sub(pc.lastUsed) < c.env.Idle || pc.refCount > 0 {
				continue
			}
			delete(c.conns, key)
			c.env.Release(key, pc.ep)
		}
		c.mu.Unlock()
	}
}

// acquire returns key's connection with its count raised, dialing it first
// if there is none: the pool's getNewConn.
func (c *poolCache[K]) acquire(ctx context.Context, key K) (*poolConn, error) {
	for {
		c.mu.Lock()
		if pc, ok := c.conns[key]; ok {
			pc.refCount++ // markForUse
			if c.reaping {
				pc.lastUsed = time.Now()
			}
			c.mu.Unlock()
			return pc, nil
		}
		if wait, ok := c.limiter[key]; ok {
			c.mu.Unlock()
			select {
			case <-wait: // the lead dial finished: look again
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		wait := make(chan struct{})
		c.limiter[key] = wait
		c.mu.Unlock()

		ep, err := c.env.Create(ctx, key)
		c.mu.Lock()
		delete(c.limiter, key)
		close(wait)
		if err != nil {
			c.mu.Unlock()
			return nil, err
		}
		pc := &poolConn{ep: ep, refCount: 1}
		if c.reaping {
			pc.lastUsed = time.Now()
		}
		c.conns[key] = pc
		c.mu.Unlock()
		return pc, nil
	}
}

// releaseConn gives a use back, closing a connection given up meanwhile
// once its last user is done.
func (c *poolCache[K]) releaseConn(key K, pc *poolConn) {
	c.mu.Lock()
	pc.refCount--
	closeIt := pc.refCount == 0 && pc.shouldClose
	c.mu.Unlock()
	if closeIt {
		c.env.Release(key, pc.ep)
	}
}

// Get is acquire and releaseConn at once: the endpoint is not held.
func (c *poolCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	pc, err := c.acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	c.releaseConn(key, pc)
	return pc.ep, nil
}

func (c *poolCache[K]) Lease(ctx context.Context, key K, use func(*Endpoint)) error {
	pc, err := c.acquire(ctx, key)
	if err != nil {
		return err
	}
	use(pc.ep)
	c.releaseConn(key, pc)
	return nil
}

// drop gives up key's connection if match says so: closed now if nobody
// uses it, by its last user otherwise.
func (c *poolCache[K]) drop(key K, match func(*Endpoint) bool) bool {
	c.mu.Lock()
	pc, ok := c.conns[key]
	if !ok || !match(pc.ep) {
		c.mu.Unlock()
		return false
	}
	delete(c.conns, key)
	pc.shouldClose = true
	closeIt := pc.refCount == 0
	c.mu.Unlock()
	if closeIt {
		c.env.Release(key, pc.ep)
	}
	return true
}

func (c *poolCache[K]) Report(key K, ep *Endpoint) bool {
	return c.drop(key, func(held *Endpoint) bool { return held == ep })
}

func (c *poolCache[K]) Invalidate(key K) bool {
	return c.drop(key, func(*Endpoint) bool { return true })
}

func (c *poolCache[K]) Close() error {
	if c.reaping {
		close(c.stop)
		c.reaped.Wait()
	}
	c.mu.Lock()
	var keys []K
	for k := range c.conns {
		keys = append(keys, k)
	}
	c.mu.Unlock()
	for _, k := range keys {
		c.Invalidate(k)
	}
	return nil
}
