package directory

// Interface is what a transport needs of a directory: the in-process
// [Directory], for tests and for peers that share one process, or one
// backed by a real store for peers in separate processes on separate hosts
// (module github.com/epcache/epcache/etcd's etcddir, backed by etcd).
//
// Every implementation answers Lookup of a known peer that has no visible
// address with an error matching [ErrNotPublished] (a [*NotPublishedError]
// where it can say more), which transports retry, and Lookup, Publish and
// Unpublish of a peer outside 0 to Size-1 with one wrapping
// [ErrUnknownPeer], which they do not. Lookup is called on every
// connection attempt: it should answer from memory, without a round trip.
type Interface interface {
	// Size returns the number of peers, numbered 0 to Size-1.
	Size() int
	// Publish publishes addr as peer's address.
	Publish(peer int, addr string) error
	// Unpublish withdraws peer's address, reporting whether it had one.
	Unpublish(peer int) bool
	// Lookup returns peer's visible address.
	Lookup(peer int) (string, error)
}

// Watcher is implemented by directories that can say when a peer publishes
// an address: a transport that remembers a failure to reach a dead peer
// (epcache's ErrorTTL) forgets it as soon as the peer is back, rather than
// when the TTL ends.
type Watcher interface {
	// Watch calls f with peer and its new address each time a peer's
	// address becomes visible, on a goroutine of the directory's, one call
	// at a time, until the returned stop is called; stop waits for a call
	// under way to return.
	Watch(f func(peer int, addr string)) (stop func())
}

var _ Interface = (*Directory)(nil)
