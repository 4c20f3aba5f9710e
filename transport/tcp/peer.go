package tcp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
)

// Defaults for the zero fields of [Config].
const (
	// DefaultMaxFrame is the MaxFrame of a zero Config.MaxFrame: 1 MiB.
	DefaultMaxFrame = 1 << 20
	// DefaultHandshakeTimeout is the HandshakeTimeout of a zero
	// Config.HandshakeTimeout.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultCreateTimeout is the CreateTimeout of a zero
	// Config.CreateTimeout.
	DefaultCreateTimeout = 10 * time.Second
	// DefaultRecvBuffer is the RecvBuffer of a zero Config.RecvBuffer.
	DefaultRecvBuffer = 256

	// MaxFrameLimit is the largest Config.MaxFrame: 1 GiB.
	MaxFrameLimit = 1 << 30
)

// maxHelloGrace bounds how long, with MaxConns, an accepted connection may
// hold the accept slot before its hello arrives: a dialer of this package
// writes its hello as soon as its connect returns, and finds it in the
// socket once it is accepted, while a stranger that says nothing would
// make every dial behind it in the backlog wait (see readHello).
const maxHelloGrace = time.Second

// defaultRetry is the retry policy of a nil Config.Retry.
var defaultRetry = epcache.Backoff(time.Millisecond, 100*time.Millisecond, 0, Retryable)

// Config configures a [Peer]. ID and Directory are required; a zero value
// elsewhere means the default.
type Config struct {
	// ID is the peer's number in Directory: 0 to Directory.Size()-1.
	ID int

	// Directory is where the peer publishes its address and looks up the
	// others': the in-process *directory.Directory for peers in one
	// process, or a directory backed by a store, such as etcddir's (module
	// github.com/epcache/epcache/etcd), for peers in separate processes.
	// If it is a directory.Watcher too, a peer that publishes again (it
	// restarted) is forgotten at once: a failure to reach it that ErrorTTL
	// remembers no longer holds Sends to it back, and a connection this
	// peer dialed to its previous address is dropped, so that Sends go to
	// the new life rather than to a previous one that may be hung. (One the
	// previous life dialed is dropped when the new life connects: its
	// hello names a new incarnation.) If it is a
	// directory.Resolver, a connection attempt to a peer whose address is
	// not visible yet waits for it in Resolve (within CreateTimeout)
	// instead of failing for Retry to retry, and an address that no longer
	// answers (a refused dial, another peer answering) is reported with
	// Unreachable.
	Directory directory.Interface

	// ListenAddr is the address the peer listens on; "127.0.0.1:0" (a
	// free port on loopback) if empty. Across hosts, listen on an address
	// the other hosts reach, such as ":7000" or "10.0.0.5:0".
	ListenAddr string

	// AdvertiseAddr is the address the peer publishes in Directory; the
	// listener's own address if empty. Set it when the listener's address
	// is not the one the others dial (":7000" listens on every interface;
	// the others need "host-5:7000").
	AdvertiseAddr string

	// MaxFrame is the largest payload Send sends and the reader accepts, in
	// bytes; DefaultMaxFrame if 0, at most MaxFrameLimit.
	MaxFrame int

	// HandshakeTimeout bounds each side of a handshake (a stranger that
	// connects and says nothing is closed after it; with MaxConns, after
	// an eighth of it, at most a second: see the package doc), how long a
	// connection attempt that lost a simultaneous connect waits for the
	// winning connection, and how long a connection being closed waits for
	// a silent other end to close its side (see the package doc, "Closing
	// gracefully"). DefaultHandshakeTimeout if 0.
	HandshakeTimeout time.Duration

	// CreateTimeout bounds one connection to a peer, lookups, retries and
	// handshakes included: epcache's Config.CreateTimeout. With a
	// directory.Resolver for Directory, a connection attempt waits in
	// Resolve for a peer that has not published yet, within it.
	// DefaultCreateTimeout if 0.
	CreateTimeout time.Duration

	// Retry decides whether and when a failed connection attempt is made
	// again: epcache's Config.Retry. If nil, it is
	// epcache.Backoff(time.Millisecond, 100*time.Millisecond, 0, Retryable):
	// capped exponential backoff, for as long as CreateTimeout allows, of
	// the errors [Retryable] accepts only. A policy of your own should
	// retry only what Retryable accepts, too.
	Retry func(attempt int, err error) (wait time.Duration, retry bool)

	// ErrorTTL, if positive, makes a failed connection the answer for that
	// peer, without another attempt, for ErrorTTL: epcache's
	// Config.ErrorTTL. It keeps senders to a dead peer from hammering it.
	ErrorTTL time.Duration

	// RecvBuffer is how many received frames wait for Recv before the
	// readers stop reading (and TCP flow control stops the senders).
	// DefaultRecvBuffer if 0.
	RecvBuffer int

	// MaxConns, if positive, bounds the connection descriptors the peer
	// holds at every instant, the listener aside: connections being dialed,
	// accepted connections in their handshake, connections held, and
	// connections being closed, all together. It must be at least 2: one
	// descriptor is kept for the connection the listener accepts, and the
	// endpoint cache holds at most MaxConns-1 (epcache's
	// Config.MaxEntries), counting the dials in flight and the connections
	// it has given up but not closed yet.
	//
	// A Send to a peer without a connection, when the cache is full,
	// closes a connection no Send is writing on, one not used since the
	// clock hand last passed it and, of those, the one asked for least
	// often (epcache evicts it: see [epcache.Config.MaxEntries]; the other
	// end closes its side in turn, and every frame already written on it
	// is delivered), or waits for one, in
	// arrival order, until its context ends. A peer that cannot take in a
	// connection at once answers "busy" and connects back when it has room;
	// see the package doc. 0 means no bound.
	MaxConns int

	// IdleTimeout, if positive, closes a connection that has carried no
	// frame in either direction, and that no Send has used, for about
	// IdleTimeout (epcache's Config.IdleTimeout: between IdleTimeout and
	// 5/4 IdleTimeout). Both ends close it, every frame written on it is
	// delivered first, and the next Send reconnects. A connection a frame
	// is being written on, or one whose reader holds a frame that Recv has
	// not taken yet, is never closed for idleness. 0 means never.
	IdleTimeout time.Duration
}

