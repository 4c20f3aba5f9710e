package bench

import (
	"context"
	"runtime"
)

// Leaser is a Cache that can hold an endpoint while it is used, so that no
// Invalidate or Report closes it under the use: epcache's Acquire and
// Lease.Release, the pool's reference counts, xsync4rc's counter. The lease
// workload runs the comparators that implement it.
type Leaser[K comparable] interface {
	Cache[K]
	// Lease gets key's endpoint (creating it if there is none), holds it
	// while use runs, then lets it go. An endpoint given up meanwhile is
	// released once no lease holds it.
	Lease(ctx context.Context, key K, use func(*Endpoint)) error
}

// use is what the lease workload does with a leased endpoint: it reads it,
// and reports whether it was released by then, a release under the lease,
// which the caller counts (Ledger.countReleasedInUse). It writes nothing,
// as a send writes nothing of the cache's: on a hot peer (-peers 1) a
// counter that every use wrote would be the line the cores contend for,
// whatever the lease.
func use(ep *Endpoint) (released bool) {
	_ = ep.Peer
	return ep.released.Load() != 0
}

// useBriefly is the hotset workload's use: use's marks around one yield of
// the processor, as a send whose write blocks for a moment yields it. A
// release that another goroutine makes meanwhile (an eviction, a
// deletion handler) is counted by the ledger as a release in use.
func useBriefly(ep *Endpoint) {
	ep.using.Add(1)
	runtime.Gosched()
	_ = ep.Peer
	ep.using.Add(-1)
}
