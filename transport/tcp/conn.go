package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/epcache"
)

// conn is this peer's end of one TCP connection to another peer. The fields
// above wmu are set by the goroutine that runs the handshake, before the
// connection is shared (under Peer.mu), and never change after.
type conn struct {
	p         *Peer
	nc        net.Conn
	br        *bufio.Reader // read by the handshake, then by the reader goroutine only
	remote    int           // the peer at the other end
	remoteInc uint64        // its incarnation
	nonce     uint64        // names the connection; chosen by the dialer, the same at both ends
	dialed    bool          // this end dialed it
	addr      string        // the address this end dialed; "" for an accepted one
	owned     bool          // the endpoint cache holds it (or released it, or is handed it): its Release closes it

	wmu     sync.Mutex // serialises frames; held by the acceptor until its verdict is written
	broken  bool       // under wmu: a write failed or was cut, or this end closed its side: no frame may follow
	writing atomic.Int32

	// ended is set when the connection is unusable: a read failed (not a
	// clean end: the other end closing gracefully still reads), a frame was
	// bad, a write broke the stream, the other end was found to have closed
	// its side, or it is closed. A Send that finds it set writes nothing
	// and uses another connection.
	ended atomic.Bool
	// readDone is closed when the reader has stopped reading; a graceful
	// close waits for it (see shutdown). rx counts the bytes read, so that
	// the wait ends only once the other end has been silent.
	readDone chan struct{}
	rx       atomic.Uint64
	// drain is closed once shutdown has closed this end's sending side:
	// from then on the reader never waits for room in the inbox (see
	// readFrames), so that it reads to the other end's close whatever the
	// receiver does.
	drain     chan struct{}
	drainOnce sync.Once
	// left is closed when the connection has left the cache for good: its
	// Release has begun (see Peer.drop).
	left chan struct{}
	// givenUp is set when this peer reports the connection as failed or
	// stale (Peer.drop): a Send that ends its lease then does so on a
	// goroutine of its own, since its lease may be the last one and the
	// Release it would run waits for the other end (see Peer.endLease).
	givenUp atomic.Bool
	// hsMu orders a cut (the acceptor hands r's own connection to this
	// dial's creation, and aborts the handshake) with the handshake's end:
	// a reply that arrived is honoured, and a cut after it changes
	// nothing.
	hsMu   sync.Mutex
	hsDone bool // under hsMu: the handshake has ended
	cut    bool // under hsMu: it was cut short before it ended
	// released is set once the cache's Release of the connection has begun.
	released atomic.Bool
	// superseded is set, for a dial in flight, when a hello from the same
	// peer names it as dropped: the peer accepted it and gave it up
	// already, and endCreate keeps a connection handed over instead.
	superseded atomic.Bool
	// slot: the connection holds the peer's accept slot (MaxConns): it was
	// accepted and the cache does not own it yet.
	slot atomic.Bool

	closeOnce sync.Once
}

func newConn(p *Peer, nc net.Conn) *conn {
	c := &conn{p: p, nc: nc, readDone: make(chan struct{}), drain: make(chan struct{}), left: make(chan struct{})}
	c.br = bufio.NewReader(countingReader{c})
	return c
}

// countingReader reads c's socket, counting the bytes in c.rx.
type countingReader struct{ c *conn }

func (r countingReader) Read(b []byte) (int, error) {
	n, err := r.c.nc.Read(b)
	r.c.rx.Add(uint64(n))
	return n, err
}

// errBroken is what a write on a connection whose stream an earlier failed
// write cut returns. Send wraps it with its "tcp: send to peer N" prefix.
var errBroken = errors.New("connection broken by an earlier failed write")

// errRemoteShut is what a write returns, having written nothing, on a
// connection whose other end has closed its sending side: it is giving the
// connection up, and may close it before a frame written now arrives.
var errRemoteShut = errors.New("the other end has closed the connection")

