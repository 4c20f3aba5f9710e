package direct_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epcache/epcache/internal/fixture"

	xsync3 "github.com/puzpuzpuz/xsync/v3"
	xsync4 "github.com/puzpuzpuz/xsync/v4"
)

// BenchmarkHit measures the hit path (every peer ready, 100% reads) of
// epcache beside sync.Map and xsync's maps, in one run, with each
// implementation called directly (no interface or closure between the loop
// and the call). Compare with `benchstat -col /impl`.
//
// Two sizes: 1,024 peers, whose table fits in the L1 and L2 caches, and
// 65,536, whose does not. Get is called with a live, cancelable context, as
// a request-scoped send passes (a hit never looks at it).
func BenchmarkHit(b *testing.B) {
	for _, peers := range []int{1024, 65536} {
		benchHit(b, "uint64", peers, fixture.UintKeys(peers))
		benchHit(b, "string", peers, fixture.StringKeys(peers))
	}
}

func benchHit[K comparable](b *testing.B, keyName string, peers int, keys []K) {
	eps := make([]*endpoint, len(keys))
	for i := range eps {
		eps[i] = &endpoint{peer: i}
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	mask := len(keys) - 1 // a power of two
	name := func(impl string) string {
		return "impl=" + impl + "/keys=" + keyName + "/peers=" + strconv.Itoa(peers)
	}

	b.Run(name("epcache"), func(b *testing.B) {
		c := fixture.FilledCache(b, keys, eps)
		runHit(b, func(pb *worker, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				last, _ = c.Get(ctx, keys[i&mask])
			}
			return last
		})
	})
	// The hit with IdleTimeout and MaxEntries set (issue 12): an idle
	// sweep every quarter second ages every value, whose next hit takes
	// the slow path once; the cap holds every key, so nothing is evicted.
	b.Run(name("epcache-lifecycle"), func(b *testing.B) {
		c := fixture.FilledCache(b, keys, eps, withLifecycle[K](len(keys)))
		runHit(b, func(pb *worker, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				last, _ = c.Get(ctx, keys[i&mask])
			}
			return last
		})
	})
	b.Run(name("epcache-load"), func(b *testing.B) {
		c := fixture.FilledCache(b, keys, eps)
		runHit(b, func(pb *worker, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				last, _ = c.Load(keys[i&mask])
			}
			return last
		})
	})
	b.Run(name("syncmap"), func(b *testing.B) {
		var m sync.Map
		for i, k := range keys {
			m.Store(k, eps[i])
		}
		runHit(b, func(pb *worker, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				v, _ := m.Load(keys[i&mask])
				last = v.(*endpoint)
			}
			return last
		})
	})
	b.Run(name("xsync3"), func(b *testing.B) {
		m := xsync3.NewMapOf[K, *endpoint]()
		for i, k := range keys {
			m.Store(k, eps[i])
		}
		runHit(b, func(pb *worker, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				last, _ = m.Load(keys[i&mask])
			}
			return last
		})
	})
	b.Run(name("xsync4"), func(b *testing.B) {
		m := xsync4.NewMap[K, *endpoint]()
		for i, k := range keys {
			m.Store(k, eps[i])
		}
		runHit(b, func(pb *worker, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				last, _ = m.Load(keys[i&mask])
			}
			return last
		})
	})
}

