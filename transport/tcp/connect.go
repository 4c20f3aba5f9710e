package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/internal/resolve"
)

// link is what a peer knows about its connection to one other peer, under
// Peer.mu, beside what the endpoint cache holds. It is how the accept path
// and the cache's Create agree on one connection per pair; the package doc
// explains the protocol. The connection itself lives in the cache only: an
// accepted one goes in with Offer, or through the Create running for the
// peer (inbound).
type link struct {
	// creating is set while a Create call for this peer runs: an accepted
	// connection from the peer may be handed to it (inbound).
	creating bool
	// dialing is set while a Create call for this peer connects: from
	// after its lookup found an address to its return.
	dialing bool
	// dialConn is the connection of the Create's last dial, from the
	// connect call to the Create's end: a hand-off cuts its handshake short
	// (if it has not ended), and a hello that names it as dropped makes it
	// stale (superseded) while it is still in flight.
	dialConn *conn
	// dialed is the connection the last Create that succeeded returned
	// (dialed, or handed to it): the cache holds it, or is about to (it
	// publishes after Create returns), or has released it (then release
	// clears this). The acceptor decides against it while the cache does
	// not hold it yet.
	dialed *conn
	// inbound, with MaxConns, is an accepted connection from the peer that
	// the acceptor hands to the running Create when the cache has no room
	// for an Offer: that Create returns it, in its own room. The acceptor's
	// slot covers it until then.
	inbound *conn
	// crossed is set when the acceptor answers "duplicate" to a hello from
	// the peer while this peer dials it: if this dial is then answered
	// "busy", the peer's attempt, which waits for this one, is the peer
	// connecting back, and this peer dials again at once.
	crossed bool
	// last is the nonce of the last connection from the other peer that
	// this peer's acceptor admitted (offered to the cache, or handed to a
	// Create). A hello names it as dropped. A Create runs only while the
	// cache holds no endpoint for the peer, so by the time it reads this,
	// this peer has given that connection up (invalidated, evicted,
	// removed for idleness, or dropped by endCreate in favour of its own
	// dial), whether or not its Release has run. Only a connection the
	// other peer dialed needs naming: one this peer dialed is stale at the
	// other end as soon as this peer dials again (decide). One admitted
	// after the hello was built is not named, and the other end keeps it:
	// it answered this creation (Offer, hand-off). (The hello named the
	// last connection released instead: for as long as a Send held a lease
	// on it, or an eviction's Release had not started, and for a handed-
	// over connection that endCreate dropped, the hello named an older one,
	// the other side kept its end and answered "duplicate", and the Create
	// waited HandshakeTimeout for a winner that this peer had dropped.)
	last uint64
	// wake, if not nil, is closed when a connection from the other peer is
	// offered to the cache or handed to the running Create: a Create that
	// lost a simultaneous connect, or was answered "busy", waits on it.
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

// wakeLink wakes a Create waiting for a connection from lk's peer. p.mu
// must be held.
func wakeLink(lk *link) {
	if lk.wake != nil {
		close(lk.wake)
		lk.wake = nil
	}
}

// create is the cache's Create: it dials peer r. A connection r opens to
// this peer meanwhile reaches the cache through Offer, which answers this
// creation and cancels ctx (cause epcache.ErrOffered): then create stops,
// and whatever it returns is dropped. With MaxConns, when the cache has no
// room for an Offer, the acceptor hands the connection to this creation
// instead, and create returns it, whatever its own attempt came to.
func (p *Peer) create(ctx context.Context, r int) (*conn, error) {
	p.mu.Lock()
	lk := p.linkTo(r)
	lk.creating = true
	p.mu.Unlock()
	c, err := p.connect(ctx, r, lk)
	return p.endCreate(r, lk, c, err)
}

// connect is create's attempt: a lookup, a dial and its handshake, and
// after a lost simultaneous connect or a "busy", a wait for r's own
// connection. It returns nil and a nil error when a connection was handed
// to the creation before it dialed.
//
// A dial that finds the address stale (nothing listens there any more, or
// another peer answers) is reported to the directory (Unreachable, for a
// directory.Resolver) and, if the directory now has another address for r
// (r published again while this attempt ran), made again to that one: a
// failure of r's previous life is not r's.
func (p *Peer) connect(ctx context.Context, r int, lk *link) (*conn, error) {
	// Not dialing yet: while the directory says "not yet", this peer is
	// not connecting, and a connection r opens meanwhile must be accepted
	// (and offered), not refused as a duplicate.
	addr, err := resolve.Lookup(ctx, p.dir, r, &p.stats.notPublished)
	if err != nil {
		return nil, &attemptError{err: fmt.Errorf("tcp: connect to peer %d: %w", r, err)}
	}
	for {
		c, err := p.connectTo(ctx, r, lk, addr)
		var se staleError
		if err == nil || !errors.As(err, &se) {
			return c, err
		}
		resolve.Unreachable(p.dir, r, addr)
		next, lerr := p.dir.Lookup(r)
		if lerr != nil || next == addr {
			return nil, err
		}
		addr = next
	}
}

// connectTo is one attempt of connect's at addr.
func (p *Peer) connectTo(ctx context.Context, r int, lk *link, addr string) (*conn, error) {
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return nil, ErrClosed
	case ctx.Err() != nil:
		// Under the mutex that the accept path decides under: either r's
		// connection was offered already (ctx is cancelled, and this must
		// not dial, or r would take the hello for a newer connection), or
		// it is decided after this sets dialing.
		p.mu.Unlock()
		return nil, context.Cause(ctx)
	case lk.inbound != nil:
		p.mu.Unlock()
		return nil, nil // r's connection was handed over: endCreate takes it
	}
	lk.dialing, lk.crossed = true, false
	dropped := lk.last
	p.mu.Unlock()

	c, out, err := p.dial(ctx, lk, r, addr, dropped)
	for out != accepted {
		// No connection of this peer's in flight any more: r's, when it
		// comes, is accepted, whatever the ids (decide).
		p.mu.Lock()
		lk.dialing = false
		again := out == busy && lk.crossed && lk.inbound == nil && ctx.Err() == nil && !p.closed
		if again {
			// r answered "busy" and connected back at once, while this
			// dial still waited for the answer, so this peer answered r
			// "duplicate": r's attempt now waits, in room of its own, for
			// this peer's connection. Dial again: r takes it by hand-off.
			lk.dialing, lk.crossed = true, false
		}
		p.mu.Unlock()
		if !again {
			break
		}
		c, out, err = p.dial(ctx, lk, r, addr, dropped)
	}
	switch out {
	case lost:
		// r's own connection wins; this peer's accept path offers it to
		// the cache, which answers this creation, or hands it over.
		p.awaitInbound(ctx, lk)
		err = fmt.Errorf("%w (connecting to peer %d; waited %v)", ErrSuperseded, r, p.hsTimeout)
	case busy:
		// r had no room, and connects back once it has. The lower id keeps
		// its room meanwhile and takes r's connection when it comes; the
		// higher gives its room up at once and its Sends try again, so
		// that no peer holds room while it waits for a lower one's (see
		// the package doc: that is what keeps a full mesh from
		// deadlocking).
		if p.id < r {
			p.awaitInbound(ctx, lk)
		}
		err = fmt.Errorf("%w (peer %d)", ErrBusy, r)
	case late:
		// r's acceptor had others waiting, and did not see this hello in
		// time: nothing of r's is wrong. The Send tries again, as after
		// "busy", but r does not connect back.
		err = fmt.Errorf("%w (peer %d: the hello was late, and others waited)", ErrBusy, r)
	default:
		if err != nil && !errors.Is(err, ErrClosed) && (ctx.Err() == nil || !errors.Is(err, context.Cause(ctx))) {
			err = &attemptError{addr: addr, err: err}
		}
	}
	return c, err
}

