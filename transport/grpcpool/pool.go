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

// errAbandoned is the outcome of a dial that nobody is left to use: its
// address is not a member and no call to it waits (Pool.abandoned). It
// never reaches a caller: a call that gets it, from the dial or remembered
// (ErrorTTL), forgets it and asks again.
var errAbandoned = errors.New("grpcpool: dial abandoned: the address is not a member and no call waits for it")

// Pool holds one *grpc.ClientConn per address, dialed on first use. Its
// methods are safe for concurrent use. Make one with [New].
type Pool struct {
	cache *epcache.Cache[string, *conn]
	cfg   Config

	// members is the member set of the last SetMembers; nil before the
	// first, when every address is welcome.
	members   atomic.Pointer[memberSet]
	membersMu sync.Mutex // serialises SetMembers

	// guests counts, per address, the calls to it that count themselves
	// (waiting for its connection or running on it): every call to a
	// non-member, and every call to a member that found no connection
	// ready (doCounted). The rule for non-members' connections (see the
	// package doc) and the abandonment of a dial are decided under mu
	// from these counts. A call that finds a member's connection ready
	// does not count itself, so that the hit path takes no lock.
	mu     sync.Mutex
	guests map[string]int

	// open counts the dials in progress and the connections they made
	// that are not closed yet; Close waits for it to fall to zero. The
	// slots of MaxConns are the cache's room alone (MaxEntries), which
	// counts the same connections: a dial's from before Create starts,
	// a connection until its Release returns, a draining one through
	// the lease its drain holds (dropMember).
	open sync.WaitGroup

	// streams holds, per address that a call under MaxStreamsPerConn
	// reached, the count of calls on each of its connections (links.go).
	streams sync.Map // string → *streams

	// probe is a context that has ended: an Acquire with it leases a
	// connection the cache holds, and never dials or waits (tryLease).
	probe context.Context

	closing   chan struct{} // closed when Close begins: cuts drain delays and health checks
	closeOnce sync.Once
	closeErr  error
	health    sync.WaitGroup // the health checker's goroutine

	now func() time.Time // time.Now; a test's clock

	st counters
}

