//go:build ucx

package ucx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/internal/resolve"
)

// Defaults for the zero fields of [Config].
const (
	// DefaultMaxMessage is the MaxMessage of a zero Config.MaxMessage.
	DefaultMaxMessage = 4 << 10
	// DefaultCreateTimeout is the CreateTimeout of a zero
	// Config.CreateTimeout.
	DefaultCreateTimeout = 10 * time.Second
	// DefaultRecvBuffer is the RecvBuffer of a zero Config.RecvBuffer.
	DefaultRecvBuffer = 256

	// MaxMessageLimit is the largest Config.MaxMessage: 1 MiB. The peer
	// receives into a buffer of MaxMessage bytes.
	MaxMessageLimit = 1 << 20
)

// defaultRetry is the retry policy of a nil Config.Retry.
var defaultRetry = epcache.Backoff(time.Millisecond, 100*time.Millisecond, 0, Retryable)

// Config configures a [Peer]. ID, Directory and Context are required; a
// zero value elsewhere means the default.
type Config struct {
	// ID is the peer's number in Directory: 0 to Directory.Size()-1.
	ID int

	// Directory is where the peer publishes its worker's address and looks
	// up the others'. If it is a directory.Resolver, a connection attempt
	// to a peer whose address is not visible yet waits for it in Resolve
	// (within CreateTimeout) instead of failing for Retry to retry, and an
	// address that no longer answers is reported with Unreachable.
	Directory directory.Interface

	// Context is the UCP context the peer's worker is made from. Peers of
	// one process may share one.
	Context *Context

	// MaxMessage is the largest payload Send sends and the receiver takes,
	// in bytes; DefaultMaxMessage if 0, at most MaxMessageLimit.
	MaxMessage int

	// CreateTimeout bounds one connection to a peer, lookups, retries and
	// wire-up included: epcache's Config.CreateTimeout.
	// DefaultCreateTimeout if 0.
	CreateTimeout time.Duration

	// Retry decides whether and when a failed connection attempt is made
	// again: epcache's Config.Retry. If nil, it is
	// epcache.Backoff(time.Millisecond, 100*time.Millisecond, 0, Retryable):
	// capped exponential backoff, for as long as CreateTimeout allows, while
	// the directory says the peer has not published its address. A policy
	// of your own should retry only what Retryable accepts, too.
	Retry func(attempt int, err error) (wait time.Duration, retry bool)

	// ErrorTTL, if positive, makes a failed connection the answer for that
	// peer, without another attempt, for ErrorTTL: epcache's
	// Config.ErrorTTL. It keeps senders to a dead peer from creating
	// endpoint after endpoint to it.
	ErrorTTL time.Duration

	// RecvBuffer is how many received messages wait for Recv before the
	// receiver stops taking them off UCX (which then queues them as
	// unexpected). DefaultRecvBuffer if 0.
	RecvBuffer int
}