// attemptError is a failure to reach a peer at an address (addr; "" when
// the lookup failed): a Send that gets it back, remembered or not, compares
// addr with what the directory says now, so that a failure of the peer's
// previous life does not hold Sends to the new one back (see Send). It
// reads and wraps as its err.
type attemptError struct {
	addr string
	err  error
}

func (e *attemptError) Error() string { return e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

// staleError marks a dial's failure that says the address no longer
// belongs to the peer: nothing listens there, or another peer answers. It
// reads and wraps as the error it holds.
type staleError struct{ error }

func (e staleError) Unwrap() error { return e.error }

// endCreate ends a Create call: it takes the connection the acceptor
// handed over meanwhile, if any, in place of the attempt's outcome, and
// starts the reader of a connection this peer dialed.
func (p *Peer) endCreate(r int, lk *link, c *conn, err error) (*conn, error) {
	p.mu.Lock()
	lk.creating, lk.dialing, lk.dialConn = false, false, nil
	in := lk.inbound
	lk.inbound = nil
	if p.closed {
		p.mu.Unlock()
		for _, x := range []*conn{c, in} {
			if x != nil {
				x.close(false)
			}
		}
		return nil, ErrClosed
	}
	var drop *conn
	switch {
	case in != nil && c != nil && c.superseded.Load():
		// r accepted this dial, then gave it up and dialed again: keep
		// r's connection, in the creation's room. The dial is closed like
		// one the cache gives up, and read to its end meanwhile (r may
		// have written on it); it holds the accept slot, which r's
		// connection held, until it is closed.
		drop, c = c, in
		if in.slot.Swap(false) {
			drop.slot.Store(true)
		}
		drop.owned = true
		p.wg.Add(1)
		go p.runReader(drop)
	case in != nil && c != nil:
		// r accepted this dial after all, which it does only once it has
		// given up the connection it handed us: keep the dial.
		drop = in
	case in != nil:
		c, err = in, nil
		in.releaseSlot() // the creation's room covers it now (its own dial, if any, is closed)
	case c == nil && err == nil:
		err = fmt.Errorf("%w (connecting to peer %d)", ErrSuperseded, r) // cannot happen: inbound is taken here only
	}
	if err == nil {
		lk.dialed = c
		if c.dialed {
			c.owned = true // the cache holds it, or releases it (a handed-over one is owned already)
			p.wg.Add(1)
			go p.runReader(c)
		}
	}
	if drop != nil {
		p.wg.Add(1)
	}
	p.mu.Unlock()
	if drop != nil {
		// Closed like a connection the cache gives up (its slot covers it
		// until then), on a goroutine: its other end is closing it.
		go func() {
			defer p.wg.Done()
			drop.released.Store(true)
			drop.shutdown()
		}()
	}
	return c, err
}

// outcome is how a dial's handshake ended, when it did not fail.
type outcome uint8

const (
	accepted outcome = iota // the connection is the pair's
	lost                    // "duplicate": r is dialing this peer too, and its connection wins
	busy                    // "busy": r has no room for a connection now
	late                    // "late": r's acceptor cut this connection before it read the hello, as others waited
)

// dial connects to peer r at addr and runs the dialer's side of the
// handshake.
func (p *Peer) dial(ctx context.Context, lk *link, r int, addr string, dropped uint64) (c *conn, out outcome, err error) {
	p.stats.dialAttempts.Add(1)
	p.stats.fdOpening()
	nc, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		p.stats.fdClosed()
		err = fmt.Errorf("tcp: connect to peer %d: %w", r, err)
		if errors.Is(err, syscall.ECONNREFUSED) {
			err = staleError{err} // nothing listens there
		}
		return nil, accepted, err
	}
	p.stats.dialed.Add(1)
	c = newConn(p, nc)
	c.remote, c.nonce, c.dialed, c.addr = r, nonZeroRandom(), true, addr
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close(false)
		return nil, accepted, ErrClosed
	}
	p.conns[c] = struct{}{}
	lk.dialConn = c
	if lk.inbound != nil {
		c.cutShort() // handed r's own connection while it connected
	}
	p.mu.Unlock()

	h := hello{from: uint32(p.id), to: uint32(r), inc: p.inc, nonce: c.nonce, dropped: dropped}
	rep, err := c.handshake(ctx, p.hsTimeout, &h)
	switch {
	case err == nil && rep.verdict == verdictAccept && int(rep.from) == r && ctx.Err() != nil:
		// Accepted, but an Offer answered this creation meanwhile (or
		// CreateTimeout or Close ended it): r holds the connection and may
		// be writing on it already. Returned all the same: the cache
		// releases it, gracefully, so that r's frames are delivered.
	case err != nil:
		// Cut short by an Offer of r's own connection, or by its hand-off
		// to this creation: the pair keeps that one, and this is a
		// duplicate.
		c.close(errors.Is(context.Cause(ctx), epcache.ErrOffered) || c.wasCut())
		if ctx.Err() != nil {
			return nil, accepted, err // the cause: CreateTimeout, Close, or an Offer
		}
		return nil, accepted, fmt.Errorf("%w with peer %d at %s: %w", ErrHandshake, r, addr, err)
	case rep.verdict == verdictDuplicate:
		c.close(true)
		return nil, lost, nil
	case rep.verdict == verdictRefused && rep.reason == reasonBusy:
		c.close(false)
		return nil, busy, nil
	case rep.verdict == verdictRefused && rep.reason == reasonLate:
		c.close(false)
		return nil, late, nil
	case rep.verdict == verdictRefused:
		c.close(false)
		err := fmt.Errorf("%w with peer %d at %s: refused: %v", ErrHandshake, r, addr, rep.reason)
		if rep.reason == reasonWrongPeer {
			err = staleError{err} // the address is another peer's now
		}
		return nil, accepted, err
	case int(rep.from) != r: // cannot happen with a peer of this package: it refuses hellos for others
		c.close(false)
		return nil, accepted, staleError{fmt.Errorf("%w with peer %d at %s: peer %d answered", ErrHandshake, r, addr, rep.from)}
	}
	c.remoteInc = rep.inc
	return c, accepted, nil
}

