package bench

import (
	"context"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// lruCache is hashicorp/golang-lru v2's LRU behind one mutex, as its own
// lru.Cache is (simplelru under a lock, eviction callbacks run once the
// lock is let go): a Get that misses lets go of the lock, creates, then
// takes the lock again and adds the endpoint unless another Get added one
// meanwhile (lru.Cache.PeekOrAdd), in which case it releases its own. The
// creation is outside the lock because that is what the typical user
// writes (Get; on a miss, dial; Add) and what PeekOrAdd exists for: a dial
// under the lock would stop every sender in the process for its duration.
// So two Gets of a missing key may both create, and the cache holds at most
// Env.Cap endpoints, plus those being created, plus those evicted whose
// release has not returned. An eviction releases the endpoint at once, used
// or not: the LRU has no lease.
type lruCache[K comparable] struct {
	env     Env[K]
	mu      sync.Mutex
	lru     *simplelru.LRU[K, *Endpoint]
	evicted []lruEvicted[K] // filled by the callback under mu, released after it
}

type lruEvicted[K comparable] struct {
	key K
	ep  *Endpoint
}

func newLRU[K comparable](env Env[K]) (*lruCache[K], error) {
	size := env.Cap
	if size == 0 {
		size = max(env.Peers, 1) // no bound asked for: room for every peer
	}
	c := &lruCache[K]{env: env}
	l, err := simplelru.NewLRU(size, func(key K, ep *Endpoint) {
		c.evicted = append(c.evicted, lruEvicted[K]{key, ep})
	})
	if err != nil {
		return nil, err
	}
	c.lru = l
	return c, nil
}

// unlock lets go of mu and releases what was evicted under it.
func (c *lruCache[K]) unlock() {
	if len(c.evicted) == 0 {
		c.mu.Unlock()
		return
	}
	evicted := c.evicted
	c.evicted = nil
	c.mu.Unlock()
	for _, e := range evicted {
		c.env.Release(e.key, e.ep)
	}
}

func (c *lruCache[K]) Get(ctx context.Context, key K) (*Endpoint, error) {
	c.mu.Lock()
	ep, ok := c.lru.Get(key)
	c.mu.Unlock()
	if ok {
		return ep, nil
	}
	ep, err := c.env.Create(ctx, key)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if held, ok := c.lru.Peek(key); ok {
		c.mu.Unlock()
		c.env.Release(key, ep) // another Get's endpoint came first
		return held, nil
	}
	c.lru.Add(key, ep)
	c.unlock()
	return ep, nil
}

func (c *lruCache[K]) Report(key K, ep *Endpoint) bool {
	c.mu.Lock()
	held, ok := c.lru.Peek(key)
	ok = ok && held == ep
	if ok {
		c.lru.Remove(key)
	}
	c.unlock()
	return ok
}

func (c *lruCache[K]) Invalidate(key K) bool {
	c.mu.Lock()
	ok := c.lru.Remove(key)
	c.unlock()
	return ok
}

func (c *lruCache[K]) Close() error {
	c.mu.Lock()
	c.lru.Purge()
	c.unlock()
	return nil
}