// Message is one frame received by Recv.
type Message struct {
	From    int    // the sending peer
	Payload []byte // owned by the receiver
}

// Stats is a snapshot of a peer's counters; a snapshot taken after Close
// returned is exact. Connection counts are of this peer's ends: a
// connection between two peers of one process is counted by both.
type Stats struct {
	DialAttempts uint64 // TCP connects tried (lookups that found an address)
	Dialed       uint64 // TCP connects that succeeded
	Accepted     uint64 // connections accepted by the listener, strangers included
	Closed       uint64 // connection ends closed, for any reason
	Duplicates   uint64 // of Closed: ends closed because the pair keeps another connection
	Refused      uint64 // accepted connections closed for a bad or missing hello
	Abandoned    uint64 // accepted connections closed unused: their dialer had gone after its hello
	NotPublished uint64 // lookups the directory answered "not yet"
	BadFrames    uint64 // connections closed for announcing a frame over MaxFrame
	Sent         uint64 // frames written
	Received     uint64 // frames delivered to the inbox
	Busy         uint64 // accepted connections answered "busy": no room for them (MaxConns)
	BusyRetries  uint64 // Sends that waited and tried again after a peer answered "busy"
	Resent       uint64 // Sends that found their connection ended before writing a byte, and used another

	// Descriptors counts the connection descriptors this peer holds, from
	// just before each dial or accept call to just after each close
	// returns: at every instant, at least what the process holds for the
	// peer (a pending accept call counts as one). PeakDescriptors is its
	// high-water mark. With MaxConns, neither exceeds MaxConns.
	Descriptors, PeakDescriptors int64

	Cache epcache.Stats // the endpoint cache's counters: Evictions, IdleRemovals, RoomWaits, Room among them
}

// Open returns the number of this peer's connection ends not yet closed.
func (s Stats) Open() int64 { return int64(s.Dialed+s.Accepted) - int64(s.Closed) }

type counters struct {
	dialAttempts, dialed, accepted, closed, duplicates, refused atomic.Uint64
	notPublished, badFrames, sent, received                     atomic.Uint64
	busy, busyRetries, resent, abandoned                        atomic.Uint64
	closedUnderWriter                                           atomic.Uint64 // connections closed while a frame was being written

	// fds counts descriptors held or about to be: raised before a dial or
	// an accept call, lowered after a failed one or a close; peak is its
	// high-water mark.
	fds, peak atomic.Int64
}

// fdOpening counts a descriptor about to be made, before the call that
// makes it.
func (s *counters) fdOpening() {
	n := s.fds.Add(1)
	for {
		m := s.peak.Load()
		if n <= m || s.peak.CompareAndSwap(m, n) {
			return
		}
	}
}