// handshake sends h and reads the reply, within timeout and ctx. A reply
// that arrives is returned even if ctx ends, the timeout passes or the
// acceptor cuts the dial short (cutShort) meanwhile: the remote has
// decided, and may be writing on the connection already. That includes a
// reply already in the socket, but not read yet, when the read was cut
// (arrived): closed unread, it would take with it the frames the remote
// wrote after it, and the remote's Sends would have returned nil for them.
func (c *conn) handshake(ctx context.Context, timeout time.Duration, h *hello) (reply, error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.hsMu.Lock()
	err := c.nc.SetDeadline(deadline)
	if c.cut {
		err = errors.New("tcp: dial cut short: the peer's own connection was handed over")
	}
	c.hsMu.Unlock()
	if err != nil {
		return reply{}, err
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = c.nc.SetDeadline(aLongTimeAgo)
	})
	b := h.marshal()
	_, err = c.nc.Write(b[:])
	wrote := err == nil
	var (
		rb [replySize]byte
		n  int
	)
	if wrote {
		n, err = io.ReadFull(c.br, rb[:])
	}
	cancelled := !stop()
	if cancelled {
		<-fired // the deadline is in the past now, and stays there
	}
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	c.hsDone = true // no cut from now on
	if wrote && errors.Is(err, os.ErrDeadlineExceeded) && arrived(c, replySize-n) {
		// Cut, cancelled or timed out with the reply already here.
		if err = c.nc.SetDeadline(time.Time{}); err == nil {
			_, err = io.ReadFull(c.br, rb[n:])
		}
	}
	var rep reply
	if err == nil {
		rep, err = parseReply(&rb)
	}
	switch {
	case err != nil && cancelled:
		return reply{}, context.Cause(ctx) // cut short
	case err == nil:
		err = c.nc.SetDeadline(time.Time{}) // after any cut's
	}
	return rep, err
}

