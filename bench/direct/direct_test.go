// Package direct_test holds the benchmarks that call epcache, shard and
// the maps they are measured against directly, with no interface or closure
// between the loop and the call: the hit path, leases, the table's Load and
// the memory a million peers take. They live in the harness's module, not
// in the library's, so that a program importing epcache does not get xsync
// in its module graph.
package direct_test

import (
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

var sink atomic.Pointer[endpoint]

// withLifecycle sets IdleTimeout (a second: a sweep every 250 ms) and
// MaxEntries (room for every key).
func withLifecycle[K comparable](keys int) func(*epcache.Config[K, *endpoint]) {
	return func(cfg *epcache.Config[K, *endpoint]) {
		cfg.IdleTimeout, cfg.MaxEntries = time.Second, keys
	}
}

// runHit runs loop on every P, a goroutine each, as RunParallel does;
// loop calls the implementation directly. Each goroutine starts at its own
// place in the keys (first), as senders to many peers would, rather than
// all in step on one key's cache line.
//
// Its goroutines count their iterations in workers of their own, not in
// RunParallel's testing.PB: a PB is 32 bytes, written at every Next, and
// allocated by its goroutine as it starts, where several goroutines that
// start on one P get PBs side by side, so that two cores' counters share a
// cache line in some runs and not in others. A benchmark at GOMAXPROCS 2
// then ran at one of two speeds, twice as slow in the runs whose counters
// shared a line, whatever it measured (the floor of a lease included).
func runHit(b *testing.B, loop func(pb *worker, first int) *endpoint) {
	b.ReportAllocs()
	procs := runtime.GOMAXPROCS(0)
	var next atomic.Uint64
	ws := make([]*worker, procs)
	for i := range ws {
		// As RunParallel takes iterations: in grains, so that the
		// shared counter is written once per grain, not per iteration.
		ws[i] = &worker{next: &next, grain: uint64(max(1, min(10000, b.N/(100*procs)))), n: uint64(b.N)}
	}
	var wg sync.WaitGroup
	b.ResetTimer()
	for i, w := range ws {
		wg.Go(func() { sink.Store(loop(w, i*firstStride)) })
	}
	wg.Wait()
}

// worker is one of runHit's goroutines' iteration counter, as a
// testing.PB is, but a 128-byte allocation, a size class whose objects
// start on a 128-byte boundary: no two workers share a line, nor a pair of
// lines that adjacent-line prefetching moves together.
type worker struct {
	next  *atomic.Uint64 // iterations handed out, shared by the workers
	grain uint64         // taken from next at once
	cache uint64         // taken and not yet run
	n     uint64         // b.N
	_     [128 - 4*8]byte
}

// Next reports whether the worker has another iteration to run, as
// testing.PB's Next does.
func (w *worker) Next() bool {
	if w.cache == 0 {
		n := w.next.Add(w.grain)
		switch {
		case n <= w.n:
			w.cache = w.grain
		case n < w.n+w.grain:
			w.cache = w.n + w.grain - n
		default:
			return false
		}
	}
	w.cache--
	return true
}

// firstStride is how far apart in the keys runHit's goroutines start: first
// divided by it is the goroutine's index.
const firstStride = 7919

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
