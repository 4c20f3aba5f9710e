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
	owned     bool          // the endpoint cache holds it (or released it): its Release closes it

	wmu     sync.Mutex // serialises frames; held by the acceptor until its verdict is written
	broken  bool       // under wmu: a write failed or was cut, so the frame stream is unusable
	writing atomic.Int32

	closeOnce sync.Once
}

// errBroken is what a write on a connection whose stream an earlier failed
// write cut returns. Send wraps it with its "tcp: send to peer N" prefix.
var errBroken = errors.New("connection broken by an earlier failed write")

// aLongTimeAgo is a deadline in the past: setting it aborts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// writeFrame writes one frame. ctx's deadline bounds the write, and ctx's
// cancellation aborts it; a write that fails or is aborted leaves the
// connection broken, since part of the frame may have been sent.
func (c *conn) writeFrame(ctx context.Context, payload []byte) error {
	var head [frameHead]byte
	binary.BigEndian.PutUint32(head[:], uint32(len(payload)))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.broken {
		return errBroken
	}
	deadline, _ := ctx.Deadline()
	if err := c.nc.SetWriteDeadline(deadline); err != nil {
		c.broken = true
		return err
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
	_, err := bufs.WriteTo(c.nc)
	c.writing.Add(-1)
	if stop != nil && !stop() {
		// The abort ran or is running: let it finish before the next
		// writer sets its own deadline.
		<-fired
	}
	if err != nil {
		c.broken = true
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
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
		select {
		case p.inbox <- Message{From: c.remote, Payload: payload}:
			p.stats.received.Add(1)
		case <-p.done:
			return ErrClosed
		}
	}
}

// close closes the connection once, counting it; dup says it is closed
// because the pair keeps another connection. It takes Peer.mu: never call
// it with Peer.mu held.
func (c *conn) close(dup bool) {
	c.closeOnce.Do(func() {
		if c.writing.Load() != 0 {
			c.p.stats.closedUnderWriter.Add(1) // only Close may do this: see TestNoCloseUnderAWriter
		}
		_ = c.nc.Close()
		c.p.stats.closed.Add(1)
		if dup {
			c.p.stats.duplicates.Add(1)
		}
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// String names the connection in test failures.
func (c *conn) String() string {
	return fmt.Sprintf("%v->%v (peer %d, nonce %x)", c.nc.LocalAddr(), c.nc.RemoteAddr(), c.remote, c.nonce)
}