// fdClosed uncounts a descriptor, after the call that closed it (or failed
// to make it) returned.
func (s *counters) fdClosed() { s.fds.Add(-1) }

// Peer is one process of the job: a TCP listener (Config.ListenAddr), a published
// address, and an endpoint cache of connections to the other peers. Its
// methods are safe for concurrent use. Make one with [Listen].
type Peer struct {
	id        int
	inc       uint64 // incarnation: tells the other peers that this is a new life of id
	dir       directory.Interface
	ln        net.Listener
	stopWatch func() // of the directory's watch, if it has one
	cache     *epcache.Cache[int, *conn]
	dialer    net.Dialer
	maxFrame  int
	hsTimeout time.Duration
	// helloGrace, with MaxConns, is how long an accepted connection may
	// hold the accept slot without a hello: an eighth of hsTimeout, at
	// most maxHelloGrace (see readHello).
	helloGrace time.Duration
	inbox      chan Message
	stats      counters
	done       chan struct{} // closed when Close begins
	closeDone  chan struct{} // closed when the first Close returns
	wg         sync.WaitGroup

	// With MaxConns: acceptSlot holds a token while the acceptor has a
	// descriptor outside the cache's room (a pending accept call, then the
	// accepted connection until the cache owns it or it is closed); see
	// the package doc, "A bound on descriptors".
	acceptSlot chan struct{}
	// aging: eviction or idle removal may close a connection (MaxConns or
	// IdleTimeout), so that a reader marks its connection used.
	aging bool
	// ctx ends when Close begins: the context of the connections a peer
	// makes back to one it answered "busy".
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	links  map[int]*link      // per remote peer; entries are never removed
	conns  map[*conn]struct{} // every open connection end, handshaking and cached ones included
}

// Listen starts a peer: it listens on cfg.ListenAddr (by default a port of
// the kernel's choosing on 127.0.0.1), starts a goroutine that accepts
// connections, and publishes the address (cfg.AdvertiseAddr, if set) in
// cfg.Directory as cfg.ID's, replacing what was there (a
// restarted peer republishes this way; the directory's delay applies). It
// returns an error naming the first invalid field of cfg, or the error of
// listening or publishing. Call Close to stop the peer and free what it
// holds.
func Listen(cfg Config) (*Peer, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("tcp: peer %d: listen on %s: %w", cfg.ID, cfg.ListenAddr, err)
	}
	advertise := ln.Addr().String()
	if cfg.AdvertiseAddr != "" {
		advertise = cfg.AdvertiseAddr
	}
	p := &Peer{
		id:         cfg.ID,
		inc:        nonZeroRandom(),
		dir:        cfg.Directory,
		ln:         ln,
		maxFrame:   cfg.MaxFrame,
		hsTimeout:  cfg.HandshakeTimeout,
		helloGrace: min(cfg.HandshakeTimeout/8, maxHelloGrace),
		inbox:      make(chan Message, cfg.RecvBuffer),
		done:       make(chan struct{}),
		closeDone:  make(chan struct{}),
		aging:      cfg.MaxConns > 0 || cfg.IdleTimeout > 0,
		links:      map[int]*link{},
		conns:      map[*conn]struct{}{},
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	maxEntries := 0
	if cfg.MaxConns > 0 {
		maxEntries = cfg.MaxConns - 1 // and one descriptor for the acceptor
		p.acceptSlot = make(chan struct{}, 1)
	}
	p.cache, err = epcache.New(epcache.Config[int, *conn]{
		Create:        p.create,
		Release:       p.release,
		CreateTimeout: cfg.CreateTimeout,
		Retry:         cfg.Retry,
		ErrorTTL:      cfg.ErrorTTL,
		MaxEntries:    maxEntries,
		IdleTimeout:   cfg.IdleTimeout,
	})
	if err != nil {
		p.cancel()
		_ = ln.Close()
		return nil, fmt.Errorf("tcp: peer %d: %w", cfg.ID, err)
	}
	p.wg.Add(1)
	go p.acceptLoop()
	if w, ok := p.dir.(directory.Watcher); ok {
		// A peer that publishes again has restarted: a failure of it
		// remembered for ErrorTTL is forgotten at once, and a connection
		// this peer dialed to another address (its previous life's, which
		// may be hung and never read what the Sends write) is dropped.
		p.stopWatch = w.Watch(func(peer int, addr string) {
			if peer == p.id {
				return
			}
			p.cache.Forget(peer)
			if c, ok := p.cache.Load(peer); ok && c.dialed && c.addr != addr {
				p.drop(c)
			}
		})
	}
	if err := p.dir.Publish(p.id, advertise); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("tcp: peer %d: %w", cfg.ID, err)
	}
	return p, nil
}

