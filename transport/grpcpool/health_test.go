package grpcpool_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// newHealthServer is a gRPC server with the standard health service alone.
func newHealthServer() *grpc.Server {
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv
}

// clock is a test's clock for the grace period and the drain delay.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestHealthGracePeriod: a member failing its checks keeps its connection
// until the checks have failed for the grace period, counted on the pool's
// clock from the first failure; a passing check starts the count again.
func TestHealthGracePeriod(t *testing.T) {
	const grace = time.Hour
	s := startServer(t)
	clk := newClock()
	p := newPoolWith(t, grpcpool.Config{HealthCheckInterval: time.Millisecond, HealthCheckGracePeriod: grace},
		func(cfg grpcpool.Config) (*grpcpool.Pool, error) { return grpcpool.NewWithClock(cfg, clk.now) })
	if err := p.Warm(context.Background(), s.addr); err != nil {
		t.Fatal(err)
	}
	failuresAfter := func(n uint64) func() bool {
		return func() bool { return p.Stats().HealthFailures >= n }
	}
	s.setServing(false)
	waitFor(t, "three failed checks", failuresAfter(3))
	clk.advance(grace - time.Nanosecond)
	waitFor(t, "more failed checks", failuresAfter(p.Stats().HealthFailures+2))
	if st := p.Stats(); st.DropsHealth != 0 || st.Ready != 1 {
		t.Fatalf("dropped within the grace period: %+v", st)
	}
	// A passing check resets the count.
	s.setServing(true)
	checks := s.checks.Load()
	waitFor(t, "passing checks", func() bool { return s.checks.Load() >= checks+2 })
	s.setServing(false)
	waitFor(t, "failing again", failuresAfter(p.Stats().HealthFailures+2))
	clk.advance(grace - time.Nanosecond)
	waitFor(t, "more failed checks", failuresAfter(p.Stats().HealthFailures+2))
	if st := p.Stats(); st.DropsHealth != 0 {
		t.Fatalf("dropped before the grace period counted from the new first failure: %+v", st)
	}
	clk.advance(time.Nanosecond)
	waitFor(t, "the failing member is dropped", func() bool { return p.Stats().DropsHealth == 1 })
	waitFor(t, "its connection closes", func() bool { return p.Stats().Open == 0 })
	// The member stays a member: the next call dials it again.
	s.setServing(true)
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Dials != 2 {
		t.Errorf("%d dials; want 2", st.Dials)
	}
}

// TestHealthChecksInFlightAreBounded holds every Check at the servers and
// counts the Checks running at once. A round checks the connections the
// pool holds when it starts, and waits for its checks: a round that began
// while Warm was dialing holds fewer than the bound, so the checks time out
// (HealthCheckTimeout, which only lets rounds go on: the grace period keeps
// every connection) until a round of all six holds the bound.
func TestHealthChecksInFlightAreBounded(t *testing.T) {
	const servers, bound = 6, 2
	var addrs []string
	gate := make(chan struct{})
	var group gauge
	for range servers {
		s := startServer(t)
		s.checkGate.Store(&gate)
		s.group.Store(&group)
		addrs = append(addrs, s.addr)
	}
	p := newPool(t, grpcpool.Config{
		HealthCheckInterval:       time.Millisecond,
		HealthCheckTimeout:        20 * time.Millisecond,
		HealthCheckGracePeriod:    patience,
		MaxConcurrentHealthChecks: bound,
	})
	if err := p.Warm(context.Background(), addrs...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bound of checks is in flight at the servers", func() bool { return group.now.Load() == bound })
	close(gate)
	waitFor(t, "every connection passes a check", func() bool {
		st := p.Stats()
		return st.HealthChecks-st.HealthFailures >= servers
	})
	// The pool's gauge: a check that timed out may linger at its server a
	// moment after the pool has let go of it and started the next.
	if st := p.Stats(); st.PeakChecks != bound || st.DropsHealth != 0 {
		t.Errorf("%d checks in flight at once, %d connections dropped; want exactly %d (MaxConcurrentHealthChecks) and 0", st.PeakChecks, st.DropsHealth, bound)
	}
}

func TestHealthChecksDoNotKeepAConnectionFromGoingIdle(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{HealthCheckInterval: time.Millisecond, IdleTimeout: 20 * time.Millisecond})
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the connection is closed for idleness despite its health checks", func() bool {
		st := p.Stats()
		return st.DropsIdle == 1 && st.Open == 0
	})
	if s.checks.Load() == 0 {
		t.Log("no health check reached the server before the connection went idle")
	}
}

