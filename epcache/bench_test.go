package epcache_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	xsync3 "github.com/puzpuzpuz/xsync/v3"
	xsync4 "github.com/puzpuzpuz/xsync/v4"
)

// endpoint stands for a connection: values are pointers, as in a real
// messaging layer.
type endpoint struct{ peer int }

// benchStringKeys are n peer names and addresses of 8 to 40 bytes, as an
// MPI job, a service mesh or a broker keys its peers: ranks, host:port
// pairs, URLs.
func benchStringKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		switch i % 4 {
		case 0:
			keys[i] = "rank-" + strconv.Itoa(i) // 8 to 10 bytes
		case 1:
			keys[i] = "node-" + strconv.Itoa(i/64) + ":rank-" + strconv.Itoa(i) // 16 to 22
		case 2:
			keys[i] = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ":7000" // 13 to 18
		default:
			keys[i] = "tcp://host-" + strconv.Itoa(i) + ".cluster.local:50051" // 36 to 40
		}
	}
	return keys
}

func benchUintKeys(n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i) * 0x9e3779b97f4a7c15 // not dense: no comparator gets an easy hash
	}
	return keys
}

var sink atomic.Pointer[endpoint]

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
		benchHit(b, "uint64", peers, benchUintKeys(peers))
		benchHit(b, "string", peers, benchStringKeys(peers))
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
		c := filledCache(b, keys, eps)
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
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
		c := filledCache(b, keys, eps, withLifecycle[K](len(keys)))
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				last, _ = c.Get(ctx, keys[i&mask])
			}
			return last
		})
	})
	b.Run(name("epcache-load"), func(b *testing.B) {
		c := filledCache(b, keys, eps)
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
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
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				v, _ := m.Load(keys[i&mask])
				last = v.(*endpoint)
			}
			return last
		})
	})
	b.Run(name("xsync"), func(b *testing.B) {
		m := xsync3.NewMapOf[K, *endpoint]()
		for i, k := range keys {
			m.Store(k, eps[i])
		}
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
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
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				last, _ = m.Load(keys[i&mask])
			}
			return last
		})
	})
}

// withLifecycle sets IdleTimeout (a second: a sweep every 250 ms) and
// MaxEntries (room for every key).
func withLifecycle[K comparable](keys int) func(*epcache.Config[K, *endpoint]) {
	return func(cfg *epcache.Config[K, *endpoint]) {
		cfg.IdleTimeout, cfg.MaxEntries = time.Second, keys
	}
}

func filledCache[K comparable](b *testing.B, keys []K, eps []*endpoint, opts ...func(*epcache.Config[K, *endpoint])) *epcache.Cache[K, *endpoint] {
	byKey := make(map[K]*endpoint, len(keys))
	for i, k := range keys {
		byKey[k] = eps[i]
	}
	cfg := epcache.Config[K, *endpoint]{
		Create: func(_ context.Context, k K) (*endpoint, error) { return byKey[k], nil },
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := epcache.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	// Twice: with MaxEntries a value starts on probation (shard's
	// SetProbation), and its first hit takes the slow path once to make it
	// young. That is once in a value's life, not once a measurement: left
	// in, each run of a hit benchmark paid it for every key (at 65,536
	// peers, 15 to 25% of a 100 ms run). BenchmarkIdleSweep's hit-aged
	// measures that slow path on its own.
	for range 2 {
		for _, k := range keys {
			if _, err := c.Get(context.Background(), k); err != nil {
				b.Fatal(err)
			}
		}
	}
	return c
}

// runHit runs loop on every P; loop calls the implementation directly. Each
// goroutine starts at its own place in the keys (first), as senders to many
// peers would, rather than all in step on one key's cache line.
func runHit(b *testing.B, loop func(pb *testing.PB, first int) *endpoint) {
	b.ReportAllocs()
	var goroutines atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) { sink.Store(loop(pb, int(goroutines.Add(1)-1)*7919)) })
}