// conn is one connection of the pool: the value epcache holds per address,
// or per link of an address under MaxStreamsPerConn (links.go).
type conn struct {
	addr string
	key  string // its cache key: addr, or one of addr's links (linkKey)
	link int    // its link number: 0 for addr's first connection
	cc   *grpc.ClientConn

	// cause is why the pool dropped the connection (a dropCause), set once,
	// before the drop; droppedAt when (UnixNano). A connection with a
	// cause is out of service: a call to a non-member that finds it in the
	// pool does not use it.
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
	notDropped     dropCause = iota
	dropConnError            // a call's connection error
	dropMembership           // its address left the members (drains)
	dropHealth               // health checks failing for the grace period (drains)
	dropNonMember            // its address is not a member, and no call to it is left (never drains)
	numDropCauses
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
	probe, cancel := context.WithCancel(context.Background())
	cancel()
	p.probe = probe
	var retry func(int, error) (time.Duration, bool)
	if user := cfg.DialRetry; user != nil {
		retry = func(attempt int, err error) (time.Duration, bool) {
			if err == errAbandoned {
				return 0, false // nobody to dial for
			}
			return user(attempt, err)
		}
	}
	cache, err := epcache.New(epcache.Config[string, *conn]{
		Create:        p.dial,
		Release:       p.release,
		CreateTimeout: cfg.DialTimeout,
		Retry:         retry,
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
// while a call on it runs. A connection error (Config.IsConnError) drops
// that connection, never its replacement; the next Do dials again.
//
// Do returns call's error as it is. When there is no connection to run call
// on, it returns ctx.Err() itself if ctx ended while Do waited for a dial,
// and otherwise an error that names the pool and addr: the dial's
// ("grpcpool: dial \"addr\": …"; within ErrorTTL, the remembered error of
// the last dial, at once), a wait for a slot under MaxConns that ctx ended
// (wrapping ctx.Err(); no dial's, never remembered), or, once Close has
// begun, one that matches ErrClosed. If addr is not a member (once SetMembers has been called),
// call runs all the same, on a connection that the package doc's rule for
// non-members governs.
//
// On a member's ready connection Do takes no lock and allocates nothing of
// its own: a lease (two compare-and-swaps) and a counter. If call panics,
// the connection is let go and the panic propagates.
func (p *Pool) Do(ctx context.Context, addr string, call func(ctx context.Context, cc grpc.ClientConnInterface) error) error {
	if call == nil {
		return fmt.Errorf("grpcpool: Do %q with a nil call", addr)
	}
	m := p.members.Load()
	if m != nil && !m.has(addr) {
		return p.doCounted(ctx, addr, call)
	}
	if p.cfg.MaxStreamsPerConn > 0 {
		return p.doStreams(ctx, addr, call)
	}
	// The hit path: probe never dials nor waits, and takes no lock.
	lease, err := p.cache.Acquire(p.probe, addr)
	if err != nil {
		// No connection ready: the call counts itself while it waits
		// for the dial, so that the dial serves it whatever SetMembers
		// does meanwhile (Pool.abandoned).
		return p.doCounted(ctx, addr, call)
	}
	if now := p.members.Load(); now != m && !now.has(addr) {
		// The address left the members as Do took the connection: the
		// call is a non-member's.
		return p.run(ctx, addr, lease, call, p.joinConn(addr, lease.Value()))
	}
	defer lease.Release() // after a drop in call: the last lease closes the connection
	return p.call(ctx, lease.Value(), call)
}

// doCounted is Do for a call that counts itself (join) from before it asks
// for the connection to after it ends: every call to a non-member, so that
// its connection is shared by the calls that overlap and closed by the last
// (see the package doc), and every call to a member that found no
// connection ready, so that a dial that SetMembers overtakes is not
// abandoned while the call waits for it.
func (p *Pool) doCounted(ctx context.Context, addr string, call func(ctx context.Context, cc grpc.ClientConnInterface) error) error {
	p.join(addr)
	key := p.firstKey(addr)
	for {
		lease, err := p.cache.Acquire(ctx, key)
		if err != nil {
			if errors.Is(err, errAbandoned) {
				// The answer of a dial that ended before this call
				// counted itself (remembered, with ErrorTTL): not the
				// address's failure.
				p.cache.Forget(key)
				continue
			}
			p.leave(addr)
			return p.noConn(ctx, addr, err)
		}
		if c := lease.Value(); dropCause(c.cause.Load()) != notDropped {
			// Out of service (its last call ended as this one asked for
			// it, or a connection error): not this call's, which dials
			// another.
			p.drop(c, notDropped)
			lease.Release()
			continue
		}
		return p.run(ctx, addr, lease, call, true)
	}
}

// run runs call on lease's connection; counted says whether the call counts
// itself as a non-member's, to be uncounted (leave) as it ends, before its
// lease does.
func (p *Pool) run(ctx context.Context, addr string, lease epcache.Lease[string, *conn], call func(ctx context.Context, cc grpc.ClientConnInterface) error, counted bool) error {
	c := lease.Value()
	defer func() {
		if counted {
			p.leave(addr) // drops c if it was the last: the lease's end then closes it
		}
		lease.Release()
	}()
	return p.call(ctx, c, call)
}

// call runs call on c and drops c if its error is a connection error.
func (p *Pool) call(ctx context.Context, c *conn, call func(ctx context.Context, cc grpc.ClientConnInterface) error) error {
	p.st.calls.Add(1)
	err := call(ctx, c.cc)
	if err != nil && p.isConnError(err, c.cc) {
		p.st.connErrors.Add(1)
		p.drop(c, dropConnError)
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

// join counts a call to addr, a non-member, that is about to ask for its
// connection.
func (p *Pool) join(addr string) {
	p.mu.Lock()
	if p.guests == nil {
		p.guests = make(map[string]int)
	}
	p.guests[addr]++
	p.mu.Unlock()
}

// joinConn counts a call to addr, a non-member, that holds c already,
// unless c is out of service; it reports whether it counted the call.
func (p *Pool) joinConn(addr string, c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dropCause(c.cause.Load()) != notDropped {
		return false
	}
	if p.guests == nil {
		p.guests = make(map[string]int)
	}
	p.guests[addr]++
	return true
}

// leave uncounts a call to addr that join or joinConn counted. If it was
// the last and addr is still not a member, addr's connection in the pool,
// if any, is dropped: no call to addr is left to share it. (It is the
// connection the call ran on, or one dialed while it ran after a
// connection error dropped that.)
func (p *Pool) leave(addr string) {
	p.mu.Lock()
	n := p.guests[addr] - 1
	if n > 0 {
		p.guests[addr] = n
	} else {
		delete(p.guests, addr)
	}
	var gone []*conn
	if n == 0 && !p.isMember(addr) {
		for _, key := range p.keysOf(addr) {
			if cur, ok := p.cache.Load(key); ok && p.markDropped(cur, dropNonMember) {
				gone = append(gone, cur)
			}
		}
	}
	p.mu.Unlock()
	for _, c := range gone {
		p.drop(c, dropNonMember) // a call's lease, if any, then closes it as it ends
	}
}

// retire marks c, addr's connection, dropped as a non-member's if addr is
// not a member and no call to addr counts itself (join): otherwise the last
// of those calls drops it, or it is a member's. It reports whether it
// marked c; the caller then drops it. Membership is read under mu, which
// SetMembers holds as it changes the members, so that a member added
// meanwhile is never retired.
func (p *Pool) retire(addr string, c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.isMember(addr) && p.guests[addr] == 0 && p.markDropped(c, dropNonMember)
}

// abandoned reports whether a dial of addr has nobody to serve: addr is not
// a member and no call to it counts itself. (A member's dial is kept even
// when its callers have left: its connection is wanted.)
func (p *Pool) abandoned(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.isMember(addr) && p.guests[addr] == 0
}

// isMember reports whether addr is a member.
func (p *Pool) isMember(addr string) bool {
	m := p.members.Load()
	return m == nil || m.has(addr)
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
		// The cache's wait for room, which comes before any dial: no
		// failure of the address's, and never remembered.
		return fmt.Errorf("grpcpool: %q: waited for a free slot under MaxConns (%d) until the call's context ended: %w", addr, p.cfg.MaxConns, err)
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

// markDropped gives c its drop cause, unless it has one: it reports
// whether it did.
func (p *Pool) markDropped(c *conn, cause dropCause) bool {
	if !c.cause.CompareAndSwap(int32(notDropped), int32(cause)) {
		return false
	}
	c.droppedAt.Store(p.now().UnixNano())
	return true
}

// drop takes c out of the pool for cause, unless it left already: the next
// Do for its address dials again, and c is closed once its last call ends
// (and its drain delay, for a departed or unhealthy member). The first
// cause given is the one that counts. A drop about an old connection never
// removes its replacement (CompareAndInvalidate).
func (p *Pool) drop(c *conn, cause dropCause) bool {
	if cause != notDropped {
		p.markDropped(c, cause)
	}
	if !p.cache.CompareAndInvalidate(c.key, c) {
		return false
	}
	p.st.drops[dropCause(c.cause.Load())].Add(1)
	return true
}

// SetMembers makes addrs the pool's members. The connections to every
// other address leave the pool: a member's that left stays open for
// DrainDelay and until its calls end; the connection of an address that
// was not a member before either is governed by the rule for non-members
// (see the package doc), as is a dial in flight for an address that leaves.
//
// An address it adds (one that was not a member before) has its remembered
// dial failure forgotten (ErrorTTL), so that a member that comes back is
// dialed at once. Before the first SetMembers, every address is a member;
// SetMembers(nil) makes none.
func (p *Pool) SetMembers(addrs []string) {
	set := &memberSet{m: make(map[string]struct{}, len(addrs))}
	for _, a := range addrs {
		set.m[a] = struct{}{}
	}
	p.membersMu.Lock()
	defer p.membersMu.Unlock()
	p.mu.Lock() // the decisions made under mu see the members before or after, never between
	old := p.members.Swap(set)
	p.mu.Unlock()
	for a := range set.m {
		if old == nil || !old.has(a) {
			if p.forget(a) {
				p.st.forgotten.Add(1)
			}
		}
	}
	p.dropDeparted(old, set)
	if p.cfg.MaxStreamsPerConn > 0 {
		p.streams.Range(func(a, _ any) bool {
			if !set.has(a.(string)) {
				p.tidy(a.(string), false)
			}
			return true
		})
	}
}

// dropDeparted drops the connections to addresses not in set: a departed
// member's (one in old; nil: every address was) at once, to drain, whatever
// calls run on it, those counted as a non-member's included; a
// non-member's only if no call uses it (retire), else its last call does.
func (p *Pool) dropDeparted(old, set *memberSet) {
	var gone []*conn
	for _, c := range p.cache.All() {
		if !set.has(c.addr) {
			gone = append(gone, c)
		}
	}
	for _, c := range gone {
		switch {
		case old == nil || old.has(c.addr):
			p.dropMember(c, dropMembership)
		case p.retire(c.addr, c):
			p.drop(c, dropNonMember)
		}
	}
}

// Warm dials every member of addrs that has no connection, concurrently,
// and waits for the dials: the first calls then find their connections
// Ready. It skips an address that is not a member, whose connection would
// close as Warm returned (see the package doc). It returns the dials'
// errors, joined (nil if every member has a connection), or ctx.Err() if
// ctx ended first. Under MaxStreamsPerConn an address has a connection
// when any of its connections is ready: Warm then dials nothing for it.
// Under MaxConns, warming more addresses than there is
// room for evicts connections as a Do would (Config.MaxConns).
func (p *Pool) Warm(ctx context.Context, addrs ...string) error {
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() { errs[i] = p.warm(ctx, addr) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// warm is Warm of one address.
func (p *Pool) warm(ctx context.Context, addr string) error {
	for {
		m := p.members.Load()
		if m != nil && !m.has(addr) {
			return nil
		}
		if p.cfg.MaxStreamsPerConn > 0 && p.ConnsTo(addr) > 0 {
			return nil // it has a connection (its first, or another)
		}
		lease, err := p.cache.Acquire(ctx, p.firstKey(addr))
		if err != nil {
			if errors.Is(err, errAbandoned) {
				p.cache.Forget(p.firstKey(addr)) // it left the members meanwhile: skipped
				continue
			}
			if p.cfg.MaxStreamsPerConn > 0 && ctx.Err() == nil && p.ConnsTo(addr) > 0 {
				// The first connection's dial failed (or ErrorTTL
				// remembers its failure), but another connection is
				// ready: the address has one.
				return nil
			}
			return p.noConn(ctx, addr, err)
		}
		if now := p.members.Load(); now != m && !now.has(addr) {
			// It left the members while Warm waited for its connection:
			// no call holds the connection, which goes.
			if c := lease.Value(); p.retire(addr, c) {
				p.drop(c, dropNonMember)
			}
		}
		lease.Release()
		return nil
	}
}

// Forget drops addr's remembered dial failure (ErrorTTL), so that the next
// Do dials at once; it reports whether there was one still in force.
func (p *Pool) Forget(addr string) bool {
	return p.forget(addr)
}

// forget drops the remembered dial failures of addr's connections; it
// reports whether there was one.
func (p *Pool) forget(addr string) bool {
	forgot := false
	for _, key := range p.keysOf(addr) {
		if p.cache.Forget(key) {
			forgot = true
		}
	}
	return forgot
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