// arrived reports whether n more bytes of c can be read without waiting:
// buffered, or in the socket.
func arrived(c *conn, n int) bool {
	n -= c.br.Buffered()
	return n <= 0 || readable(c.nc, n) >= n
}

// awaitInbound waits, after a lost simultaneous connect or a "busy", until
// r's connection is offered (the cache then cancels ctx too) or handed to
// this creation, ctx ends or HandshakeTimeout passes.
func (p *Peer) awaitInbound(ctx context.Context, lk *link) {
	p.mu.Lock()
	if lk.inbound != nil {
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

// release is the cache's Release: once the last lease on c has ended (a
// Send holds one), c is closed, gracefully (shutdown: every frame the other
// end wrote before it saw this end close is delivered). It returns once the
// descriptor is closed, so that the cache's room (MaxConns) covers it until
// then.
func (p *Peer) release(r int, c *conn) {
	c.released.Store(true)
	close(c.left) // Release runs once per value
	p.mu.Lock()
	if lk := p.links[r]; lk != nil && lk.dialed == c {
		lk.dialed = nil
	}
	p.mu.Unlock()
	c.shutdown()
}

// drop gives c up as peer c.remote's endpoint, as a failure report does
// (CompareAndInvalidate: a newer endpoint stays), and returns once c has
// left the cache, so that the next Get for the peer does not return it.
// Its Release, which closes it gracefully and may wait for the other end
// for up to HandshakeTimeout, runs on a goroutine of its own when this
// call is the one that runs it: neither a Send nor the acceptor waits for
// it. (The acceptor did: a restarted peer's hello waited, with the same
// budget, for the stale endpoint of its hung previous life to close, and
// gave up first.)
func (p *Peer) drop(c *conn) {
	c.givenUp.Store(true)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return // Close releases it
	}
	p.wg.Add(1)
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer p.wg.Done()
		defer close(done)
		p.cache.CompareAndInvalidate(c.remote, c)
	}()
	select {
	case <-done: // dropped, its release left to its last lease; or not the endpoint
	case <-c.left: // released, or being released: out of the cache
	}
}