func (cfg *Config) fill() error {
	switch {
	case cfg.Directory == nil:
		return errors.New("ucx: Config.Directory is nil; it is required")
	case cfg.Context == nil:
		return errors.New("ucx: Config.Context is nil; it is required")
	case cfg.ID < 0 || cfg.ID >= cfg.Directory.Size():
		return fmt.Errorf("ucx: Config.ID is %d; want 0 to %d (the directory's peers)", cfg.ID, cfg.Directory.Size()-1)
	case cfg.MaxMessage < 0 || cfg.MaxMessage > MaxMessageLimit:
		return fmt.Errorf("ucx: Config.MaxMessage is %d; want 0 (default) to %d", cfg.MaxMessage, MaxMessageLimit)
	case cfg.CreateTimeout < 0:
		return fmt.Errorf("ucx: Config.CreateTimeout is %v; want 0 (default) or a positive duration", cfg.CreateTimeout)
	case cfg.ErrorTTL < 0:
		return fmt.Errorf("ucx: Config.ErrorTTL is %v; want 0 (failures not remembered) or a positive duration", cfg.ErrorTTL)
	case cfg.RecvBuffer < 0:
		return fmt.Errorf("ucx: Config.RecvBuffer is %d; want 0 (default) or a positive count", cfg.RecvBuffer)
	}
	if cfg.MaxMessage == 0 {
		cfg.MaxMessage = DefaultMaxMessage
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
	return nil
}

// Message is one message received by Recv.
type Message struct {
	From    int    // the sending peer
	Payload []byte // owned by the receiver
}

// Stats is a snapshot of a peer's counters; a snapshot taken after Close
// returned is exact.
type Stats struct {
	ConnectAttempts uint64 // Connects tried (lookups that found an address)
	NotPublished    uint64 // lookups the directory answered "not yet"
	Failures        uint64 // endpoints UCX reported as failed, dropped from the cache
	Sent            uint64 // messages sent
	Received        uint64 // messages delivered to the inbox
	Truncated       uint64 // messages dropped for being longer than MaxMessage
	RecvErrors      uint64 // receives that failed otherwise

	Endpoints EndpointStats // the worker's endpoints: created, closed, failed
	Cache     epcache.Stats // the endpoint cache's counters
}

type peerCounters struct {
	connectAttempts, notPublished, failures atomic.Uint64
	sent, received, truncated, recvErrors   atomic.Uint64
}

// Peer is one process of the job: a UCX worker, its address published in
// a directory, and an endpoint cache from peer number to endpoint. Its
// methods are safe for concurrent use. Make one with [Start].
type Peer struct {
	id         int
	dir        directory.Interface
	w          *Worker
	cache      *epcache.Cache[int, *Endpoint]
	maxMessage int
	inbox      chan Message
	stats      peerCounters
	done       chan struct{} // closed when Close begins
	closeDone  chan struct{} // closed when the first Close returns
	stopRecv   context.CancelFunc
	wg         sync.WaitGroup // the receiver

	mu     sync.Mutex
	closed bool
}

// Start starts a peer: it creates a worker in cfg.Context, starts the
// worker's progress goroutine and the peer's receiver, and publishes the
// worker's address in cfg.Directory as cfg.ID's (string(Worker.Address)),
// replacing what was there: a restarted peer republishes this way, and the
// directory's delay applies. It returns an error naming the first invalid
// field of cfg, or the error of creating the worker or publishing. Call
// Close to stop the peer and free what it holds.
func Start(cfg Config) (*Peer, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	p := &Peer{
		id:         cfg.ID,
		dir:        cfg.Directory,
		maxMessage: cfg.MaxMessage,
		inbox:      make(chan Message, cfg.RecvBuffer),
		done:       make(chan struct{}),
		closeDone:  make(chan struct{}),
	}
	var err error
	p.w, err = cfg.Context.NewWorker(WorkerOptions{OnFailure: p.failed})
	if err != nil {
		return nil, fmt.Errorf("ucx: peer %d: %w", cfg.ID, err)
	}
	p.cache, err = epcache.New(epcache.Config[int, *Endpoint]{
		Create:        p.create,
		Release:       p.release,
		CreateTimeout: cfg.CreateTimeout,
		Retry:         cfg.Retry,
		ErrorTTL:      cfg.ErrorTTL,
	})
	if err != nil {
		_ = p.w.Close()
		return nil, fmt.Errorf("ucx: peer %d: %w", cfg.ID, err)
	}
	recvCtx, stop := context.WithCancel(context.Background())
	p.stopRecv = stop
	p.wg.Add(1)
	go p.receive(recvCtx)
	if err := p.dir.Publish(p.id, string(p.w.Address())); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("ucx: peer %d: %w", cfg.ID, err)
	}
	return p, nil
}

// ID returns the peer's number in the directory.
func (p *Peer) ID() int { return p.id }

// Worker returns the peer's worker.
func (p *Peer) Worker() *Worker { return p.w }

// create is the cache's Create: it looks peer r up and connects to it.
// While r has no address visible, a directory.Resolver's Resolve waits for
// one, within ctx (CreateTimeout); another directory's "not yet" fails the
// attempt, for Retry to make another. An address that no longer answers
// (see stale) is reported to a Resolver with Unreachable and, if the
// directory now has another address for r (r published again while this
// attempt ran), connected to at once: a failure of r's previous worker is
// not r's.
func (p *Peer) create(ctx context.Context, r int) (*Endpoint, error) {
	addr, err := resolve.Lookup(ctx, p.dir, r, &p.stats.notPublished)
	if err != nil {
		return nil, fmt.Errorf("ucx: connect to peer %d: %w", r, err)
	}
	for {
		p.stats.connectAttempts.Add(1)
		ep, err := p.w.Connect(ctx, []byte(addr), r)
		switch {
		case err == nil:
			return ep, nil
		case errors.Is(err, ErrClosed) || err == ctx.Err():
			return nil, err
		}
		err = fmt.Errorf("ucx: connect to peer %d: %w", r, err)
		if !stale(err) {
			return nil, err
		}
		resolve.Unreachable(p.dir, r, addr)
		next, lerr := p.dir.Lookup(r)
		if lerr != nil || next == addr {
			return nil, err
		}
		addr = next
	}
}

// stale reports whether a connection's failure says that the address no
// longer belongs to a live worker: it is not a worker address of this
// package, no open context of this process issued it (its worker's
// context is closed), or the wire-up found the worker gone.
func stale(err error) bool {
	var st Status
	return errors.Is(err, ErrBadAddress) || errors.Is(err, ErrUnknownAddress) || errors.Is(err, ErrEndpointFailed) ||
		errors.As(err, &st) && (st == StatusUnreachable || st == StatusConnectionReset || st == StatusTimedOut)
}

