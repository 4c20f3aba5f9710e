// Package resolve holds what the transports share about waiting for a
// peer's address in a [directory.Resolver].
package resolve

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/transport/directory"
)

// Within calls r.Resolve(ctx, peer), but ends the wait an eighth of ctx's
// remaining time before ctx's deadline, if it has one. A transport calls it
// from epcache's Create, whose context ends at CreateTimeout: epcache then
// answers the creation's callers with its own timeout error at once, and
// names the last failed attempt's error in it only if an attempt has
// failed. Ending the wait first makes the attempt fail with the
// directory's error, which says which peer has not published (it wraps
// directory.ErrNotPublished and context.DeadlineExceeded), so that the
// callers are told why; a retry policy that retries ErrNotPublished makes
// another attempt in the time left, which ends the same way. A machine too
// slow to return in that eighth only loses the explanation.
//
// Without a deadline (ctx ends only when it is cancelled), it is Resolve.
func Within(ctx context.Context, r directory.Resolver, peer int) (string, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return r.Resolve(ctx, peer)
	}
	early, cancel := context.WithDeadline(ctx, deadline.Add(-time.Until(deadline)/8))
	defer cancel()
	return r.Resolve(early, peer)
}

// Awaitable reports whether err, a Lookup's, says that the peer's address
// is worth waiting for in Resolve: the peer has not published one yet, or
// one is on its way (pending). A withdrawn address with no new one (the
// peer is believed dead) is not: it comes back only if the peer restarts,
// and waiting for that would hold every Send to it until the creation's
// timeout, time after time.
func Awaitable(err error) bool {
	var np *directory.NotPublishedError
	if errors.As(err, &np) {
		return !np.Withdrawn || np.Pending
	}
	return errors.Is(err, directory.ErrNotPublished)
}

// Lookup returns peer's address: dir.Lookup's answer, or, while peer has
// none visible yet and dir is a directory.Resolver, Resolve's, which waits
// within ctx for peer to publish (see Within). A withdrawn address (the
// peer is believed dead) is not waited for: Lookup's error is returned.
// missed, if not nil, is added one each time dir.Lookup found no address.
func Lookup(ctx context.Context, dir directory.Interface, peer int, missed *atomic.Uint64) (string, error) {
	addr, err := dir.Lookup(peer)
	if err == nil || !errors.Is(err, directory.ErrNotPublished) {
		return addr, err
	}
	if missed != nil {
		missed.Add(1)
	}
	res, ok := dir.(directory.Resolver)
	if !ok || !Awaitable(err) {
		return "", err
	}
	return Within(ctx, res, peer)
}

// Unreachable tells dir, if it is a directory.Resolver, that addr no longer
// answers for peer.
func Unreachable(dir directory.Interface, peer int, addr string) {
	if res, ok := dir.(directory.Resolver); ok {
		res.Unreachable(peer, addr)
	}
}