// serve runs the acceptor's side of the handshake on an accepted connection
// and, if the connection is accepted, reads its frames until it ends. After
// answering "busy", it connects back to the dialer once this peer has room.
func (p *Peer) serve(c *conn) {
	defer p.wg.Done()
	h, ok := p.readHello(c)
	if !ok {
		return
	}
	switch p.answer(c, h) {
	case admitted:
		p.readUntilEnd(c)
	case noRoom:
		p.connectBack(int(h.from))
	}
}

// connectBack makes the connection to r that r could not make: a Get,
// which waits for room in line with this peer's Sends (evicting the least
// recently used connection), then dials r, which takes the connection in
// the room its own creation kept (r is the lower id), or answers "busy" in
// turn (then r connects back, and so on: see the package doc). A failure
// remembered for r is no reason not to try: r just connected.
//
// This peer may evict the connection as soon as it is made, if its own
// Sends wait for room: r's frames are delivered all the same, since this
// end reads until r closes its side (see shutdown), and r writes on a
// connection whose other end is closing (see Send).
func (p *Peer) connectBack(r int) {
	p.cache.Forget(r)
	_, _ = p.cache.Get(p.ctx, r)
}

// readHello reads and checks the hello of an accepted connection. A
// connection that sends no hello within HandshakeTimeout, or something
// that is not a hello, is closed without a word; a hello this peer cannot
// accept is refused with a reason. Both count in Stats.Refused.
func (p *Peer) readHello(c *conn) (hello, bool) {
	var b [helloSize]byte
	budget := p.hsTimeout
	if p.acceptSlot != nil {
		budget = p.helloGrace
	}
	err := c.nc.SetDeadline(time.Now().Add(budget))
	if err == nil {
		_, err = io.ReadFull(c.br, b[:])
	}
	var h hello
	if err == nil {
		h, err = parseHello(&b)
	}
	if err == nil && c.br.Buffered() == 0 && peerGone(c.nc) {
		// The dialer gave up after its hello (its attempt was cut short,
		// timed out, or its process ended) while the connection waited in
		// the backlog. Offered, it would answer the Sends waiting for the
		// dialer, which would write their frames into a connection nobody
		// reads, and report them sent (TestAbandonedDialIsNotTaken).
		p.stats.abandoned.Add(1)
		c.close(false)
		return hello{}, false
	}
	if err != nil {
		if p.acceptSlot != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			// It held the accept slot for helloGrace without a hello, while
			// other connections may wait in the backlog: a stranger, or a
			// dialer much slower than the connection it made. The answer
			// tells a dialer of this package to try again. (A fresh
			// deadline: the hello's has passed. Twenty bytes into an
			// empty socket buffer do not wait.)
			_ = c.nc.SetWriteDeadline(time.Now().Add(p.helloGrace))
			p.refuse(c, reasonLate)
			return hello{}, false
		}
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

// admission is the acceptor's decision on a connection.
type admission uint8

const (
	duplicate admission = iota // the pair keeps another connection
	admitted                   // the connection is the pair's: offered to the cache, or handed to its Create
	noRoom                     // MaxConns: the cache has no room for it now; "busy"
	closing                    // Close has begun
)

// answer decides whether the connection c that peer h.from dialed is the
// pair's, gives it to the cache if it is, and writes the verdict.
func (p *Peer) answer(c *conn, h hello) admission {
	c.remote, c.remoteInc, c.nonce = int(h.from), h.inc, h.nonce
	// Held until the verdict is written, so that a Send that gets c from
	// the cache meanwhile writes its frame after the verdict, not before.
	c.wmu.Lock()
	adm := p.decideAndOffer(c, &h)
	rep := reply{verdict: verdictDuplicate, from: uint32(p.id), inc: p.inc}
	switch adm {
	case admitted:
		// r is alive: it just connected. A failure remembered for it (r died
		// and restarted) must not keep this peer from using the offer.
		p.cache.Forget(c.remote)
		rep.verdict = verdictAccept
	case noRoom:
		p.stats.busy.Add(1)
		rep.verdict, rep.reason = verdictRefused, reasonBusy
	case closing:
		p.stats.refused.Add(1)
		rep.verdict, rep.reason = verdictRefused, reasonClosing
	}
	b := rep.marshal()
	_, err := c.nc.Write(b[:])
	if err == nil {
		err = c.nc.SetDeadline(time.Time{})
	}
	if err != nil {
		c.breakStream() // the reader will fail too, and drop c
	}
	c.wmu.Unlock()
	if adm != admitted {
		c.close(adm == duplicate)
	}
	return adm
}

// decideAndOffer applies the acceptor's rule (decide) to c and, if c is
// accepted, gives it to the cache: with Offer, or, where the cache has no
// room for an Offer (MaxConns), by handing it to the Create running for its
// peer, whose room it takes; failing both, c is not admitted (noRoom). A
// held endpoint the rule finds stale is invalidated first, outside the
// mutex, and without waiting for its Release (drop). It returns duplicate,
// having offered nothing, for a duplicate, and closing once Close has begun.
func (p *Peer) decideAndOffer(c *conn, h *hello) admission {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return closing
		}
		lk := p.linkTo(c.remote)
		cur, ok := p.cache.Load(c.remote)
		if !ok && lk.dialed != nil && !lk.dialed.givenUp.Load() {
			// Returned by Create, not yet published. One given up
			// already counts as gone: if it is published after all, the
			// Offer below fails, and it is found stale again, in the
			// cache; otherwise the Offer answers its creation, and it is
			// released.
			cur = lk.dialed
		}
		accept, stale := decide(p.id, h, lk.dialing, lk.dialConn, cur)
		if d := lk.dialConn; lk.dialing && d != nil && d.nonce == h.dropped {
			d.superseded.Store(true)
		}
		if stale != nil {
			p.mu.Unlock()
			p.drop(stale)
			continue // decide again: a Send may have reconnected meanwhile
		}
		if !accept {
			lk.crossed = lk.crossed || lk.dialing
			p.mu.Unlock()
			return duplicate
		}
		// Offered under the mutex that create checks before it dials, so
		// that a creation for r either stops (its ctx is cancelled) or was
		// dialing already (and then loses to c: see the package doc).
		c.owned = true
		if p.cache.Offer(c.remote, c) {
			c.releaseSlot() // in the cache's room now
			lk.last = c.nonce
			wakeLink(lk)
			p.mu.Unlock()
			return admitted
		}
		if _, held := p.cache.Load(c.remote); held || p.acceptSlot == nil {
			// The cache holds a value after all (a creation published it
			// between Load and Offer): decide again against it.
			c.owned = false
			p.mu.Unlock()
			continue
		}
		if lk.creating {
			// No room for an Offer, but a Create for r runs in room of its
			// own: it returns c (endCreate), once its own dial, if any, is
			// closed. c keeps the accept slot until then; a dial in flight
			// is cut short, as an Offer's cancellation would (it would lose
			// to c: see decide), so that the slot is not held for the
			// length of a handshake with r.
			lk.inbound = c
			lk.last = c.nonce
			if d := lk.dialConn; d != nil {
				d.cutShort()
			}
			wakeLink(lk)
			p.mu.Unlock()
			return admitted
		}
		c.owned = false
		p.mu.Unlock()
		return noRoom
	}
}

