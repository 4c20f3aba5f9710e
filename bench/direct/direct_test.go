// Package direct_test holds the benchmarks that call epcache, shard and
// the maps they are measured against directly, with no interface or closure
// between the loop and the call: the hit path, leases, the table's Load and
// the memory a million peers take. They live in the harness's module, not
// in the library's, so that a program importing epcache does not get xsync
// in its module graph.
package direct_test

import (
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

// runHit runs loop on every P; loop calls the implementation directly. Each
// goroutine starts at its own place in the keys (first), as senders to many
// peers would, rather than all in step on one key's cache line.
func runHit(b *testing.B, loop func(pb *testing.PB, first int) *endpoint) {
	b.ReportAllocs()
	var goroutines atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) { sink.Store(loop(pb, int(goroutines.Add(1)-1)*firstStride)) })
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
