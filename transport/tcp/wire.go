package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The layout of the handshake and the frames is in the package doc.
const (
	magic     = "epT\x01"
	helloSize = 36
	replySize = 20
	frameHead = 4
)

// hello opens a connection.
type hello struct {
	from, to uint32 // dialer and intended acceptor
	inc      uint64 // the dialer's incarnation: new for every Listen
	nonce    uint64 // names the connection; the same at both ends
	dropped  uint64 // nonce of the last connection from the acceptor that the dialer admitted, which it has given up; 0 if none
}

func (h *hello) marshal() (b [helloSize]byte) {
	copy(b[:], magic)
	binary.BigEndian.PutUint32(b[4:], h.from)
	binary.BigEndian.PutUint32(b[8:], h.to)
	binary.BigEndian.PutUint64(b[12:], h.inc)
	binary.BigEndian.PutUint64(b[20:], h.nonce)
	binary.BigEndian.PutUint64(b[28:], h.dropped)
	return b
}

var errNotHello = errors.New("tcp: not a hello of this protocol")

func parseHello(b *[helloSize]byte) (hello, error) {
	if string(b[:4]) != magic {
		return hello{}, errNotHello
	}
	h := hello{
		from:    binary.BigEndian.Uint32(b[4:]),
		to:      binary.BigEndian.Uint32(b[8:]),
		inc:     binary.BigEndian.Uint64(b[12:]),
		nonce:   binary.BigEndian.Uint64(b[20:]),
		dropped: binary.BigEndian.Uint64(b[28:]),
	}
	if h.nonce == 0 || h.inc == 0 {
		return hello{}, errNotHello
	}
	return h, nil
}

// verdict is the acceptor's answer to a hello.
type verdict uint8

const (
	verdictAccept    verdict = 1 // this connection is the pair's: use it
	verdictDuplicate verdict = 2 // the pair keeps another connection, dialed by the acceptor
	verdictRefused   verdict = 3 // the hello is not acceptable; reason says why
)

// reason says why a hello was refused.
type reason uint8

const (
	reasonNone        reason = iota
	reasonWrongPeer          // the hello is for another peer: a stale address
	reasonUnknownPeer        // the dialer's id is not in the directory
	reasonSelf               // the dialer claims the acceptor's own id
	reasonClosing            // the acceptor is closing
	reasonBusy               // the acceptor has no room for the connection now (MaxConns); it connects back
	reasonLate               // no hello within the acceptor's grace, while it held its one accept slot (MaxConns); try again
)

func (r reason) String() string {
	switch r {
	case reasonWrongPeer:
		return "the address belongs to another peer"
	case reasonUnknownPeer:
		return "unknown dialer id"
	case reasonSelf:
		return "the dialer claims the acceptor's id"
	case reasonClosing:
		return "the peer is closing"
	case reasonBusy:
		return "the peer is busy"
	case reasonLate:
		return "no hello in time"
	default:
		return fmt.Sprintf("reason %d", uint8(r))
	}
}

// reply answers a hello.
type reply struct {
	verdict verdict
	reason  reason
	from    uint32 // the acceptor
	inc     uint64 // the acceptor's incarnation
}

func (r *reply) marshal() (b [replySize]byte) {
	copy(b[:], magic)
	b[4] = byte(r.verdict)
	b[5] = byte(r.reason)
	binary.BigEndian.PutUint32(b[8:], r.from)
	binary.BigEndian.PutUint64(b[12:], r.inc)
	return b
}

func parseReply(b *[replySize]byte) (reply, error) {
	r := reply{
		verdict: verdict(b[4]),
		reason:  reason(b[5]),
		from:    binary.BigEndian.Uint32(b[8:]),
		inc:     binary.BigEndian.Uint64(b[12:]),
	}
	if string(b[:4]) != magic || r.verdict < verdictAccept || r.verdict > verdictRefused {
		return reply{}, errors.New("tcp: the acceptor's reply is not of this protocol")
	}
	return r, nil
}
