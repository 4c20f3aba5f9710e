package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/epcache/epcache/transport/directory"
)

// link is what a peer knows about its connection to one other peer, under
// Peer.mu. It is how the accept path and the cache's Create agree on one
// connection per pair; the package doc explains the protocol.
type link struct {
	// current is the endpoint Create last returned: held by the cache, or
	// about to be. Release (and the next Create, which runs only once the
	// cache holds none) clears it.
	current *conn
	// offered is a connection accepted from the other peer that no Create
	// has adopted yet. Its reader runs meanwhile.
	offered *conn
	// dialing is set while a Create call for this peer connects: from
	// after its lookup found an address (and no connection was offered)
	// to its return.
	dialing bool
	// dropped is the nonce of the last endpoint given up, sent in the next
	// hello so that the other side knows its end is stale.
	dropped uint64
	// wake, if not nil, is closed when a connection is offered: a Create
	// that lost a simultaneous connect waits on it.
	wake chan struct{}
}

// linkTo returns the link to peer r. p.mu must be held.
func (p *Peer) linkTo(r int) *link {
	lk := p.links[r]
	if lk == nil {
		lk = &link{}
		p.links[r] = lk
	}
	return lk
}

// create is the cache's Create: it returns the connection to peer r, adopting
// one r opened if there is one, and dialing otherwise.
func (p *Peer) create(ctx context.Context, r int) (*conn, error) {
	p.mu.Lock()
	lk := p.linkTo(r)
	if cur := lk.current; cur != nil {
		// The cache no longer holds it (Create runs only on a miss): its
		// Release is on the way. Tell r, in the hello, that it is stale.
		lk.dropped, lk.current = cur.nonce, nil
	}
	c, err := p.adopt(lk)
	p.mu.Unlock()
	if c != nil || err != nil {
		return c, err
	}

	// Not dialing yet: while the directory says "not yet", this peer is
	// not connecting, and a connection r opens meanwhile must be accepted
	// (and adopted by the next attempt), not refused as a duplicate.
	addr, err := p.dir.Lookup(r)
	if err != nil {
		if errors.Is(err, directory.ErrNotPublished) {
			p.stats.notPublished.Add(1)
		}
		return nil, fmt.Errorf("tcp: connect to peer %d: %w", r, err)
	}

	p.mu.Lock()
	c, err = p.adopt(lk) // r may have connected during the lookup
	if c == nil && err == nil {
		lk.dialing = true
	}
	dropped := lk.dropped
	p.mu.Unlock()
	if c != nil || err != nil {
		return c, err
	}

	c, lost, err := p.dial(ctx, r, addr, dropped)
	if lost {
		p.awaitOffer(ctx, lk)
	}

	var (
		toClose *conn // closed after unlocking: close takes p.mu
		dup     bool
	)
	p.mu.Lock()
	lk.dialing = false
	switch {
	case err != nil:
	case lost:
		if c = lk.offered; c != nil {
			lk.offered, lk.current = nil, c
		} else {
			err = fmt.Errorf("%w (connecting to peer %d; waited %v)", ErrSuperseded, r, p.hsTimeout)
		}
	case p.closed:
		toClose, c, err = c, nil, ErrClosed
	default:
		// Our connection won. An offer that arrived meanwhile is one r has
		// given up already (it dialed again): a duplicate.
		toClose, dup, lk.offered = lk.offered, true, nil
		lk.current = c
		p.wg.Add(1)
		go p.runReader(c)
	}
	p.mu.Unlock()
	if toClose != nil {
		toClose.close(dup)
	}
	return c, err
}

// adopt takes the connection offered on lk, if any, as the endpoint. It
// returns ErrClosed once Close has begun. p.mu must be held.
func (p *Peer) adopt(lk *link) (*conn, error) {
	if p.closed {
		return nil, ErrClosed
	}
	c := lk.offered
	if c != nil {
		lk.offered, lk.current = nil, c
	}
	return c, nil
}