// TestDrainDelay: a connection dropped because its member left stays
// open for DrainDelay, even once its calls have returned; Close cuts the
// delay short.
func TestDrainDelay(t *testing.T) {
	t.Run("long", func(t *testing.T) {
		a, b := startServer(t), startServer(t)
		p := newPool(t, grpcpool.Config{DrainDelay: patience})
		h := newHeld()
		h.run(t, p, a.addr)
		p.SetMembers([]string{b.addr})
		if err := h.finish(t); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the departed connection drains", func() bool { return p.Stats().Draining == 1 })
		if st := p.Stats(); st.Open != 1 || st.Ready != 0 {
			t.Fatalf("draining: %d open, %d ready; want 1 and 0", st.Open, st.Ready)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Open != 0 || st.Draining != 0 {
			t.Fatalf("Close left %d open, %d draining", st.Open, st.Draining)
		}
	})
	t.Run("short", func(t *testing.T) {
		a := startServer(t)
		clk := newClock()
		p := newPoolWith(t, grpcpool.Config{DrainDelay: time.Millisecond},
			func(cfg grpcpool.Config) (*grpcpool.Pool, error) { return grpcpool.NewWithClock(cfg, clk.now) })
		if err := p.Warm(context.Background(), a.addr); err != nil {
			t.Fatal(err)
		}
		p.SetMembers(nil)
		waitFor(t, "the drained connection closes", func() bool { return p.Stats().Open == 0 })
		if st := p.Stats(); st.DropsMembership != 1 || st.Closed != 1 {
			t.Fatalf("%+v: want 1 membership drop and 1 closed", st)
		}
	})
	t.Run("conn-error-skips-it", func(t *testing.T) {
		a := startServer(t)
		p := newPool(t, grpcpool.Config{DrainDelay: patience, IsConnError: grpcpool.IsUnavailable})
		_ = p.Do(context.Background(), a.addr, func(context.Context, grpc.ClientConnInterface) error { return errBad })
		waitFor(t, "the bad connection closes at once", func() bool { return p.Stats().Open == 0 })
	})
}

// TestMaxConnsCountsDrainingConnections: a draining connection holds its
// slot; with no connection to evict, a call that needs one waits for a
// slot until its context ends.
func TestMaxConnsCountsDrainingConnections(t *testing.T) {
	a, b := startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxConns: 1, DrainDelay: patience})
	if err := p.Warm(context.Background(), a.addr); err != nil {
		t.Fatal(err)
	}
	p.SetMembers([]string{b.addr})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Do(ctx, b.addr, check) }()
	waitFor(t, "the call waits for the draining connection's slot", func() bool { return p.Stats().SlotWaits == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "slot under MaxConns") {
		t.Fatalf("Do: %v; want a wait for a slot under MaxConns, ended by its ctx", err)
	}
	if st := p.Stats(); st.PeakOpen != 1 {
		t.Fatalf("peak %d open; want 1 (MaxConns)", st.PeakOpen)
	}
}

// TestANonMembersConnectionThatFailsItsHealthChecksDoesNotDrain: the rule
// for non-members holds for a connection the health checks drop: it closes
// when its last call ends, never drains, and holds no slot afterwards.
func TestANonMembersConnectionThatFailsItsHealthChecksDoesNotDrain(t *testing.T) {
	a, b := startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{HealthCheckInterval: time.Millisecond, DrainDelay: patience, MaxConns: 1})
	p.SetMembers([]string{a.addr})
	h := newHeld()
	h.run(t, p, b.addr)
	b.setServing(false)
	waitFor(t, "the health checks drop the non-member's connection", func() bool { return p.Stats().DropsHealth == 1 })
	b.setServing(true)
	if err := h.finish(t); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Open != 0 || st.Draining != 0 {
		t.Fatalf("once the last call on a non-member's unhealthy connection ended: Open=%d Draining=%d; want 0 and 0", st.Open, st.Draining)
	}
	if err := p.Do(context.Background(), a.addr, check); err != nil {
		t.Fatal(err)
	}
}

// TestAHealthRoundSeesTheMembersOfTheMoment: a member that SetMembers
// adds while a round of health checks runs is a member for the rest of
// the round: its connection, which the round reaches after SetMembers
// returned, is not dropped as a non-member's.
//
// The round reaches the connections in the cache's order, which its
// random seed sets: with MaxConcurrentHealthChecks 1 and every check of
// the members held, the round stops at the second member's, and b's
// connection comes after that with probability (members-1)/(members+1).
// Each trial is a pool of its own, so that the trials together miss the
// case with probability below 0.1%. (The interval only spaces the rounds
// out, so that the one that holds began after the setup: a round that
// began earlier makes its trial a miss, never a failure.)
func TestAHealthRoundSeesTheMembersOfTheMoment(t *testing.T) {
	const members, trials = 5, 8
	var xs []*server
	var addrs []string
	for range members {
		s := startServer(t)
		xs = append(xs, s)
		addrs = append(addrs, s.addr)
	}
	b := startServer(t)
	for trial := range trials {
		p := newPool(t, grpcpool.Config{HealthCheckInterval: 100 * time.Millisecond, MaxConcurrentHealthChecks: 1})
		p.SetMembers(addrs)
		if err := p.Warm(context.Background(), addrs...); err != nil {
			t.Fatal(err)
		}
		h := newHeld()
		h.run(t, p, b.addr) // b's connection, a non-member's with a call on it
		// Held from now on, so that the round that holds (almost always)
		// began with every connection in the pool.
		gate := make(chan struct{})
		for _, s := range xs {
			s.checkGate.Store(&gate)
		}
		waitFor(t, "the round holds at a member's check", func() bool {
			var n int64
			for _, s := range xs {
				n += s.inFlight.Load()
			}
			return n == 1
		})
		rounds := p.Stats().HealthRounds
		p.SetMembers(append([]string{b.addr}, addrs...))
		if err := h.finish(t); err != nil { // b's last non-member call
			t.Fatal(err)
		}
		close(gate)
		waitFor(t, "the round ends and another runs", func() bool { return p.Stats().HealthRounds >= rounds+2 })
		if st := p.Stats(); st.DropsNonMember != 0 || st.Ready != members+1 {
			t.Fatalf("trial %d: b became a member during a health round: %d dropped as a non-member's, %d connections ready; want 0 and %d", trial, st.DropsNonMember, st.Ready, members+1)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range xs {
		s.checkGate.Store(nil)
	}
}
