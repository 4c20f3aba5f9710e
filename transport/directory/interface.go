package directory

import "context"

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

// Resolver is implemented by directories that can look a peer up on
// demand, asking their store when the process does not hold the address.
type Resolver interface {
	// Resolve returns peer's address as Lookup does, but may ask the store
	// when this process does not hold it, and waits until the peer
	// publishes one or ctx ends (then an error that wraps ctx.Err() and
	// names the peer). An unknown peer gives an error wrapping ErrUnknownPeer at once.
	Resolve(ctx context.Context, peer int) (string, error)
	// Unreachable reports that addr, which Resolve returned for peer, no
	// longer answers: a directory that keeps the addresses it fetched drops
	// that one (only if it still holds that address: a report about an old
	// address leaves a newer one alone), so that the next Resolve asks again.
	Unreachable(peer int, addr string)
}

var (
	_ Interface = (*Directory)(nil)
	_ Resolver  = (*Directory)(nil)
)