// decide is the acceptor's rule, for acceptor me, a hello h from the peer at
// the other end of a link that is dialing or not (dial: the connection of
// its last dial, if any), and cur, the endpoint the cache holds for that
// peer (nil: none): whether the new connection is accepted, and which held
// endpoint, if any, it makes stale (to be invalidated before the rule is
// applied again).
func decide(me int, h *hello, dialing bool, dial, cur *conn) (accept bool, stale *conn) {
	if dialing && dial != nil && dial.nonce == h.dropped {
		// The peer accepted the dial in flight, and has given it up
		// already (its answer is on its way here): it is not a dial that
		// the peer's connection competes with, and the peer, dialing
		// again, waits for no other.
		dialing = false
	}
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
// never owned is closed here. Frames that a draining connection held for a
// full inbox are delivered last, once the descriptor may be closed.
func (p *Peer) readUntilEnd(c *conn) {
	// EOF, an I/O error, a bad frame or Close: all end the connection. At
	// an EOF the other end has closed its side, gracefully, and reads on
	// until this end closes: a Send that holds the connection may still
	// write its frame. Anything else makes it unusable (ended).
	pending, err := c.readFrames()
	if err != io.EOF {
		c.ended.Store(true)
	}
	close(c.readDone)
	defer p.deliverLate(pending)
	if !c.owned {
		c.close(false)
		return
	}
	// Closed by the cache's Release, after the last lease. A connection
	// its Create has just returned is not published yet: report it again
	// until the cache has it (or has released it), so that the other end,
	// which may be waiting for this end to close, is not kept waiting.
	c.givenUp.Store(true)
	for !p.cache.CompareAndInvalidate(c.remote, c) && !c.released.Load() {
		select {
		case <-p.done:
			return
		case <-c.left:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// touch marks peer r's connection used, as a Send's Acquire does, without
// ever creating one: for eviction (a use the clock hand sees) and idle
// removal.
// A Get with a context already done answers a held value, and nothing else.
func (p *Peer) touch(r int) {
	_, _ = p.cache.Get(doneCtx, r)
}

// leaseOf returns a lease on c, if c is the connection the cache holds for
// its peer.
func (p *Peer) leaseOf(c *conn) (epcache.Lease[int, *conn], bool) {
	l, err := p.cache.Acquire(doneCtx, c.remote)
	if err != nil {
		return l, false
	}
	if l.Value() != c {
		l.Release()
		return l, false
	}
	return l, true
}

// doneCtx is a context already done: a Get or Acquire given it returns a
// held value, and never creates or waits.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
