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
	owned     bool          // the endpoint cache holds it (or released it, or is handed it): its Release closes it

	wmu     sync.Mutex // serialises frames; held by the acceptor until its verdict is written
	broken  bool       // under wmu: a write failed or was cut, so the frame stream is unusable
	writing atomic.Int32

	// ended is set when the connection is unusable: a read failed (not a
	// clean end: the other end closing gracefully still reads), a frame was
	// bad, a write broke the stream, or it is closed. A Send that finds it
	// set writes nothing and uses another connection.
	ended atomic.Bool
	// readDone is closed when the reader has stopped reading; a graceful
	// close waits for it (see shutdown). frames counts the frames read,
	// so that the wait ends only once the other end is silent.
	readDone chan struct{}
	frames   atomic.Uint64
	// hsMu orders a cut (the acceptor hands r's own connection to this
	// dial's creation, and aborts the handshake) with the handshake's end:
	// a reply that arrived is honoured, and a cut after it changes
	// nothing.
	hsMu   sync.Mutex
	hsDone bool // under hsMu: the handshake has ended
	cut    bool // under hsMu: it was cut short before it ended
	// released is set once the cache's Release of the connection has begun.
	released atomic.Bool
	// slot: the connection holds the peer's accept slot (MaxConns): it was
	// accepted and the cache does not own it yet.
	slot atomic.Bool

	closeOnce sync.Once
}

func newConn(p *Peer, nc net.Conn) *conn {
	return &conn{p: p, nc: nc, readDone: make(chan struct{})}
}

// errBroken is what a write on a connection whose stream an earlier failed
// write cut returns. Send wraps it with its "tcp: send to peer N" prefix.
var errBroken = errors.New("connection broken by an earlier failed write")

// aLongTimeAgo is a deadline in the past: setting it aborts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// writeFrame writes one frame. ctx's deadline bounds the write, and ctx's
// cancellation aborts it; a write that fails or is aborted leaves the
// connection broken, since part of the frame may have been sent. wrote
// reports whether any byte of the frame left: if not, the frame may go on
// another connection.
func (c *conn) writeFrame(ctx context.Context, payload []byte) (wrote bool, _ error) {
	var head [frameHead]byte
	binary.BigEndian.PutUint32(head[:], uint32(len(payload)))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.broken {
		return false, errBroken
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

// readFrames delivers the connection's frames to the peer's inbox until the
// connection ends, a frame is too large, or the peer closes.
func (c *conn) readFrames() error {
	p := c.p
	var head [frameHead]byte
	for {
		if _, err := io.ReadFull(c.br, head[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(head[:])
		if uint64(n) > uint64(p.maxFrame) {
			p.stats.badFrames.Add(1)
			return fmt.Errorf("%w: peer %d announced %d bytes (MaxFrame is %d)", ErrFrameTooLarge, c.remote, n, p.maxFrame)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(c.br, payload); err != nil {
			return err
		}
		c.frames.Add(1)
		if err := c.deliver(Message{From: c.remote, Payload: payload}); err != nil {
			return err
		}
	}
}

// deliver puts m in the peer's inbox. Where connections can be closed for
// room or idleness, a frame received is a use of the connection (so that
// one the other end keeps sending on is not closed here as idle or least
// recently used), and while the inbox is full the reader holds a lease on
// its connection: a frame in hand is a use in progress, as a write is.
func (c *conn) deliver(m Message) error {
	p := c.p
	if p.aging {
		p.touch(c.remote)
	}
	select {
	case p.inbox <- m:
		p.stats.received.Add(1)
		return nil
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
		return nil
	case <-p.done:
		return ErrClosed
	}
}

// shutdown closes a connection the cache has given up, gracefully where it
// can: it closes this end's sending side (the other end's reader sees the
// end once every frame written before has arrived, and the other end drops
// the connection, closing it once its own last writer is done), goes on
// reading until the other end has closed its side too (so that a frame the
// other end wrote meanwhile is delivered), and then closes the descriptor.
// The wait ends when the other end has been silent for HandshakeTimeout (it
// is hung, or its receiver has stopped taking frames), and at Close. A
// connection whose reader has stopped (it saw the other end close, or
// failed), or whose stream is broken, is closed at once. It must not run
// on the connection's reader, which it may wait for.
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
	graceful := !c.broken
	if graceful {
		cw, ok := c.nc.(interface{ CloseWrite() error })
		graceful = ok && cw.CloseWrite() == nil
	}
	c.wmu.Unlock()
	if graceful {
		t := time.NewTimer(p.hsTimeout)
		defer t.Stop()
		for seen := c.frames.Load(); ; {
			select {
			case <-c.readDone:
			case <-p.done:
			case <-t.C:
				if n := c.frames.Load(); n != seen {
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
