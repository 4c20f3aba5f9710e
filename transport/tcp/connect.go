package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
)

// link is what a peer knows about its connection to one other peer, under
// Peer.mu, beside what the endpoint cache holds. It is how the accept path
// and the cache's Create agree on one connection per pair; the package doc
// explains the protocol. The connection itself lives in the cache only: an
// accepted one goes in with Offer.
type link struct {
	// dialing is set while a Create call for this peer connects: from
	// after its lookup found an address to its return.
	dialing bool
	// dialed is the connection the last Create that succeeded returned:
	// the cache holds it, or is about to (it publishes after Create
	// returns), or has released it (then release clears this). The
	// acceptor decides against it while the cache does not hold it yet.
	dialed *conn
	// dropped is the nonce of the last endpoint given up, sent in the next
	// hello so that the other side knows its end is stale.
	dropped uint64
	// wake, if not nil, is closed when a connection from the other peer is
	// offered to the cache: a Create that lost a simultaneous connect waits
	// on it.
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

// create is the cache's Create: it dials peer r. A connection r opens to
// this peer meanwhile reaches the cache through Offer, which answers this
// creation and cancels ctx (cause epcache.ErrOffered): then create stops,
// and whatever it returns is dropped.
func (p *Peer) create(ctx context.Context, r int) (*conn, error) {
	// Not dialing yet: while the directory says "not yet", this peer is
	// not connecting, and a connection r opens meanwhile must be accepted
	// (and offered), not refused as a duplicate.
	addr, err := p.dir.Lookup(r)
	if err != nil {
		if errors.Is(err, directory.ErrNotPublished) {
			p.stats.notPublished.Add(1)
		}
		return nil, fmt.Errorf("tcp: connect to peer %d: %w", r, err)
	}

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	// Under the mutex that the accept path decides under: either r's
	// connection was offered already (ctx is cancelled, and this must not
	// dial, or r would take the hello for a newer connection), or it is
	// decided after this sets dialing.
	if ctx.Err() != nil {
		p.mu.Unlock()
		return nil, context.Cause(ctx)
	}
	lk := p.linkTo(r)
	lk.dialing = true
	dropped := lk.dropped
	p.mu.Unlock()

	c, lost, err := p.dial(ctx, r, addr, dropped)
	if lost {
		// r's own connection wins; this peer's accept path offers it to
		// the cache, which answers this creation.
		p.awaitOffer(ctx, lk)
	}
	p.mu.Lock()
	lk.dialing = false
	switch {
	case err != nil:
	case lost:
		err = fmt.Errorf("%w (connecting to peer %d; waited %v)", ErrSuperseded, r, p.hsTimeout)
	case p.closed:
		p.mu.Unlock()
		c.close(false)
		return nil, ErrClosed
	default:
		c.owned = true // the cache holds it, or releases it
		lk.dialed = c
		p.wg.Add(1)
		go p.runReader(c)
	}
	p.mu.Unlock()
	return c, err
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
		// Cut short by an Offer of r's own connection: the pair keeps that
		// one, and this is a duplicate.
		c.close(errors.Is(context.Cause(ctx), epcache.ErrOffered))
		if ctx.Err() != nil {
			return nil, false, err // the cause: CreateTimeout, Close, or an Offer
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
// connection is offered (the cache then cancels ctx too), ctx ends or
// HandshakeTimeout passes.
func (p *Peer) awaitOffer(ctx context.Context, lk *link) {
	p.mu.Lock()
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

// release is the cache's Release: once the last lease on c has ended (a
// Send holds one), c is closed, and r is told, in the next hello, that
// this end of it is stale.
func (p *Peer) release(r int, c *conn) {
	p.mu.Lock()
	if lk := p.links[r]; lk != nil {
		lk.dropped = c.nonce
		if lk.dialed == c {
			lk.dialed = nil
		}
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

// answer decides whether the connection c that peer h.from dialed is the
// pair's, offers it to the cache if it is, and writes the verdict. It
// reports whether c was accepted.
func (p *Peer) answer(c *conn, h hello) bool {
	c.remote, c.remoteInc, c.nonce = int(h.from), h.inc, h.nonce
	// Held until the verdict is written, so that a Send that gets c from
	// the cache meanwhile writes its frame after the verdict, not before.
	c.wmu.Lock()
	accept := p.decideAndOffer(c, &h)
	if accept {
		// r is alive: it just connected. A failure remembered for it (r died
		// and restarted) must not keep this peer from using the offer.
		p.cache.Forget(c.remote)
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
	if !accept {
		c.close(true)
	}
	return accept
}

// decideAndOffer applies the acceptor's rule (decide) to c and, if c is
// accepted, offers it to the cache. A held endpoint the rule finds stale is
// invalidated first, outside the mutex (its Release, once its leases end,
// closes it and takes the mutex). It returns false, having offered nothing,
// for a duplicate, or once Close has begun.
func (p *Peer) decideAndOffer(c *conn, h *hello) bool {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return false
		}
		lk := p.linkTo(c.remote)
		cur, ok := p.cache.Load(c.remote)
		if !ok {
			cur = lk.dialed // returned by Create, not yet published
		}
		accept, stale := decide(p.id, h, lk.dialing, cur)
		if stale != nil {
			p.mu.Unlock()
			if !p.cache.CompareAndInvalidate(stale.remote, stale) {
				runtime.Gosched() // not published yet: its Create has just returned
			}
			continue // decide again: a Send may have reconnected meanwhile
		}
		if !accept {
			p.mu.Unlock()
			return false
		}
		// Offered under the mutex that create checks before it dials, so
		// that a creation for r either stops (its ctx is cancelled) or was
		// dialing already (and then loses to c: see the package doc).
		c.owned = true
		if !p.cache.Offer(c.remote, c) {
			// The cache holds a value after all (a creation published it
			// between Load and Offer): decide again against it.
			c.owned = false
			p.mu.Unlock()
			continue
		}
		if lk.wake != nil {
			close(lk.wake)
			lk.wake = nil
		}
		p.mu.Unlock()
		return true
	}
}

// decide is the acceptor's rule, for acceptor me, a hello h from the peer at
// the other end of a link that is dialing or not, and cur, the endpoint the
// cache holds for that peer (nil: none): whether the new connection is
// accepted, and which held endpoint, if any, it makes stale (to be
// invalidated before the rule is applied again).
func decide(me int, h *hello, dialing bool, cur *conn) (accept bool, stale *conn) {
	if cur != nil && (cur.remoteInc != h.inc || cur.nonce == h.dropped || !cur.dialed) {
		// A new life of the peer, or an endpoint it says it dropped, or
		// one it dialed itself (it dials only when it holds no endpoint
		// to this peer): our end is stale.
		return false, cur
	}
	if (dialing || cur != nil) && int(h.from) > me {
		// Both peers connect at once: the lower id's connection wins.
		return false, nil
	}
	if cur != nil {
		// The lower id dialed while this peer holds its own connection: the
		// peer must have given that one up.
		return false, cur
	}
	return true, nil
}

// runReader is the reader goroutine of a connection this peer dialed.
func (p *Peer) runReader(c *conn) {
	defer p.wg.Done()
	p.readUntilEnd(c)
}

// readUntilEnd reads c's frames until it ends, then drops it: the cache
// gives it up if it holds it (and only it: a newer endpoint stays), and
// closes it once the Sends that hold it are done. A connection the cache
// never owned is closed here.
func (p *Peer) readUntilEnd(c *conn) {
	_ = c.readFrames() // EOF, an I/O error, a bad frame or Close: all end the connection
	if c.owned {
		p.cache.CompareAndInvalidate(c.remote, c)
		return // closed by the cache's Release, after the last lease
	}
	c.close(false)
}