// BenchmarkLease measures a lease on a ready peer, Acquire and the Lease's
// Release around a use that loads one field of the endpoint, beside a Get
// and beside the leases users write by hand: a mutex pool with reference
// counts (Consul's markForUse and releaseConn) and xsync v4's Map of
// entries with an atomic reference count (a Load and two atomic adds,
// none of the checks a real lease needs), in one run.
//
// peers=1 is a hot peer: every goroutine leases the same endpoint, as the
// goroutines of a client talking to one server do, or the threads of an
// MPI rank talking to a neighbour. With more cores, a lease that writes
// memory shared by all of them gets slower, not faster; run it with
// -cpu 1,2 (and more) and compare ns/op across the counts.
func BenchmarkLease(b *testing.B) {
	for _, peers := range []int{1, 8, 1024} {
		keys := fixture.UintKeys(peers)
		eps := make([]*endpoint, len(keys))
		for i := range eps {
			eps[i] = &endpoint{peer: i}
		}
		ctx := context.Background()
		mask := len(keys) - 1
		name := func(impl string) string { return "impl=" + impl + "/peers=" + strconv.Itoa(peers) }
		b.Run(name("epcache-get"), func(b *testing.B) {
			c := fixture.FilledCache(b, keys, eps)
			runHit(b, func(pb *worker, first int) (last *endpoint) {
				for i := first; pb.Next(); i++ {
					last, _ = c.Get(ctx, keys[i&mask])
					use(last)
				}
				return last
			})
		})
		b.Run(name("epcache"), func(b *testing.B) {
			c := fixture.FilledCache(b, keys, eps)
			runHit(b, func(pb *worker, first int) (last *endpoint) {
				for i := first; pb.Next(); i++ {
					l, _ := c.Acquire(ctx, keys[i&mask])
					last = l.Value()
					use(last)
					l.Release()
				}
				return last
			})
		})
		// The floor of any lease built on this Get: the Get, then the two
		// locked compare-and-swaps that a lease able to tell a second
		// Release from the first must make (one to take a word of the
		// peer's own, one to give it back), and nothing else. Each
		// goroutine has words of its own, so that no core writes another's
		// (as a lease that scales must manage). At one core, its ns/op
		// divided by epcache-get's is the smallest Acquire+Release ÷ Get
		// ratio this CPU allows.
		b.Run(name("epcache-get-2cas"), func(b *testing.B) {
			c := fixture.FilledCache(b, keys, eps)
			words := make([][]paddedWord, runtime.GOMAXPROCS(0)) // runHit's goroutines, one per P
			for g := range words {
				words[g] = make([]paddedWord, len(keys))
			}
			runHit(b, func(pb *worker, first int) (last *endpoint) {
				words := words[first/firstStride]
				for i := first; pb.Next(); i++ {
					last, _ = c.Get(ctx, keys[i&mask])
					w := &words[i&mask].w
					if !w.CompareAndSwap(0, 1) {
						panic("the floor's word was taken")
					}
					use(last)
					if !w.CompareAndSwap(1, 0) {
						panic("the floor's word was given back twice")
					}
				}
				return last
			})
		})
		b.Run(name("epcache-lifecycle"), func(b *testing.B) {
			c := fixture.FilledCache(b, keys, eps, withLifecycle[uint64](len(keys)))
			runHit(b, func(pb *worker, first int) (last *endpoint) {
				for i := first; pb.Next(); i++ {
					l, _ := c.Acquire(ctx, keys[i&mask])
					last = l.Value()
					use(last)
					l.Release()
				}
				return last
			})
		})
		b.Run(name("pool"), func(b *testing.B) {
			p := newRefPool(keys, eps)
			runHit(b, func(pb *worker, first int) (last *endpoint) {
				for i := first; pb.Next(); i++ {
					k := keys[i&mask]
					last = p.acquire(k)
					use(last)
					p.release(k)
				}
				return last
			})
		})
		b.Run(name("xsync4rc"), func(b *testing.B) {
			type entry struct {
				ep   *endpoint
				refs atomic.Int64
			}
			m := xsync4.NewMap[uint64, *entry]()
			for i, k := range keys {
				m.Store(k, &entry{ep: eps[i]})
			}
			runHit(b, func(pb *worker, first int) (last *endpoint) {
				for i := first; pb.Next(); i++ {
					e, _ := m.Load(keys[i&mask])
					e.refs.Add(1)
					last = e.ep
					use(last)
					e.refs.Add(-1)
				}
				return last
			})
		})
	}
}

// use stands for a send on the endpoint: one load of a field of its own,
// which the compiler cannot drop (a negative peer panics), and no write:
// a use that wrote memory shared by every goroutine would make every
// implementation contend on it, and hide what the leases cost.
func use(ep *endpoint) {
	if ep.peer < 0 {
		panic("endpoint of a negative peer")
	}
}

// paddedWord is a word on a 128-byte line of its own, so that two peers'
// words never share a line (adjacent-line prefetch pairs 64-byte lines).
type paddedWord struct {
	w atomic.Uint64
	_ [120]byte
}

// refPool is the mutex pool with reference counts that Consul and Nomad
// write by hand (agent/pool: markForUse and releaseConn under the pool's
// one mutex), reduced to a lease of a ready endpoint.
type refPool struct {
	mu    sync.Mutex
	conns map[uint64]*refConn
}

type refConn struct {
	ep   *endpoint
	refs int
}

func newRefPool(keys []uint64, eps []*endpoint) *refPool {
	p := &refPool{conns: make(map[uint64]*refConn, len(keys))}
	for i, k := range keys {
		p.conns[k] = &refConn{ep: eps[i]}
	}
	return p
}

func (p *refPool) acquire(k uint64) *endpoint {
	p.mu.Lock()
	c := p.conns[k]
	c.refs++
	p.mu.Unlock()
	return c.ep
}

func (p *refPool) release(k uint64) {
	p.mu.Lock()
	p.conns[k].refs--
	p.mu.Unlock()
}
