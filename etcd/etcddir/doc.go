// Package etcddir is a directory of peer addresses backed by etcd, for
// transports whose peers are separate processes on separate hosts: it
// implements [directory.Interface] and [directory.Watcher], so that
// transport/tcp (and transport/ucx) take it where a single process uses the
// in-process [directory.Directory].
//
// A peer publishes its address under Prefix + its number, bound to an etcd
// lease that the publishing process keeps alive: a process that dies (even
// by SIGKILL) disappears from the directory when its lease expires, TTL
// after its last keep-alive. Every process keeps a mirror of the whole
// prefix, loaded at Open and kept current by a watch, so that Lookup, which
// a transport calls on every connection attempt, answers from memory; a
// peer that has not published (or whose lease expired) gets the
// [directory.NotPublishedError] that transports retry.
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
// A life holds the peer's key until a newer life replaces it, or until it
// is withdrawn ([Directory.Unpublish], [Directory.Close], its lease
// expiring). Its process writes the key again only when it must: if its
// lease was lost (the process was cut off from etcd for longer than TTL,
// and etcd deleted the key with the lease), it publishes the same life
// again under a new lease as soon as etcd answers. That write is a
// transaction conditional on the key being as the process read it just
// before: absent, or holding this life, or holding an older life (a zombie
// of an earlier incarnation that wrote while this one was away). It never
// replaces a newer life. As soon as a process learns of a newer life of a
// peer it publishes, from that write or from its mirror, its own life ends
// for good: its keep-alives stop, and it revokes its lease, which removes
// the key only if the key is still bound to that lease. A process cannot
// tell from etcd alone whether a newer life came and went while the key
// was absent; its mirror, read in revision order, tells it, unless etcd
// compacted that history away before the mirror read it.
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
// cannot be confused. Readers older than this format read a bare address
// as before, and a tagged one as an (invalid) address.
//
// # What a watcher sees
//
// The mirror applies etcd's events in revision order. [Directory.Watch]'s
// function is called each time a put makes a peer's address visible in the
// mirror with a life (or an address) other than the one visible just
// before: a peer that publishes, a new life on the same address (a
// restart on a fixed port, even before the old lease expired), and a life
// whose address comes back after it was withdrawn or was invalid. A
// rewrite of the visible life (its process rebinding it to a new lease) is
// not news. Withdrawals are not reported to the function: Lookup answers a
// NotPublishedError with Withdrawn set from then on. Where the watch lost
// etcd's history (compaction), the mirror reloads the prefix: the watcher
// then hears of the lives visible at the reload that it had not seen, and
// not of lives that came and went in between.
//
// # etcd going away
//
// etcd going away is not fatal: the client reconnects, the watch resumes
// where it stopped (or reloads the prefix if etcd compacted past it, or if
// its member lost the cluster's leader, so that a partitioned member cannot
// stall the mirror silently), and a publication whose lease was lost
// meanwhile is made again as above. Entries under the prefix that are not
// a peer number in range, or whose value is empty, garbled or fails
// Options.Validate, are counted ([Directory.Malformed]) and answer Lookup
// with an error that says what is wrong.
//
// This package is in a module of its own (github.com/epcache/epcache/etcd),
// so that importing epcache never brings etcd or gRPC into a build.
package etcddir