// dial connects to peer r at addr and runs the dialer's side of the
// handshake. lost reports a duplicate verdict: r is dialing this peer too,
// and its connection wins.
func (p *Peer) dial(ctx context.Context, r int, addr string, dropped uint64) (c *conn, lost bool, err error) {
	p.stats.dialAttempts.Add(1)
	nc, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, fmt.Errorf("tcp: connect to peer %d: %w", r, err)
	}
	p.stats.dialed.Add(1)
	c = &conn{p: p, nc: nc, remote: r, nonce: nonZeroRandom(), dialed: true}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close(false)
		return nil, false, ErrClosed
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()

	h := hello{from: uint32(p.id), to: uint32(r), inc: p.inc, nonce: c.nonce, dropped: dropped}
	rep, err := c.handshake(ctx, p.hsTimeout, &h)
	switch {
	case err != nil:
		c.close(false)
		if ctx.Err() != nil {
			return nil, false, err // the cause: CreateTimeout or Close
		}
		return nil, false, fmt.Errorf("%w with peer %d at %s: %w", ErrHandshake, r, addr, err)
	case rep.verdict == verdictDuplicate:
		c.close(true)
		return nil, true, nil
	case rep.verdict == verdictRefused:
		c.close(false)
		return nil, false, fmt.Errorf("%w with peer %d at %s: refused: %v", ErrHandshake, r, addr, rep.reason)
	case int(rep.from) != r: // cannot happen with a peer of this package: it refuses hellos for others
		c.close(false)
		return nil, false, fmt.Errorf("%w with peer %d at %s: peer %d answered", ErrHandshake, r, addr, rep.from)
	}
	c.remoteInc = rep.inc
	return c, false, nil
}

// handshake sends h and reads the reply, within timeout and ctx.
func (c *conn) handshake(ctx context.Context, timeout time.Duration, h *hello) (reply, error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.nc.SetDeadline(deadline); err != nil {
		return reply{}, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	b := h.marshal()
	_, err := c.nc.Write(b[:])
	var rep reply
	if err == nil {
		c.br = bufio.NewReader(c.nc)
		var rb [replySize]byte
		if _, err = io.ReadFull(c.br, rb[:]); err == nil {
			rep, err = parseReply(&rb)
		}
	}
	if !stop() {
		return reply{}, context.Cause(ctx) // the deadline is in the past: the connection is useless
	}
	if err == nil {
		err = c.nc.SetDeadline(time.Time{})
	}
	return rep, err
}

// awaitOffer waits, after a lost simultaneous connect, until the winning
// connection is offered, ctx ends or HandshakeTimeout passes.
func (p *Peer) awaitOffer(ctx context.Context, lk *link) {
	p.mu.Lock()
	if lk.offered != nil {
		p.mu.Unlock()
		return
	}
	if lk.wake == nil {
		lk.wake = make(chan struct{})
	}
	wake := lk.wake
	p.mu.Unlock()
	t := time.NewTimer(p.hsTimeout)
	defer t.Stop()
	select {
	case <-wake:
	case <-t.C:
	case <-ctx.Done():
	}
}

// release is the cache's Release.
func (p *Peer) release(r int, c *conn) {
	p.mu.Lock()
	if lk := p.links[r]; lk != nil && lk.current == c {
		lk.current, lk.dropped = nil, c.nonce
	}
	p.mu.Unlock()
	c.close(false)
}

// serve runs the acceptor's side of the handshake on an accepted connection
// and, if the connection is accepted, reads its frames until it ends.
func (p *Peer) serve(c *conn) {
	defer p.wg.Done()
	h, ok := p.readHello(c)
	if ok && p.answer(c, h) {
		p.readUntilEnd(c)
	}
}

// readHello reads and checks the hello of an accepted connection. A
// connection that sends no hello within HandshakeTimeout, or something
// that is not a hello, is closed without a word; a hello this peer cannot
// accept is refused with a reason. Both count in Stats.Refused.
func (p *Peer) readHello(c *conn) (hello, bool) {
	c.br = bufio.NewReader(c.nc)
	var b [helloSize]byte
	err := c.nc.SetDeadline(time.Now().Add(p.hsTimeout))
	if err == nil {
		_, err = io.ReadFull(c.br, b[:])
	}
	var h hello
	if err == nil {
		h, err = parseHello(&b)
	}
	if err != nil {
		p.stats.refused.Add(1)
		c.close(false)
		return hello{}, false
	}
	why := reasonNone
	switch {
	case int64(h.to) != int64(p.id):
		why = reasonWrongPeer
	case int64(h.from) >= int64(p.dir.Size()):
		why = reasonUnknownPeer
	case int64(h.from) == int64(p.id):
		why = reasonSelf
	}
	if why != reasonNone {
		p.refuse(c, why)
		return hello{}, false
	}
	return h, true
}

// refuse answers a hello with a refusal and closes the connection.
func (p *Peer) refuse(c *conn, why reason) {
	p.stats.refused.Add(1)
	rep := reply{verdict: verdictRefused, reason: why, from: uint32(p.id), inc: p.inc}
	b := rep.marshal()
	_, _ = c.nc.Write(b[:]) // best effort: the deadline of the hello still holds
	c.close(false)
}

// answer decides, under p.mu, whether the connection c that peer h.from
// dialed is the pair's, and writes the verdict. It reports whether c was
// accepted (and offered to the cache).
func (p *Peer) answer(c *conn, h hello) bool {
	c.remote, c.remoteInc, c.nonce = int(h.from), h.inc, h.nonce
	// Held until the verdict is written, so that a Send that adopts c
	// meanwhile writes its frame after the verdict, not before.
	c.wmu.Lock()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.wmu.Unlock()
		p.refuse(c, reasonClosing)
		return false
	}
	lk := p.linkTo(c.remote)
	accept, stale := lk.decide(p.id, &h)
	var dup *conn
	if accept {
		// An older offer is one the peer gave up: it dialed again.
		dup, lk.offered = lk.offered, c
		if lk.wake != nil {
			close(lk.wake)
			lk.wake = nil
		}
	}
	p.mu.Unlock()
	if accept {
		// r is alive: it just connected. A failure remembered for it (r died
		// and restarted) must not keep this peer from using the offer.
		p.cache.Forget(c.remote)
	}
	if stale != nil {
		// Dropped before the verdict is written, so that once the dialer
		// has its answer, no Send here picks the stale endpoint.
		p.cache.CompareAndInvalidate(stale.remote, stale)
		stale.close(false)
	}

	v := verdictDuplicate
	if accept {
		v = verdictAccept
	}
	rep := reply{verdict: v, from: uint32(p.id), inc: p.inc}
	b := rep.marshal()
	_, err := c.nc.Write(b[:])
	if err == nil {
		err = c.nc.SetDeadline(time.Time{})
	}
	if err != nil {
		c.broken = true // the reader will fail too, and drop c
	}
	c.wmu.Unlock()
	if dup != nil {
		dup.close(true)
	}
	if !accept {
		c.close(true)
	}
	return accept
}

