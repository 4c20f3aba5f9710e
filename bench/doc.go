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
// and gone bit, released by whoever claims the release by CAS). Every
// comparator releases what it gives up, duplicates included, so that a leak
// is a bug in a comparator, never a choice.
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
// workloads one Get in 64 is timed), allocs/op, bytes per entry, creates,
// duplicates, releases, leaked (creates − releases after Close), overlap
// (the most creations of one peer in flight at once; above 1 breaks
// exactly-once), concurrency (the most creations in flight at once, all
// peers together; 1 for a comparator that serialises them) and released in
// use. Duplicates are counted per peer: creations beyond the first and
// beyond one for each time the workload invalidated the peer on purpose. A
// run that leaks, releases twice or releases under a use is a failure.
package bench
