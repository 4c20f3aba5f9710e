package grpcpool

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/epcache/epcache/epcache"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// dial is the cache's Create: one attempt at addr's connection, Ready. Its
// slot under MaxConns is the cache's room, taken before Create starts. It
// closes the connection if the attempt does not end with one: it fails,
// panics, is cut short by runtime.Goexit, or is abandoned (nobody is left
// to use it: Pool.abandoned, asked before Dial and again once the
// connection is Ready, so that a connection SetMembers overtook is not
// published).
func (p *Pool) dial(ctx context.Context, key string) (_ *conn, err error) {
	addr, link := key, 0
	if p.cfg.MaxStreamsPerConn > 0 {
		addr, link = splitKey(key)
	}
	if addr == "" {
		return nil, &dialError{addr, errors.New("empty address")}
	}
	if p.abandoned(addr) {
		p.st.abandoned.Add(1)
		return nil, errAbandoned
	}
	p.st.dials.Add(1)
	p.st.opening()
	p.open.Add(1)
	var cc *grpc.ClientConn
	made := false
	defer func() {
		if made {
			return
		}
		// Panics of Dial are errors already (callDial); one of the pool's
		// or gRPC's own becomes one here, so that a panic the cache hands
		// on can only be DialRetry's.
		if r := recover(); r != nil {
			err = &dialError{addr, fmt.Errorf("panicked: %w", &epcache.PanicError{Value: r, Stack: debug.Stack()})}
		}
		if err == errAbandoned {
			p.st.abandoned.Add(1)
		} else {
			p.st.dialErrors.Add(1) // a failure, a panic, or runtime.Goexit (err nil)
		}
		if cc != nil {
			_ = cc.Close()
		}
		p.closed()
	}()
	cc, err = p.callDial(ctx, addr)
	if err != nil {
		return nil, err
	}
	if err = waitReady(ctx, cc); err != nil {
		return nil, &dialError{addr, err}
	}
	if p.abandoned(addr) {
		return nil, errAbandoned
	}
	made = true
	if link > 0 {
		p.st.grown.Add(1)
	}
	return &conn{addr: addr, key: key, link: link, cc: cc}, nil
}

// callDial calls Config.Dial, turning a panic and a nil connection into
// errors.
func (p *Pool) callDial(ctx context.Context, addr string) (cc *grpc.ClientConn, err error) {
	defer func() {
		if r := recover(); r != nil {
			cc = nil
			err = &dialError{addr, fmt.Errorf("Config.Dial panicked: %w", &epcache.PanicError{Value: r, Stack: debug.Stack()})}
		}
	}()
	cc, err = p.cfg.Dial(ctx, addr)
	switch {
	case err != nil:
		if cc != nil {
			_ = cc.Close()
		}
		return nil, &dialError{addr, err}
	case cc == nil:
		return nil, &dialError{addr, errors.New("Config.Dial returned neither a connection nor an error")}
	}
	return cc, nil
}

// waitReady connects cc and waits until it is Ready (nil), fails
// (TRANSIENT_FAILURE: the reason gRPC gives), or ctx ends.
func waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	cc.Connect()
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.Shutdown:
			return errors.New("connection closed while dialing")
		case connectivity.TransientFailure:
			return failure(ctx, cc)
		case connectivity.Idle:
			cc.Connect()
		}
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("not Ready (still %v): %w", s, context.Cause(ctx))
		}
	}
}

// failure is the reason a connection in TRANSIENT_FAILURE failed. gRPC
// gives it only to a call: a fail-fast call on a connection in
// TRANSIENT_FAILURE fails at once, without reaching any server, with status
// Unavailable and the reason ("connection refused", "no such host", "error
// reading server preface"…). It is asked of the health service, which a
// server that answered would at worst not implement.
func failure(ctx context.Context, cc *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// Fail-fast whatever the user's default call options say: a
	// WaitForReady probe would wait out its timeout on the broken
	// connection, and come back without the reason.
	err := cc.Invoke(ctx, healthpb.Health_Check_FullMethodName, &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}, grpc.WaitForReady(false))
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unavailable {
		return fmt.Errorf("connection failed: %s", s.Message())
	}
	return errors.New("connection failed (TRANSIENT_FAILURE)")
}

// closed accounts for a connection closed (or a dial failed): Close stops
// waiting for it.
func (p *Pool) closed() {
	p.st.closing()
	p.open.Done()
}

// release is the cache's Release: c has left the pool and its last lease
// has ended (a call's, or the drain's: see dropMember). It closes c; the
// cache's room, c's slot under MaxConns, comes back when it returns.
func (p *Pool) release(_ string, c *conn) {
	if c.link > 0 {
		p.st.shrunk.Add(1)
	}
	p.closeConn(c)
	if p.cfg.MaxStreamsPerConn > 0 {
		p.tidy(c.addr, true) // its last connection may have closed
	}
}

// dropMember drops c, a member's connection, for cause: its address left
// the members, or its health checks failed for the grace period. Unless c
// had a cause already (the first given counts, and says how c goes), it
// stays open for DrainDelay from the drop. The drain holds a lease of c,
// taken before the drop, so that the cache counts c in its room (MaxConns)
// until the drain ends and c's last call returns: a call that needs a slot
// meanwhile evicts an idle connection, or waits in the cache's line, as for
// any connection in use.
func (p *Pool) dropMember(c *conn, cause dropCause) {
	if !p.markDropped(c, cause) || p.cfg.DrainDelay <= 0 {
		p.drop(c, notDropped)
		return
	}
	l, leased := p.tryLease(c.key)
	if leased && l.Value() != c {
		l.Release() // c has left already; this is its replacement's lease
		leased = false
	}
	if !p.drop(c, notDropped) || !leased {
		// c had left already (no lease could hold it), as a connection
		// error or an eviction took it: that way out is the one that
		// counts.
		if leased {
			l.Release()
		}
		return
	}
	p.st.draining.Add(1)
	wait := time.Duration(c.droppedAt.Load()+int64(p.cfg.DrainDelay)) - time.Duration(p.now().UnixNano())
	go p.drainOut(l, wait)
}

// drainOut ends the drain's lease l after wait, or as soon as Close begins;
// the connection closes then if no call is left on it, else when the last
// returns.
func (p *Pool) drainOut(l epcache.Lease[string, *conn], wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.closing:
	}
	p.st.draining.Add(-1)
	l.Release()
}

// tryLease leases addr's connection if the pool holds one now, without
// dialing or waiting: an Acquire with a context that has ended answers a
// hit with a lease, and anything else with the context's error at once.
func (p *Pool) tryLease(addr string) (epcache.Lease[string, *conn], bool) {
	l, err := p.cache.Acquire(p.probe, addr)
	return l, err == nil
}

func (p *Pool) closeConn(c *conn) {
	c.closed.Store(true)
	_ = c.cc.Close()
	p.closed()
}