// decide is the acceptor's rule, for acceptor me and a hello h from the
// peer at the other end of lk: whether the new connection is accepted, and
// which current endpoint, if any, it makes stale (decide clears current).
// p.mu must be held.
func (lk *link) decide(me int, h *hello) (accept bool, stale *conn) {
	if cur := lk.current; cur != nil && (cur.remoteInc != h.inc || cur.nonce == h.dropped || !cur.dialed) {
		// A new life of the peer, or an endpoint it says it dropped, or
		// one it dialed itself (it dials only when it holds no endpoint
		// to this peer): our end is stale.
		stale, lk.current = cur, nil
	}
	if (lk.dialing || lk.current != nil) && int(h.from) > me {
		// Both peers connect at once: the lower id's connection wins.
		return false, stale
	}
	if lk.current != nil {
		// The lower id dialed while this peer holds its own connection: the
		// peer must have given that one up.
		stale, lk.current = lk.current, nil
	}
	return true, stale
}

// runReader is the reader goroutine of a connection this peer dialed.
func (p *Peer) runReader(c *conn) {
	defer p.wg.Done()
	p.readUntilEnd(c)
}

// readUntilEnd reads c's frames until it ends, then drops it: it is no
// longer offered, the cache gives it up if it holds it (and only it: a
// newer endpoint stays), and it is closed.
func (p *Peer) readUntilEnd(c *conn) {
	_ = c.readFrames() // EOF, an I/O error, a bad frame or Close: all end the connection
	p.mu.Lock()
	if lk := p.links[c.remote]; lk != nil && lk.offered == c {
		lk.offered = nil
	}
	p.mu.Unlock()
	p.cache.CompareAndInvalidate(c.remote, c)
	c.close(false)
}
