package grpcpool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/epcache"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// ErrClosed is matched, with errors.Is, by the errors Do and Warm return
// once Close has begun.
var ErrClosed = errors.New("grpcpool: pool closed")

// Pool holds one *grpc.ClientConn per address, dialed on first use. Its
// methods are safe for concurrent use. Make one with [New].
type Pool struct {
	cache *epcache.Cache[string, *conn]
	cfg   Config

	// members is the member set of the last SetMembers; nil before the
	// first, when every address is welcome.
	members   atomic.Pointer[memberSet]
	membersMu sync.Mutex // serialises SetMembers

	// slots, with MaxConns, holds a token for every connection open or
	// being dialed, from before Dial to after Close returns: epcache's
	// MaxEntries counts the connections in the cache, slots also those
	// that left it and drain.
	slots chan struct{}

	// open counts the connections Dial returned that are not closed yet;
	// Close waits for it to fall to zero. dialing counts the dials in
	// progress, for the same wait.
	open sync.WaitGroup

	closing   chan struct{} // closed when Close begins: cuts drain delays and health checks
	closeOnce sync.Once
	closeErr  error
	health    sync.WaitGroup // the health checker's goroutine

	now func() time.Time // time.Now; a test's clock

	st counters
}

// conn is one connection of the pool: the value epcache holds per address.
type conn struct {
	addr string
	cc   *grpc.ClientConn

	// cause is why the pool dropped the connection (a dropCause), set once,
	// before the drop; droppedAt when (UnixNano).
	cause     atomic.Int32
	droppedAt atomic.Int64

	// failingSince is when the first of the health checks failing now
	// failed (UnixNano); 0 while they pass.
	failingSince atomic.Int64

	closed atomic.Bool // Close has been called on cc
}

// memberSet is a SetMembers set of addresses.
type memberSet struct{ m map[string]struct{} }

func (s *memberSet) has(addr string) bool {
	_, ok := s.m[addr]
	return ok
}

// dropCause says why a connection left the pool, for Stats and for the
// drain delay.
type dropCause int32

const (
	notDropped dropCause = iota
	dropConnError
	dropMembership
	dropHealth
)

// New returns a pool, or an error naming the first invalid field of cfg.
// With Config.HealthCheckInterval, it starts the health checker's
// goroutine, which Close stops.
func New(cfg Config) (*Pool, error) {
	return newPool(cfg, time.Now)
}

// newPool is New with a clock for the grace period and the drain delay
// (a test's).
func newPool(cfg Config, now func() time.Time) (*Pool, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Pool{
		cfg:     cfg,
		closing: make(chan struct{}),
		now:     now,
	}
	if cfg.MaxConns > 0 {
		p.slots = make(chan struct{}, cfg.MaxConns)
	}
	cache, err := epcache.New(epcache.Config[string, *conn]{
		Create:        p.dial,
		Release:       p.release,
		CreateTimeout: cfg.DialTimeout,
		Retry:         cfg.DialRetry,
		ErrorTTL:      cfg.ErrorTTL,
		IdleTimeout:   cfg.IdleTimeout,
		MaxEntries:    cfg.MaxConns,
	})
	if err != nil {
		return nil, fmt.Errorf("grpcpool: %w", err)
	}
	p.cache = cache
	if cfg.HealthCheckInterval > 0 {
		p.health.Add(1)
		go p.checkHealth()
	}
	return p, nil
}

// Do runs call on addr's connection (dialing it once, however many callers
// ask at once), holding it for the call: the pool never closes a connection
// while a call on it runs. A connection error (IsConnError) drops that
// connection, never its replacement; the next Do dials again.
//
// Do returns call's error as it is. When there is no connection to run call
// on, it returns ctx.Err() itself if ctx ended while Do waited for a dial,
// and otherwise an error that names the pool and addr ("grpcpool: dial
// \"addr\": …"): the dial's (within ErrorTTL, the remembered error of the
// last dial, at once), a wait for room under MaxConns that ctx ended
// (wrapping ctx.Err()), or, once Close has begun, one that matches
// ErrClosed. If addr is not a member (once SetMembers has been called), call runs all
// the same, and the connection is closed once its calls end.
//
// On a ready connection Do takes no lock and allocates nothing of its own:
// a lease (two compare-and-swaps) and a counter. If call panics, the
// connection is let go and the panic propagates.
func (p *Pool) Do(ctx context.Context, addr string, call func(ctx context.Context, cc grpc.ClientConnInterface) error) error {
	if call == nil {
		return fmt.Errorf("grpcpool: Do %q with a nil call", addr)
	}
	lease, err := p.cache.Acquire(ctx, addr)
	if err != nil {
		return p.noConn(ctx, addr, err)
	}
	defer lease.Release() // after a drop below: the last lease closes the connection
	c := lease.Value()
	p.st.calls.Add(1)
	err = call(ctx, c.cc)
	if err != nil && p.isConnError(err, c.cc) {
		p.st.connErrors.Add(1)
		p.drop(c, dropConnError)
	} else if m := p.members.Load(); m != nil && !m.has(addr) {
		p.drop(c, dropMembership)
	}
	return err
}

// isConnError is Config.IsConnError, or the default: see IsConnError's doc.
func (p *Pool) isConnError(err error, cc *grpc.ClientConn) bool {
	if p.cfg.IsConnError != nil {
		return p.cfg.IsConnError(err)
	}
	return IsUnavailable(err) && cc.GetState() != connectivity.Ready
}