func (cfg *Config) fill() error {
	switch {
	case cfg.Directory == nil:
		return errors.New("tcp: Config.Directory is nil; it is required")
	case cfg.ID < 0 || cfg.ID >= cfg.Directory.Size():
		return fmt.Errorf("tcp: Config.ID is %d; want 0 to %d (the directory's peers)", cfg.ID, cfg.Directory.Size()-1)
	case cfg.MaxFrame < 0 || cfg.MaxFrame > MaxFrameLimit:
		return fmt.Errorf("tcp: Config.MaxFrame is %d; want 0 (default) to %d", cfg.MaxFrame, MaxFrameLimit)
	case cfg.HandshakeTimeout < 0:
		return fmt.Errorf("tcp: Config.HandshakeTimeout is %v; want 0 (default) or a positive duration", cfg.HandshakeTimeout)
	case cfg.CreateTimeout < 0:
		return fmt.Errorf("tcp: Config.CreateTimeout is %v; want 0 (default) or a positive duration", cfg.CreateTimeout)
	case cfg.ErrorTTL < 0:
		return fmt.Errorf("tcp: Config.ErrorTTL is %v; want 0 (failures not remembered) or a positive duration", cfg.ErrorTTL)
	case cfg.RecvBuffer < 0:
		return fmt.Errorf("tcp: Config.RecvBuffer is %d; want 0 (default) or a positive count", cfg.RecvBuffer)
	case cfg.MaxConns < 0 || cfg.MaxConns == 1:
		return fmt.Errorf("tcp: Config.MaxConns is %d; want 0 (no bound) or at least 2 (one for the connection being accepted, one to hold)", cfg.MaxConns)
	case cfg.IdleTimeout < 0:
		return fmt.Errorf("tcp: Config.IdleTimeout is %v; want 0 (connections never expire) or a positive duration", cfg.IdleTimeout)
	}
	if cfg.MaxFrame == 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.CreateTimeout == 0 {
		cfg.CreateTimeout = DefaultCreateTimeout
	}
	if cfg.Retry == nil {
		cfg.Retry = defaultRetry
	}
	if cfg.RecvBuffer == 0 {
		cfg.RecvBuffer = DefaultRecvBuffer
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	return nil
}

func nonZeroRandom() uint64 {
	for {
		if n := rand.Uint64(); n != 0 {
			return n
		}
	}
}

// ID returns the peer's number in the directory.
func (p *Peer) ID() int { return p.id }

// Addr returns the address the peer listens on and published.
func (p *Peer) Addr() string { return p.ln.Addr().String() }

// Send sends payload as one frame to peer to, connecting first if this peer
// holds no connection to it: concurrent Sends to one peer share one
// connection attempt and then one connection (see the package doc). Frames
// that one goroutine sends to one peer arrive in order as long as the
// connection lasts.
//
// Send returns once the frame is written to the connection, not once it is
// received. It blocks while the connection is being made, while it waits for
// room (Config.MaxConns) or for a peer that answered "busy", and while TCP
// flow control holds the write back (the receiver is not calling Recv). ctx
// bounds all of it: on cancellation Send returns ctx.Err(), and a write cut
// short tears the connection down (gracefully: what the other end sent on
// it is still delivered).
//
// A nil error means that the whole frame was written to a connection whose
// other end had not closed its side when Send looked, just before the
// write, and that the receiving peer delivers it to Recv: it reads every
// frame on a connection up to the end of the stream, whether it closes the
// connection itself (eviction, idle removal, a stale or failed endpoint)
// or the sender does, and however slowly its receiver calls Recv. Three
// things lose such a frame: Close of the receiving peer (frames it has not
// handed to Recv are discarded), a network failure or a process that dies,
// and a sending goroutine held back between its look and its write for
// longer than the other end's HandshakeTimeout while the other end,
// closing the connection, waits that long for a byte and then closes its
// socket: keep HandshakeTimeout well above the longest a busy machine may
// hold a runnable goroutine back. (Elsewhere than on Linux, Send does not
// ask the kernel whether the other end has closed its side, and relies on
// the connection's reader having seen the end, which a reader waiting for
// room in a full inbox has not: a frame written on such a connection,
// after the other end gave up waiting, is lost.)
//
// A connection that ends before Send has written a byte on it (the other
// end closed it, for idleness or to make room, or an earlier write broke
// it) is dropped and Send uses another: such a frame is sent once, on the
// next connection.
//
// Errors: ErrFrameTooLarge beyond MaxFrame; ErrSelf; an error wrapping
// directory.ErrUnknownPeer for a peer outside the directory; the connection
// error (remembered for Config.ErrorTTL, unless the directory has another
// address for the peer by the time a Send meets it: then the failure is of
// the peer's previous address, and Send connects again); an I/O error
// after part of the frame was written, after which the connection is given
// up (with epcache's CompareAndInvalidate, so that only this connection is
// dropped) and the next Send reconnects; ErrClosed once Close has begun.
// A frame whose Send returns an error was not delivered, and will not be:
// not a byte of it was written, or a part, which the receiver discards
// with the connection. The payload is not retained.
func (p *Peer) Send(ctx context.Context, to int, payload []byte) error {
	switch {
	case len(payload) > p.maxFrame:
		return fmt.Errorf("%w: %d bytes to peer %d (MaxFrame is %d)", ErrFrameTooLarge, len(payload), to, p.maxFrame)
	case to == p.id:
		return fmt.Errorf("%w (peer %d)", ErrSelf, to)
	case to < 0 || to >= p.dir.Size():
		return fmt.Errorf("tcp: send to peer %d: %w (peers are 0 to %d)", to, directory.ErrUnknownPeer, p.dir.Size()-1)
	}
	var (
		backoff time.Duration
		stale   *attemptError // the last failure found stale, not to be retried twice
	)
	for {
		// A lease, so that a failure report (this Send's, another's, the
		// reader's), an eviction or an idle sweep never closes the
		// connection under this write: the cache closes it when the last
		// Send using it is done, and never evicts a leased one.
		lease, err := p.cache.Acquire(ctx, to)
		if err != nil {
			if errors.Is(err, epcache.ErrClosed) {
				return ErrClosed
			}
			if ae := p.previousLife(to, err); ae != nil && ae != stale {
				// The failure is of an address the peer no longer has (it
				// published again while the attempt ran, or since): a
				// watching directory's Forget may have come before the
				// failure was remembered. Forgotten here, and tried again
				// at the new address. (Once: the same failure again is a
				// creation timed out and still running, which answers
				// every Get until it returns.)
				stale = ae
				p.cache.Forget(to)
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err() // also when the attempt it waited for failed first
			}
			if !errors.Is(err, ErrBusy) {
				return err
			}
			// The peer had no room and connects back when it has; this
			// peer's own attempt gave its room up meanwhile. A busy answer
			// is no failure of the peer's: not remembered (ErrorTTL).
			p.stats.busyRetries.Add(1)
			p.cache.Forget(to)
			backoff = min(max(2*backoff, time.Millisecond), 64*time.Millisecond)
			if err := p.pause(ctx, backoff/2+rand.N(backoff/2)); err != nil {
				return err
			}
			continue
		}
		c := lease.Value()
		if c.ended.Load() {
			// The other end has closed it, or it failed: not a byte of
			// this frame written, so another connection may carry it.
			p.drop(c)
			p.endLease(lease, c)
			p.stats.resent.Add(1)
			continue
		}
		wrote, err := c.writeFrame(ctx, payload)
		if err == nil {
			p.endLease(lease, c)
			p.stats.sent.Add(1)
			return nil
		}
		// Dropped before the lease ends, so that this Send's lease, if it
		// is the last, does not run the Release on this goroutine.
		p.drop(c)
		p.endLease(lease, c)
		select {
		case <-p.done:
			return ErrClosed
		default:
		}
		if err == ctx.Err() {
			return err
		}
		if !wrote {
			p.stats.resent.Add(1)
			continue // nothing of the frame left this peer: another connection carries it
		}
		return fmt.Errorf("tcp: send to peer %d: %w", to, err)
	}
}

// previousLife returns err's attempt, if err is a failure to connect to
// peer r at an address (or in a lookup) that the directory no longer gives
// for r: it now has another address for r, visible.
func (p *Peer) previousLife(r int, err error) *attemptError {
	var ae *attemptError
	if !errors.As(err, &ae) {
		return nil
	}
	if now, lerr := p.dir.Lookup(r); lerr != nil || now == ae.addr {
		return nil
	}
	return ae
}

// endLease ends a Send's lease on c. If this peer has given c up, the
// lease may be c's last, whose Release closes c gracefully and may wait
// for the other end: it is ended on a goroutine of its own then, so that
// the Send, whose frame is written, returns.
func (p *Peer) endLease(lease epcache.Lease[int, *conn], c *conn) {
	if !c.givenUp.Load() {
		lease.Release()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		lease.Release() // Close has begun: the Release closes c at once
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		lease.Release()
	}()
}

// pause waits d, or returns ctx.Err() or ErrClosed if ctx ends or Close
// begins first.
func (p *Peer) pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.done:
		return ErrClosed
	}
}