// BenchmarkIdleSweep measures what IdleTimeout costs beside the hit, per
// value held: an idle sweep (each sweep ages every value a step, and comes
// every IdleTimeout/4), and the first Get of each value after it, which an
// aged value sends down the slow path once to make it young again (hit-aged,
// beside hit-young, the same Gets with no sweep between). MaxEntries is set
// too, so that the slow path counts the use for eviction, as it does in a
// cache with both. The sweeps run here, on one goroutine, not on the timer:
// IdleTimeout is an hour.
func BenchmarkIdleSweep(b *testing.B) {
	for _, peers := range []int{1024, 65536} {
		keys := benchUintKeys(peers)
		eps := make([]*endpoint, len(keys))
		for i := range eps {
			eps[i] = &endpoint{peer: i}
		}
		ctx := context.Background()
		lifecycle := func(cfg *epcache.Config[uint64, *endpoint]) {
			cfg.IdleTimeout, cfg.MaxEntries = time.Hour, len(keys)
		}
		getAll := func(b *testing.B, c *epcache.Cache[uint64, *endpoint]) { // b: the running benchmark's, for Fatal
			for _, k := range keys {
				if _, err := c.Get(ctx, k); err != nil {
					b.Fatal(err)
				}
			}
		}
		perValue := func(b *testing.B) {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(keys)), "ns/value")
		}
		name := func(part string) string { return "impl=epcache/part=" + part + "/peers=" + strconv.Itoa(peers) }
		b.Run(name("sweep"), func(b *testing.B) {
			c := filledCache(b, keys, eps, lifecycle)
			for b.Loop() {
				epcache.SweepNow(c)
				b.StopTimer()
				getAll(b, c) // young again, or the sweeps would expire them
				b.StartTimer()
			}
			perValue(b)
		})
		b.Run(name("hit-aged"), func(b *testing.B) {
			c := filledCache(b, keys, eps, lifecycle)
			for b.Loop() {
				b.StopTimer()
				epcache.SweepNow(c)
				b.StartTimer()
				getAll(b, c)
			}
			perValue(b)
		})
		b.Run(name("hit-young"), func(b *testing.B) {
			c := filledCache(b, keys, eps, lifecycle)
			for b.Loop() {
				getAll(b, c)
			}
			perValue(b)
		})
	}
}

// BenchmarkLease measures Acquire and Release on a ready key beside Get, and
// beside xsync v4's Map of entries with a hand-written reference count (a
// Load and two atomic adds, none of the checks a real lease needs), in one
// run, at 1,024 peers. Above GOMAXPROCS 1 a lease, unlike a Get, writes a
// cache line that other goroutines' leases of the same peer write too.
func BenchmarkLease(b *testing.B) {
	keys := benchUintKeys(1024)
	eps := make([]*endpoint, len(keys))
	for i := range eps {
		eps[i] = &endpoint{peer: i}
	}
	ctx := context.Background()
	mask := len(keys) - 1
	b.Run("impl=epcache-get", func(b *testing.B) {
		c := filledCache(b, keys, eps)
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				last, _ = c.Get(ctx, keys[i&mask])
			}
			return last
		})
	})
	b.Run("impl=epcache", func(b *testing.B) {
		c := filledCache(b, keys, eps)
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				l, _ := c.Acquire(ctx, keys[i&mask])
				last = l.Value()
				l.Release()
			}
			return last
		})
	})
	b.Run("impl=epcache-lifecycle", func(b *testing.B) {
		c := filledCache(b, keys, eps, withLifecycle[uint64](len(keys)))
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				l, _ := c.Acquire(ctx, keys[i&mask])
				last = l.Value()
				l.Release()
			}
			return last
		})
	})
	b.Run("impl=xsync4rc", func(b *testing.B) {
		type entry struct {
			ep   *endpoint
			refs atomic.Int64
		}
		m := xsync4.NewMap[uint64, *entry]()
		for i, k := range keys {
			m.Store(k, &entry{ep: eps[i]})
		}
		runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
			for i := first; pb.Next(); i++ {
				e, _ := m.Load(keys[i&mask])
				e.refs.Add(1)
				last = e.ep
				e.refs.Add(-1)
			}
			return last
		})
	})
}