// release is the cache's Release: it closes the endpoint and waits for the
// close to complete.
func (p *Peer) release(_ int, ep *Endpoint) { _ = ep.Close() }

// failed is the worker's OnFailure: an endpoint's error callback ran. The
// cache drops it if it still holds it (and only it: a newer endpoint
// stays), which closes it; the next Send connects again.
func (p *Peer) failed(ep *Endpoint, _ error) {
	p.stats.failures.Add(1)
	p.cache.CompareAndInvalidate(ep.Label(), ep)
}

// Send sends payload as one tagged message to peer to, connecting first if
// this peer holds no endpoint to it: concurrent Sends to one peer share one
// connection attempt and then one endpoint. It returns once UCX has taken
// the message (local completion), not once it is received.
//
// Errors: ErrMessageTooLarge beyond MaxMessage; ErrSelf; an error wrapping
// directory.ErrUnknownPeer for a peer outside the directory; the connection
// error (remembered for Config.ErrorTTL); an error wrapping
// ErrEndpointFailed once UCX has reported the endpoint as failed, after
// which the endpoint is dropped (with epcache's CompareAndInvalidate, so
// that only this endpoint is) and the next Send connects again; ctx.Err();
// ErrClosed once Close has begun. The payload is not retained.
func (p *Peer) Send(ctx context.Context, to int, payload []byte) error {
	switch {
	case len(payload) > p.maxMessage:
		return fmt.Errorf("%w: %d bytes to peer %d (MaxMessage is %d)", ErrMessageTooLarge, len(payload), to, p.maxMessage)
	case to == p.id:
		return fmt.Errorf("%w (peer %d)", ErrSelf, to)
	case to < 0 || to >= p.dir.Size():
		return fmt.Errorf("ucx: send to peer %d: %w (peers are 0 to %d)", to, directory.ErrUnknownPeer, p.dir.Size()-1)
	}
	tag := uint64(p.id)<<32 | uint64(to)
	// A lease: a failure report (this Send's, another's, the error
	// callback's) drops the endpoint from the cache at once, but the cache
	// closes it only once the last Send using it is done.
	lease, err := p.cache.Acquire(ctx, to)
	if err != nil {
		if errors.Is(err, epcache.ErrClosed) {
			return ErrClosed
		}
		return err
	}
	defer lease.Release()
	ep := lease.Value()
	err = ep.Send(ctx, tag, payload)
	switch {
	case err == nil:
		p.stats.sent.Add(1)
		return nil
	case errors.Is(err, ErrClosed):
		return ErrClosed
	case err == ctx.Err():
		return err
	}
	p.cache.CompareAndInvalidate(to, ep)
	return fmt.Errorf("ucx: send to peer %d: %w", to, err)
}

// receive is the peer's receiver: it takes messages off the worker and
// puts them in the inbox until ctx ends.
func (p *Peer) receive(ctx context.Context) {
	defer p.wg.Done()
	buf := make([]byte, p.maxMessage)
	for {
		n, tag, err := p.w.Recv(ctx, buf)
		switch {
		case err == nil:
		case ctx.Err() != nil || errors.Is(err, ErrClosed):
			return
		case errors.Is(err, StatusTruncated):
			p.stats.truncated.Add(1)
			continue
		default:
			p.stats.recvErrors.Add(1)
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			continue
		}
		msg := Message{From: int(tag >> 32), Payload: bytes.Clone(buf[:n])}
		select {
		case p.inbox <- msg:
			p.stats.received.Add(1)
		case <-ctx.Done():
			return
		}
	}
}

// Recv returns the next message received from any peer. It blocks until
// one arrives, ctx ends (it returns ctx.Err()) or Close begins (ErrClosed).
// Messages not received by Close are discarded.
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
		ConnectAttempts: s.connectAttempts.Load(),
		NotPublished:    s.notPublished.Load(),
		Failures:        s.failures.Load(),
		Sent:            s.sent.Load(),
		Received:        s.received.Load(),
		Truncated:       s.truncated.Load(),
		RecvErrors:      s.recvErrors.Load(),
		Endpoints:       p.w.Stats(),
		Cache:           p.cache.Stats(),
	}
}

// Close shuts the peer down: Send and Recv return ErrClosed, the receiver
// stops, the endpoint cache closes (cancelling connections in flight and
// closing every endpoint it holds with ucp_ep_close_nbx), and the worker is
// closed and destroyed. The peer's address stays in the directory: a dead
// peer does not withdraw its own, so call Directory.Unpublish for that. A
// second Close waits for the first and returns nil.
func (p *Peer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.closeDone
		return nil
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	defer close(p.closeDone)

	p.stopRecv()
	errCache := p.cache.Close()
	p.wg.Wait()
	errWorker := p.w.Close()
	return errors.Join(errCache, errWorker)
}
