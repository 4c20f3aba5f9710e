// Package etcddir is a directory of peer addresses backed by etcd, for
// transports whose peers are separate processes on separate hosts: it
// implements [directory.Interface], [directory.Watcher] and
// [directory.Resolver], so that transport/tcp (and transport/ucx) take it
// where a single process uses the in-process [directory.Directory].
//
// A peer publishes its address under its key (see "Keys"), bound to the
// etcd lease of the process that publishes it, which that process keeps
// alive: a process that dies (even by SIGKILL) disappears from the
// directory when its lease expires, TTL after its last keep-alive. A peer
// that has not published (or whose lease expired) gets the
// [directory.NotPublishedError] that transports retry.
//
// # Modes
//
// In Mirror mode (the default) every process keeps a mirror of the whole
// prefix, loaded at Open and kept current by one watch, so that Lookup,
// which a transport calls on every connection attempt, answers every peer
// from memory, and every new life of every peer is news. Its cost to etcd
// grows with the square of the job: each of N publications is an event to
// each of N watchers, N² at a job's start, and a compaction past the
// watches makes every process read all N keys again.
//
// In OnDemand mode a process fetches only the peers it asks for, as PMIx's
// direct modex does: [Directory.Resolve] reads the peer's one key
// (serializable: a stale address only fails to connect, and the retry
// after [Directory.Unreachable] reads linearizably) and, if the peer has
// not published, watches that one key from the read's revision until it
// does: nothing missed, nothing polled. Fetches go through an endpoint
// cache of addresses (epcache): however many goroutines and however many
// layers of a process ask for one peer at once, etcd sees one fetch, and
// its reply answers them all (the coalescing whose absence was PMIx's bug,
// openpmix #3415). Lookup answers from what was fetched.
// Options.MaxEntries and IdleTimeout bound what a process keeps; the
// watch of a peer that has not published runs outside the cache, and
// takes none of its room. Its cost to etcd grows with the peers each
// process uses, not with the job.
//
// For jobs that want every address at once (PMIx's full modex), the fence
// costs O(N): one process runs [Directory.CoordinateFence], which follows
// the peers' keys and writes the fence key when all N are in; every
// process waits for that one key ([Directory.Fence]) and then reads every
// address at the fence's revision, page by page ([Directory.Prefetch]).
//
// # Choosing a mode
//
// Measured on one 2-core machine by cmd/dirscale (results/directory),
// which counts what etcd sent and did for a job's start, simulated with N
// processes against one etcd: Mirror's events grow as N² (slope 2.00,
// 1,048,576 at N = 1,024, 7.8 s of etcd CPU); OnDemand's, for processes
// that use two peers each, as N (slope 1.00, 0.8 s); OnDemand where every
// process uses every other makes N² reads instead (69 s); the fence with
// Prefetch makes O(N) requests and events, but still delivers the N²
// addresses full modex needs (2.2 s). Mirror stays the default: up to
// about 128 processes it costs etcd at most 0.05 s of CPU more per job
// start than the cheapest mode (0.12 s at 128, the two-peer OnDemand
// 0.07 s), it answers Lookup of every peer at once and follows every
// peer's life; and where every process uses every peer it costs etcd less
// than OnDemand's fetch of each peer at every N measured (up to 1,024).
// Choose OnDemand above about 128 processes where each talks to few
// peers, and OnDemand with the fence and Prefetch where each needs every
// address: at 10,000 processes Mirror is projected (not measured) to send
// 10⁸ events. See results/directory for the counts, the fits and the
// projections.
//
// # Keys
//
// Peer i publishes under Prefix + "v2/" + i in ten digits, zero-padded
// ([Key]): the order of keys is the order of peers, so that a range of
// peers is a range of keys (a fence's read, a process's watch of its own
// peers). The version in the key is the format's: a reader refuses, with
// an error that names the format, a key of another version (Malformed
// counts it) and a key of the old format (Prefix + i, unpadded, of etcddir
// before format v2), counted too. A peer whose only key is of the old
// format gets from Lookup and Resolve an error that says the job mixes
// formats (in OnDemand mode, Lookup once a fetch has found no key of this
// format); a peer with keys of both formats, a process of format v2 beside
// a key an older etcddir left, is answered with its key of this format,
// in both modes, by both calls. An etcddir of the old format, reading a
// job of format v2, sees only keys that name no peer: it counts them
// malformed and finds no peer published. The fence is Prefix +
// "v2/fence" ([FenceKey]).
//
// # Lives
//
// Each [Directory.Publish] begins a new life of its peer: a restart of the
// process, or a second Publish by the same process, is a new life even on
// the same address. A life is named by the etcd revision at which its
// Publish stored the address, so that of two lives of a peer the newer is
// the one with the larger revision, whichever process and host they come
// from.
//
// A process binds all its publications to one lease, granted at its first
// Publish and kept alive by one loop ([Directory.PublishAll] writes many
// peers in one transaction per 128). A life holds the peer's key until a
// newer life replaces it, or until it is withdrawn ([Directory.Unpublish],
// [Directory.Close], the lease expiring). Its process writes the key again
// only when it must: if its lease was lost (the process was cut off from
// etcd for longer than TTL, and etcd deleted its keys with the lease), it
// takes a new lease as soon as etcd answers and publishes each life again
// under it. Each such write is a transaction conditional on the key being
// as the process read it just before: absent, or holding this life, or
// holding an older life (a zombie of an earlier incarnation that wrote
// while this one was away). It never replaces a newer life. As soon as a
// process learns of a newer life of a peer it publishes, from that write
// or from its watch (the mirror, or in OnDemand mode a watch of its own
// peers' keys), its own life ends for good: it writes nothing more, and,
// if its last write came after the newer life's (into a key that was
// absent), it deletes the key if the key still holds that write. A
// process cannot tell from etcd alone whether a newer life came and went
// while the key was absent; its watch, read in revision order, tells it,
// unless etcd compacted that history away before the watch read it.
//
// Unpublish by the process that published a peer withdraws only its own
// life, never a newer one; Unpublish by any other process (a resource
// manager withdrawing a peer it knows to be dead) withdraws whatever life
// holds the key. A process's Publish and Unpublish calls for one peer take
// effect one at a time, in the order they take a per-peer lock.
//
// # Values
//
// The value of a peer's key is its address, byte for byte as given to
// Publish, when Publish wrote it: the life is then the key's ModRevision.
// A value that a process writes again after losing its lease carries the
// life it continues:
//
//	epcache-life=<revision> <address>
//
// with <revision> in decimal and one space before the address. Publish
// refuses addresses that begin with "epcache-life=", so that the two forms
// cannot be confused. The fence's value is the revision, in decimal, at
// which every peer had a key.
//
// # What a watcher sees
//
// In Mirror mode the mirror applies etcd's events in revision order.
// [Directory.Watch]'s function is called each time a put makes a peer's
// address visible in the mirror with a life (or an address) other than the
// one visible just before: a peer that publishes, a new life on the same
// address (a restart on a fixed port, even before the old lease expired),
// and a life whose address comes back after it was withdrawn or was
// invalid. A rewrite of the visible life (its process rebinding it to a
// new lease) is not news. Withdrawals are not reported to the function:
// Lookup answers a NotPublishedError with Withdrawn set from then on.
// Where the watch lost etcd's history (compaction), the mirror reloads
// the prefix: the watcher then hears of the lives visible at the reload
// that it had not seen, and not of lives that came and went in between.
//
// In OnDemand mode a process follows only what it fetched, and the
// function is called when it learns of a life of a peer newer than any it
// knew: from a fetch (Resolve, Lookup's background fetch, Prefetch), or
// from the watch that Unreachable starts on the peer's key, which fetches
// the peer's next life newer than every one reported unreachable as soon
// as it is published and then ends. Each
// newer life that Unreachable's watch or Prefetch finds replaces in the
// address cache the older one it may hold before the watchers hear of it,
// so that Lookup answers what the watchers were last told (or, where
// MaxEntries left no room for it, fetches it again). A life that a fetch
// of Resolve or Lookup reads is told to the watchers as the fetch ends,
// just before the cache stores it: a Lookup made from the watcher's call
// may answer that the peer has not published yet, never an older life.
// An older life never replaces a newer one. A peer whose address was
// never reported unreachable is not followed: its withdrawal and its
// restart are news only once this process asks again.
//
// # etcd going away
//
// etcd going away is not fatal: the client reconnects, the watches resume
// where they stopped (or read their range again if etcd compacted past
// them, or if their member lost the cluster's leader, so that a
// partitioned member cannot stall them silently), a Resolve waiting for a
// peer goes on waiting, and a publication whose lease was lost meanwhile
// is made again as above. Every wait before trying again is drawn at
// random from the upper half of a doubling backoff, so that a job's
// processes do not come back in step. Entries under the prefix that are
// not a peer's key of this format, or whose value is empty, garbled or
// fails Options.Validate, are counted ([Directory.Malformed]; in OnDemand
// mode, the keys of the old format only) and answer Lookup with an error
// that says what is wrong (in OnDemand mode, once a fetch has read them).
//
// # Counting
//
// [Directory.Counters] says what a directory asked of etcd and what etcd
// sent it (reads, keys read, writes, watches, events and their bytes,
// reloads, fetches): the measure, summed over a job's processes, of the
// directory's cost to etcd that cmd/dirscale and cmd/epmesh report.
//
// This package is in a module of its own (github.com/epcache/epcache/etcd),
// so that importing epcache never brings etcd or gRPC into a build.
package etcddir
