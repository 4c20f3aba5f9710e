// Package bench is epcache's benchmark harness: the same endpoint-cache
// workloads run against epcache and the implementations Go users write today,
// behind one small interface, [Cache], with a [Ledger] that counts every
// endpoint created and released so that leaks and duplicates are measured,
// not assumed.
//
// # Comparators
//
// One file each (see [Impls]): mutex (a map behind one sync.Mutex, creation
// under the lock), rwmutex (RLock fast path, then Lock, double-check, create
// under the lock), syncmap (sync.Map.Load, on a miss create, then
// LoadOrStore, releasing the loser: what users write today), singleflight
// (golang.org/x/sync/singleflight in front of a sync.Map, the key turned into
// a string), xsync (xsync/v3 MapOf.LoadOrTryCompute, which holds a bucket
// lock while creating), xsync4 (xsync/v4 Map.LoadOrCompute), epcache, and
// array (a dense slice of atomic pointers indexed by peer number, claimed by
// CAS: the physical floor for dense integer peers; workloads with string
// keys skip it). Two more are written for the lease workload (see
// [Leaser]): pool, a connection pool the way Consul's and Nomad's are (a map
// and reference counts behind one mutex, first dials coalesced through
// channels, a connection given up in use closed by its last user), and
// xsync4rc (xsync/v4's Map of entries with a hand-written reference count
// and gone bit, released by whoever claims the release by CAS). Three more
// are written for the hotset workload, beside epcache under MaxEntries and
// the pool, whose reaper closes connections unused for Spec.Idle as
// Consul's does: epcache-idle (epcache with IdleTimeout too), otter
// (otter/v2's Cache.Get with a Loader, MaximumSize, and an OnDeletion
// handler that releases) and lru (hashicorp/golang-lru/v2's LRU behind one
// mutex, creating outside it, releasing what it evicts). Every comparator
// releases what it gives up, duplicates included, so that a leak is a bug
// in a comparator, never a choice.
//
// # Workloads
//
//   - hit: every peer ready, 100% Get; uint64 or string keys; uniform or
//     Zipf (s=1.01) access; 1,024 or 1,000,000 peers. Reports bytes per
//     entry (heap growth while filling the cache, less the endpoints).
//   - storm: the startup storm. G goroutines released together by a
//     barrier; each gets every one of P peers, goroutine g visiting them in
//     rotated order starting at g·P/G, as MPI ranks do ((i + rank) % n), so
//     that creations can proceed in parallel. Measures the time until every
//     goroutine has every peer, and each Get's latency.
//   - churn: mostly hits; a fraction of operations (default 1%) reports the
//     endpoint just obtained as failed (CompareAndInvalidate), so the next
//     Get re-creates it.
//   - flaky: a storm in which creation fails with [ErrNotPublished] the first
//     k times for each peer, then succeeds (the PMIx "not yet published"
//     case). epcache retries inside its one creation (Config.Retry);
//     comparators without retry support retry in the caller, with the same
//     backoff.
//   - mixed: a read ratio (100%, 99%, 90%) of Gets, the rest Invalidates of a
//     random peer, which the next Get of that peer re-creates.
//   - lease: mostly leases of a ready peer (epcache's Acquire, use,
//     Release; the pool's markForUse and releaseConn; xsync4rc's count),
//     the rest (default 1%) Invalidates of the peer, which the next lease
//     re-creates. The use marks the endpoint in use, and the ledger counts a
//     release that comes during one (released in use: what leases exist to
//     prevent). Comparators that hold nothing while a value is used do not
//     run it.
//   - hotset: a hot set under a cap. G goroutines (64) each take peers
//     drawn by Zipf (Spec.Zipf, s = 1.01 in the suites) from P (100,000),
//     get the endpoint (a lease where the comparator has one, a Get
//     otherwise), use it briefly (marked in use around one yield of the
//     processor) and let it go; creations cost sleep:100us. Spec.Cap (1,000)
//     bounds epcache (MaxEntries), otter (MaximumSize) and the LRU; the
//     pool has no cap, only its reaper. Each goroutine draws its own
//     sequence, with a math/rand/v2 generator of its own, before any clock
//     starts; ten operations per endpoint of the cap are made at no cost
//     before the measured phase, in which every operation is timed. Reports
//     the hit ratio (1 − creations/operations, over the measured phase),
//     the peak of live endpoints over the whole run (an endpoint is live
//     from the start of its creation until its release returns) and its
//     overshoot past the cap, and the releases that came under a use. A
//     comparator that promises the bound (epcache) fails the run above it;
//     one that leases fails it on a release under a use; the others'
//     overshoot and releases under a use are reported as what they are.
//     Duplicates are not counted: every eviction entitles its peer to a
//     new creation.
//   - tcpstorm (and ucxstorm, with -tags ucx): P peers, each with its own
//     comparator and G goroutines, all connecting to each other at once over
//     real loopback connections (UCX endpoints). Spec.RTT models network
//     delay: each connection's setup first waits RTT per round trip it
//     waits for (a timer: a model, not a measurement). The first storm of a
//     mesh size in a process is run and discarded, since it pays for the
//     process's first sockets and goroutine stacks.
//
// Every workload's Gets pass either a context that never ends (Spec.Ctx
// "background", the default: a send that never gives up on its peer) or one
// that can ("cancel"); epcache runs a creation on the claiming goroutine
// only in the first case.
//
// Storms allocate everything the harness records before their clock starts,
// and release their goroutines only once all of them are parked at the
// barrier.
//
// Creation cost follows a [Cost] model: none, fixed (sleep:1ms, spin:20us) or
// heavy-tailed (lognormal:500us:1.5, a sub-millisecond median with a tail of
// tens of milliseconds). Sleeps shorter than about a millisecond take about
// 1.1 ms on these machines, so every result reports the measured mean
// creation time beside the model.
//
// # What is measured
//
// ops/s, ns/op, Get latency p50/p99/p999/max (HdrHistogram; in the steady
// workloads one Get in 64 is timed, in hotset every operation), allocs/op,
// bytes per entry, creates, duplicates, releases, leaked (creates −
// releases after Close), overlap (the most creations of one peer in flight
// at once; above 1 breaks exactly-once), concurrency (the most creations in
// flight at once, all peers together; 1 for a comparator that serialises
// them), peak live (the most endpoints being created or not yet released at
// once, exact: an atomic maximum), released in use and, in hotset, the hit
// ratio. Duplicates are counted per peer: creations beyond the first and
// beyond one for each time the workload invalidated the peer on purpose. A
// run that leaks, releases twice, releases under a lease, or holds more than
// the cap it promises is a failure.
package bench