// aLongTimeAgo is a deadline in the past: setting it aborts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// writeFrame writes one frame. ctx's deadline bounds the write, and ctx's
// cancellation aborts it; a write that fails or is aborted leaves the
// connection broken, since part of the frame may have been sent. wrote
// reports whether any byte of the frame left: if not, the frame may go on
// another connection.
//
// It writes nothing on a connection whose other end has closed its sending
// side (remoteShut), even if this end's reader has not read that far (it
// may be waiting for room in the inbox): the other end is giving the
// connection up, reads on only until this end closes its side or stays
// silent for its HandshakeTimeout, and closes its socket then, so that a
// frame written later would be lost. The check is made under wmu, right
// before the write.
func (c *conn) writeFrame(ctx context.Context, payload []byte) (wrote bool, _ error) {
	var head [frameHead]byte
	binary.BigEndian.PutUint32(head[:], uint32(len(payload)))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.broken {
		return false, errBroken
	}
	if remoteShut(c.nc) {
		c.ended.Store(true)
		return false, errRemoteShut
	}
	deadline, _ := ctx.Deadline()
	if err := c.nc.SetWriteDeadline(deadline); err != nil {
		c.breakStream()
		return false, err
	}
	var (
		stop  func() bool
		fired chan struct{}
	)
	if ctx.Done() != nil {
		fired = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			defer close(fired)
			_ = c.nc.SetWriteDeadline(aLongTimeAgo)
		})
	}
	bufs := net.Buffers{head[:], payload}
	c.writing.Add(1)
	n, err := bufs.WriteTo(c.nc)
	c.writing.Add(-1)
	if stop != nil && !stop() {
		// The abort ran or is running: let it finish before the next
		// writer sets its own deadline.
		<-fired
	}
	if err != nil {
		c.breakStream()
		if ctx.Err() != nil {
			return n > 0, ctx.Err()
		}
		return n > 0, err
	}
	return true, nil
}

// breakStream marks the frame stream unusable. c.wmu must be held.
func (c *conn) breakStream() {
	c.broken = true
	c.ended.Store(true)
}

// drainLimit bounds the bytes of frames a draining reader holds for a full
// inbox (see readFrames) beyond MaxFrame. A peer of this package writes
// nothing once it sees this end's close (remoteShut), so what arrives after
// it is what the two sockets' buffers held then, and at most one frame in
// its write: a few MiB with Linux's default buffer sizes. More than this is
// a stranger that does not stop, and its connection is cut.
const drainLimit = 64 << 20

var errDrainOverflow = errors.New("tcp: the other end kept sending after this end closed its side")

// readFrames delivers the connection's frames to the peer's inbox until the
// connection ends, a frame is too large, or the peer closes.
//
// While the inbox is full, the reader waits for room (see deliver), and
// reads nothing meanwhile: TCP's flow control holds the other end back.
// Once the connection drains (this end has closed its side: shutdown), it
// never waits: a frame that finds the inbox full waits in pending, and so
// does every frame after it (frames stay in order), until the other end
// closes its side too. readUntilEnd then delivers them, after the
// descriptor is closed: the other end's frames are all read off the socket
// whatever the receiver does, so that this end never closes a socket with
// unread data (which makes the kernel reset the connection and discard
// frames whose Sends have returned) and never waits for its own receiver
// to close one.
func (c *conn) readFrames() (pending []Message, err error) {
	p := c.p
	var (
		head [frameHead]byte
		size int // of the payloads in pending
	)
	for {
		if _, err := io.ReadFull(c.br, head[:]); err != nil {
			return pending, err
		}
		n := binary.BigEndian.Uint32(head[:])
		if uint64(n) > uint64(p.maxFrame) {
			p.stats.badFrames.Add(1)
			return pending, fmt.Errorf("%w: peer %d announced %d bytes (MaxFrame is %d)", ErrFrameTooLarge, c.remote, n, p.maxFrame)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(c.br, payload); err != nil {
			return pending, err
		}
		m := Message{From: c.remote, Payload: payload}
		if len(pending) == 0 {
			queued, err := c.deliver(m)
			if err != nil {
				return pending, err
			}
			if !queued {
				continue
			}
		}
		pending = append(pending, m)
		size += len(m.Payload)
		pending = p.deliverNow(pending)
		if len(pending) == 0 {
			size = 0
		} else if size > drainLimit+p.maxFrame {
			return pending, errDrainOverflow
		}
	}
}

// deliver puts m in the peer's inbox, or reports it queued: the inbox is
// full and the connection drains (see readFrames). Where connections can
// be closed for room or idleness, a frame received is a use of the
// connection (so that one the other end keeps sending on is not closed
// here as idle, nor evicted as unused), and while the inbox is full the
// reader holds a lease on its connection: a frame in hand is a use in
// progress, as a write is.
func (c *conn) deliver(m Message) (queued bool, _ error) {
	p := c.p
	if p.aging {
		p.touch(c.remote)
	}
	select {
	case p.inbox <- m:
		p.stats.received.Add(1)
		return false, nil
	case <-c.drain:
		return true, nil
	default:
	}
	var (
		lease epcache.Lease[int, *conn]
		held  bool
	)
	if p.aging {
		lease, held = p.leaseOf(c)
	}
	defer func() {
		if held {
			// Ended on a goroutine of its own: if the connection was
			// given up meanwhile, this is its last lease, and the Release
			// it runs waits for this reader to read to the end.
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				lease.Release()
			}()
		}
	}()
	select {
	case p.inbox <- m:
		p.stats.received.Add(1)
		return false, nil
	case <-c.drain:
		return true, nil // given up while the frame waited: no lease held it
	case <-p.done:
		return false, ErrClosed
	}
}