// noConn is Do's and Warm's error when the cache gave them no connection:
// ctx's own error as it is, and otherwise an error that names the pool and
// addr.
func (p *Pool) noConn(ctx context.Context, addr string, err error) error {
	var de *dialError
	var pe *epcache.PanicError
	switch {
	case errors.Is(err, epcache.ErrClosed):
		return &closedError{addr}
	case ctx.Err() != nil && err == ctx.Err():
		return err // the caller's own context ended while it waited for a dial: unchanged
	case errors.As(err, &de) && err == error(de):
		return err // the dial's own error, which names addr
	case errors.Is(err, epcache.ErrCreateTimeout):
		// The dial neither succeeded nor failed in time (an address that
		// never answers, a Dial that hangs).
		return fmt.Errorf("grpcpool: dial %q: no Ready connection within DialTimeout (%v): %w", addr, p.cfg.DialTimeout, err)
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return fmt.Errorf("grpcpool: dial %q: no room under MaxConns before the call's context ended: %w", addr, err)
	case errors.Is(err, epcache.ErrGoexit):
		return fmt.Errorf("grpcpool: dial %q: Config.Dial or Config.DialRetry called runtime.Goexit: %w", addr, err)
	case errors.As(err, &pe):
		return fmt.Errorf("grpcpool: dial %q: Config.DialRetry panicked: %w", addr, err)
	}
	return fmt.Errorf("grpcpool: dial %q: %w", addr, err)
}

// dialError is the error of a dial: it names the pool and the address.
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return fmt.Sprintf("grpcpool: dial %q: %v", e.addr, e.err) }
func (e *dialError) Unwrap() error { return e.err }

// closedError is Do's and Warm's error once Close has begun: it names the
// address, and matches ErrClosed.
type closedError struct{ addr string }

func (e *closedError) Error() string { return fmt.Sprintf("grpcpool: %q: pool closed", e.addr) }
func (e *closedError) Unwrap() error { return ErrClosed }

// drop takes c out of the pool for cause, unless it left already: the next
// Do for its address dials again, and c is closed once its last call ends
// (and its drain delay, for a departed or unhealthy member). A drop about
// an old connection never removes its replacement (CompareAndInvalidate).
func (p *Pool) drop(c *conn, cause dropCause) bool {
	if c.cause.CompareAndSwap(int32(notDropped), int32(cause)) {
		c.droppedAt.Store(p.now().UnixNano())
	}
	if !p.cache.CompareAndInvalidate(c.addr, c) {
		return false
	}
	p.st.drops[dropCause(c.cause.Load())].Add(1)
	return true
}

// SetMembers makes addrs the pool's members: connections to every other
// address are closed once the calls on them end.
//
// An address it adds (one that was not a member before) has its remembered
// dial failure forgotten (ErrorTTL), so that a member that comes back is
// dialed at once. A connection dropped here stays open for DrainDelay. Do
// still serves an address that is not a member, on a connection closed
// when its calls end. Before the first SetMembers, every address is a
// member; SetMembers(nil) makes none.
func (p *Pool) SetMembers(addrs []string) {
	set := &memberSet{m: make(map[string]struct{}, len(addrs))}
	for _, a := range addrs {
		set.m[a] = struct{}{}
	}
	p.membersMu.Lock()
	defer p.membersMu.Unlock()
	old := p.members.Swap(set)
	for a := range set.m {
		if old == nil || !old.has(a) {
			if p.cache.Forget(a) {
				p.st.forgotten.Add(1)
			}
		}
	}
	p.dropDeparted(set)
}

// dropDeparted drops the connections to addresses not in set.
func (p *Pool) dropDeparted(set *memberSet) {
	var gone []*conn
	for addr, c := range p.cache.All() {
		if !set.has(addr) {
			gone = append(gone, c)
		}
	}
	for _, c := range gone {
		p.drop(c, dropMembership)
	}
}

// Warm dials every address of addrs that has no connection, concurrently,
// and waits for the dials: the first calls then find their connections
// Ready. It returns the dials' errors, joined (nil if every address has a
// connection), or ctx.Err() if ctx ended first. Under MaxConns, warming more
// addresses than there is room for evicts connections as a Do would
// (Config.MaxConns).
func (p *Pool) Warm(ctx context.Context, addrs ...string) error {
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			lease, err := p.cache.Acquire(ctx, addr)
			if err != nil {
				errs[i] = p.noConn(ctx, addr, err)
				return
			}
			lease.Release()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// Forget drops addr's remembered dial failure (ErrorTTL), so that the next
// Do dials at once; it reports whether there was one still in force.
func (p *Pool) Forget(addr string) bool {
	return p.cache.Forget(addr)
}

// Close shuts the pool down: Do and Warm return an error matching ErrClosed
// from its first step, the health checker stops, dials in flight are
// cancelled (a Dial that ignores its context is waited for), and every
// connection is closed, drain delays cut short. A connection a call is
// using is closed when the call returns: Close waits for the calls in
// flight (cancel their contexts to hurry it). When Close returns, every
// connection the pool dialed is closed. A second Close waits for the first
// and returns its error.
func (p *Pool) Close() error {
	p.closeOnce.Do(func() {
		close(p.closing)
		p.health.Wait()
		p.closeErr = p.cache.Close()
		p.open.Wait()
	})
	return p.closeErr
}