// Recv returns the next frame received from any peer. It blocks until one
// arrives, ctx ends (it returns ctx.Err()) or Close begins (ErrClosed).
// Frames not received by Close are discarded.
func (p *Peer) Recv(ctx context.Context) (Message, error) {
	select {
	case m := <-p.inbox:
		return m, nil
	case <-p.done:
		return Message{}, ErrClosed
	case <-ctx.Done():
		return Message{}, ctx.Err()
	}
}

// Stats returns the peer's counters; see [Stats].
func (p *Peer) Stats() Stats {
	s := &p.stats
	return Stats{
		DialAttempts:    s.dialAttempts.Load(),
		Dialed:          s.dialed.Load(),
		Accepted:        s.accepted.Load(),
		Closed:          s.closed.Load(),
		Duplicates:      s.duplicates.Load(),
		Refused:         s.refused.Load(),
		Abandoned:       s.abandoned.Load(),
		NotPublished:    s.notPublished.Load(),
		BadFrames:       s.badFrames.Load(),
		Sent:            s.sent.Load(),
		Received:        s.received.Load(),
		Busy:            s.busy.Load(),
		BusyRetries:     s.busyRetries.Load(),
		Resent:          s.resent.Load(),
		Descriptors:     s.fds.Load(),
		PeakDescriptors: s.peak.Load(),
		Cache:           p.cache.Stats(),
	}
}