// deliverNow moves the frames at the head of pending into the inbox, as
// many as it has room for now, and returns the rest.
func (p *Peer) deliverNow(pending []Message) []Message {
	for len(pending) > 0 {
		select {
		case p.inbox <- pending[0]:
			p.stats.received.Add(1)
			pending[0] = Message{}
			pending = pending[1:]
		default:
			return pending
		}
	}
	return nil
}

// deliverLate puts the frames a drained connection held (see readFrames)
// in the inbox, in order, waiting for room, until Close.
func (p *Peer) deliverLate(pending []Message) {
	for _, m := range pending {
		select {
		case p.inbox <- m:
			p.stats.received.Add(1)
		case <-p.done:
			return
		}
	}
}

// shutdown closes a connection the cache has given up, gracefully where it
// can. It closes this end's sending side (shutdown(SHUT_WR)): the other
// end's reader sees the end once every frame written before has arrived,
// its Sends see it (remoteShut) and write nothing more, and the other end
// drops the connection, closing its socket once its own last writer is
// done. Meanwhile this end reads on, never waiting for room in the inbox
// (the connection drains: see readFrames), until the other end has closed
// its side too, so that a frame the other end wrote before it saw the end
// is delivered; and only then closes the descriptor, with nothing unread.
//
// A stream that a write broke (cut by its context: part of a frame went) is
// closed the same way: the other end's reader sees a frame cut short, and
// drops the connection at once, but this end's reader still reads what the
// other end wrote before, instead of discarding it with a reset.
//
// The wait ends when the other end has been silent for HandshakeTimeout (it
// is hung: no byte arrived meanwhile), and at Close. A connection whose
// reader has stopped (it saw the other end close, or failed) is closed at
// once: there is nothing more to read. It must not run on the connection's
// reader, which it may wait for.
func (c *conn) shutdown() {
	p := c.p
	select {
	case <-c.readDone:
		c.close(false)
		return
	case <-p.done:
		c.close(false)
		return
	default:
	}
	c.wmu.Lock() // no Send writes any more (the last lease has ended), but the acceptor may still be writing its verdict
	cw, ok := c.nc.(interface{ CloseWrite() error })
	graceful := ok && cw.CloseWrite() == nil
	c.broken = true
	c.ended.Store(true)
	c.wmu.Unlock()
	if graceful {
		c.drainOnce.Do(func() { close(c.drain) })
		t := time.NewTimer(p.hsTimeout)
		defer t.Stop()
		for seen := c.rx.Load(); ; {
			select {
			case <-c.readDone:
			case <-p.done:
			case <-t.C:
				// Silent means no byte read and none waiting to be: a
				// reader that the scheduler kept from running that long
				// has read nothing, and closing now would discard what
				// waits in the socket with a reset.
				if n := c.rx.Load(); n != seen || readable(c.nc, 1) > 0 {
					seen = n // still sending: wait on
					t.Reset(p.hsTimeout)
					continue
				}
			}
			break
		}
	}
	c.close(false)
}

// close closes the connection once, counting it; dup says it is closed
// because the pair keeps another connection. It takes Peer.mu: never call
// it with Peer.mu held.
func (c *conn) close(dup bool) {
	c.closeOnce.Do(func() {
		if c.writing.Load() != 0 {
			c.p.stats.closedUnderWriter.Add(1) // only Close may do this: see TestNoCloseUnderAWriter
		}
		_ = c.nc.Close() // returns once the descriptor is closed
		c.p.stats.fdClosed()
		c.p.stats.closed.Add(1)
		c.ended.Store(true)
		c.releaseSlot()
		if dup {
			c.p.stats.duplicates.Add(1)
		}
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// cutShort aborts the handshake of a dial in flight, unless it has ended
// (see handshake).
func (c *conn) cutShort() {
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	if !c.hsDone {
		c.cut = true
		_ = c.nc.SetDeadline(aLongTimeAgo)
	}
}

// wasCut reports whether the handshake was cut short.
func (c *conn) wasCut() bool {
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	return c.cut
}

// releaseSlot gives the peer's accept slot back, if c holds it: c is
// closed, or the cache now owns it (its room covers c).
func (c *conn) releaseSlot() {
	if c.slot.Swap(false) {
		<-c.p.acceptSlot
	}
}

// String names the connection in test failures.
func (c *conn) String() string {
	return fmt.Sprintf("%v->%v (peer %d, nonce %x)", c.nc.LocalAddr(), c.nc.RemoteAddr(), c.remote, c.nonce)
}
