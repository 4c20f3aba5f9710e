package tcp

import (
	"errors"

	"github.com/epcache/epcache/transport/directory"
)

// ErrClosed is returned by Send and Recv once Close has begun. Test for it
// with errors.Is.
var ErrClosed = errors.New("tcp: peer closed")

// ErrFrameTooLarge matches, with errors.Is, the error Send returns for a
// payload longer than Config.MaxFrame. Nothing is sent. A peer that receives
// a frame header announcing more than its MaxFrame closes that connection
// (counted in Stats.BadFrames).
var ErrFrameTooLarge = errors.New("tcp: frame too large")

// ErrSelf matches the error Send returns when a peer sends to itself: this
// example has no loopback path.
var ErrSelf = errors.New("tcp: send to self")

// ErrHandshake matches, with errors.Is, the error of a connection attempt
// that reached something that did not complete the handshake: a peer that
// refused it (the address belongs to another peer, say), or a listener that
// does not speak the protocol. It is not retried by [Retryable].
var ErrHandshake = errors.New("tcp: handshake failed")

// ErrSuperseded matches, with errors.Is, the error of a connection attempt
// that lost the tie-break of a simultaneous connect (the remote peer dialed
// too, and its connection wins) when the winning connection did not arrive
// within Config.HandshakeTimeout: the remote's own attempt failed. It is
// transient, and [Retryable] retries it.
var ErrSuperseded = errors.New("tcp: lost a simultaneous connect and the winning connection did not arrive")

// ErrBusy matches, with errors.Is, the error of a connection attempt that
// the remote peer answered "busy": it holds Config.MaxConns connections and
// could not take another at once. The remote connects back once it has
// room; meanwhile the attempt has given up this peer's room, so that a full
// mesh cannot deadlock (see the package doc). It also matches the error of
// an attempt the remote answered "late": its hello reached a remote with
// MaxConns after the remote had waited long enough for it (the remote
// does not connect back then). [Peer.Send] waits and tries
// again by itself, until its context ends; [Retryable] does not retry it,
// since a retry inside the connection attempt would keep the room.
var ErrBusy = errors.New("tcp: the peer has no room for another connection now")

// Retryable reports whether a failed connection attempt is worth another
// try: the peer's address is not published yet (errors.Is(err,
// directory.ErrNotPublished)), or the attempt lost a simultaneous connect
// whose winner did not arrive ([ErrSuperseded]). Any other failure (a
// refused dial, a failed handshake, an unknown peer) is final, and
// Config.ErrorTTL decides how long it is remembered. So is a peer whose
// address was withdrawn (a [*directory.NotPublishedError] with Withdrawn
// set: it died, or its lease in etcd expired): retrying it would hold every
// Send to it until CreateTimeout, when it comes back only by publishing
// again, which a watching directory reports (Config.Directory). It is
// meant for epcache.Backoff's retryable argument.
func Retryable(err error) bool {
	var np *directory.NotPublishedError
	if errors.As(err, &np) && np.Withdrawn {
		return false
	}
	return errors.Is(err, directory.ErrNotPublished) || errors.Is(err, ErrSuperseded)
}