// Close shuts the peer down: it stops Send and Recv (they return ErrClosed),
// closes the listener, closes the endpoint cache (which cancels connection
// attempts in flight and releases every connection it holds that no Send
// leases), closes every other connection (handshaking, and those that Sends
// in flight still lease: their writes fail), and waits for all the peer's
// goroutines to return. The peer's address stays in the directory: a dead
// peer does not withdraw its own, so call Directory.Unpublish for that. A
// second Close waits for the first and returns nil.
func (p *Peer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.closeDone
		return nil
	}
	p.closed = true // from now on, no connection is registered and no goroutine started
	close(p.done)
	p.cancel()
	p.mu.Unlock()

	if p.stopWatch != nil {
		p.stopWatch()
	}
	errLn := p.ln.Close()
	errCache := p.cache.Close()
	p.mu.Lock()
	rest := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		rest = append(rest, c)
	}
	p.mu.Unlock()
	for _, c := range rest {
		c.close(false)
	}
	p.wg.Wait()
	close(p.closeDone)
	if errLn != nil {
		errLn = fmt.Errorf("tcp: peer %d: close listener: %w", p.id, errLn)
	}
	return errors.Join(errLn, errCache)
}

// acceptLoop accepts connections until Close closes the listener, and hands
// each to a goroutine of its own for the handshake and then the reads.
// With MaxConns, it calls Accept only while it holds the accept slot, which
// the connection it accepts keeps until the cache owns it or it is closed:
// the acceptor never holds more than one descriptor outside the cache's
// room, and the connections it does not take yet wait in the kernel's
// backlog.
func (p *Peer) acceptLoop() {
	defer p.wg.Done()
	for {
		if p.acceptSlot != nil {
			select {
			case p.acceptSlot <- struct{}{}:
			case <-p.done:
				return
			}
		}
		p.stats.fdOpening()
		nc, err := p.ln.Accept()
		if err != nil {
			p.stats.fdClosed()
			if p.acceptSlot != nil {
				<-p.acceptSlot
			}
			select {
			case <-p.done:
				return
			case <-time.After(10 * time.Millisecond):
				continue // out of file descriptors, say: try again
			}
		}
		p.stats.accepted.Add(1)
		c := newConn(p, nc)
		c.slot.Store(p.acceptSlot != nil)
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close(false)
			return
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}
