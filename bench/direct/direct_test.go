// Package direct_test holds the benchmarks that call epcache, shard and
// the maps they are measured against directly, with no interface or closure
// between the loop and the call: the hit path, leases, the table's Load and
// the memory a million peers take. They live in the harness's module, not
// in the library's, so that a program importing epcache does not get xsync
// in its module graph.
package direct_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
)

// endpoint stands for a connection: values are pointers, as in a real
// messaging layer.
type endpoint struct{ peer int }

func benchUintKeys(n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i) * 0x9e3779b97f4a7c15 // not dense: no comparator gets an easy hash
	}
	return keys
}

var sink atomic.Pointer[endpoint]

// withLifecycle sets IdleTimeout (a second: a sweep every 250 ms) and
// MaxEntries (room for every key).
func withLifecycle[K comparable](keys int) func(*epcache.Config[K, *endpoint]) {
	return func(cfg *epcache.Config[K, *endpoint]) {
		cfg.IdleTimeout, cfg.MaxEntries = time.Second, keys
	}
}

// filledCache returns a cache holding eps[i] for keys[i], every key got
// twice: with MaxEntries a value starts on probation and its first hit
// takes the slow path once, once in its life, not once a measurement.
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

// heapGrowth returns how much the live heap grew across fill, measured after
// a full collection on either side.
func heapGrowth(fill func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fill()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// stormFill makes goroutines Get every key of c, each key from two
// goroutines that walk the same keys from the same start, so that they race
// for every creation, as the threads of a rank all connect at startup.
func stormFill(c *epcache.Cache[int, *endpoint], n, goroutines int) {
	var wg sync.WaitGroup
	half := goroutines / 2
	for g := range goroutines {
		wg.Go(func() {
			lane := g % half
			start := (lane * 7919) % n
			for i := range n {
				k := (start + i) % n
				if k%half != lane {
					continue
				}
				if _, err := c.Get(context.Background(), k); err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
}

// peers returns n endpoints, allocated up front so that the heap growth of
// a fill counts the structure that holds them, not the values.
func peers(n int) []endpoint {
	eps := make([]endpoint, n)
	for i := range eps {
		eps[i].peer = i
	}
	return eps
}

const millionPeers = 1_000_000
