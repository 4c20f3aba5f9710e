package grpcpool_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// errBad is the connection error of the tests that report one: a call
// that returns it has its connection dropped, over a Ready connection too,
// by the pools that take IsUnavailable for their Config.IsConnError.
var errBad = status.Error(codes.Unavailable, "test: this connection is bad")

// countingDial dials without TLS and counts the dials of each address.
type countingDial struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *countingDial) dial(_ context.Context, addr string) (*grpc.ClientConn, error) {
	d.mu.Lock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[addr]++
	d.mu.Unlock()
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func (d *countingDial) of(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[addr]
}

func TestDoRunsTheCallOnAReadyConnection(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{})
	for range 3 {
		if err := p.Do(context.Background(), s.addr, check); err != nil {
			t.Fatal(err)
		}
	}
	st := p.Stats()
	if st.Dials != 1 || st.Calls != 3 || st.Open != 1 || st.Ready != 1 || s.accepted.Load() != 1 {
		t.Errorf("3 calls: %d dials, %d calls, %d open, %d ready, %d accepted; want 1, 3, 1, 1, 1", st.Dials, st.Calls, st.Open, st.Ready, s.accepted.Load())
	}
}

func TestOneDialPerAddressUnderAStormOfConcurrentDo(t *testing.T) {
	const servers, goroutines = 4, 64
	base := openFDs(t)
	var addrs []string
	var srvs []*server
	for range servers {
		s := startServer(t)
		srvs = append(srvs, s)
		addrs = append(addrs, s.addr)
	}
	var d countingDial
	p := newPool(t, grpcpool.Config{Dial: d.dial})
	start := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for i := range servers {
				// Rotated starting points, as MPI ranks do, so that every
				// address is first asked for by many goroutines at once.
				if err := p.Do(context.Background(), addrs[(g+i)%servers], check); err != nil {
					t.Error(err)
					failed.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	for i, a := range addrs {
		if n, acc := d.of(a), srvs[i].accepted.Load(); n != 1 || acc != 1 {
			t.Errorf("%s: %d dials, %d connections accepted; want exactly 1", a, n, acc)
		}
	}
	if st := p.Stats(); st.Calls != servers*goroutines || st.Dials != servers {
		t.Errorf("%d calls, %d dials; want %d and %d", st.Calls, st.Dials, servers*goroutines, servers)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range srvs {
		s.stop()
	}
	checkFDs(t, base)
}

// TestNoCallFailsBecauseThePoolClosedItsConnection holds a call open on a
// connection while the pool drops it for every reason it has, and checks
// that the call, which uses the connection again after the drop, succeeds,
// and that the connection closes once it has returned.
func TestNoCallFailsBecauseThePoolClosedItsConnection(t *testing.T) {
	t.Run("cause=conn-error", func(t *testing.T) {
		s := startServer(t)
		p := newPool(t, grpcpool.Config{IsConnError: grpcpool.IsUnavailable})
		h := newHeld()
		h.run(t, p, s.addr)
		// Another call on the same connection reports it bad.
		if err := p.Do(context.Background(), s.addr, func(context.Context, grpc.ClientConnInterface) error { return errBad }); err != errBad {
			t.Fatalf("Do returned %v; want the call's own error", err)
		}
		// The next call dials anew, while the held one still runs.
		if err := p.Do(context.Background(), s.addr, check); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Dials != 2 || st.DropsConnError != 1 || st.Open != 2 {
			t.Fatalf("after the report: %d dials, %d drops, %d open; want 2, 1, 2 (the old one is in use)", st.Dials, st.DropsConnError, st.Open)
		}
		if err := h.finish(t); err != nil {
			t.Fatalf("the call on the dropped connection failed: %v", err)
		}
		waitFor(t, "the dropped connection closes once its call returned", func() bool { return p.Stats().Open == 1 })
	})

	t.Run("cause=membership", func(t *testing.T) {
		a, b := startServer(t), startServer(t)
		p := newPool(t, grpcpool.Config{})
		p.SetMembers([]string{a.addr, b.addr})
		h := newHeld()
		h.run(t, p, a.addr)
		p.SetMembers([]string{b.addr})
		if st := p.Stats(); st.DropsMembership != 1 || st.Open != 1 || st.Ready != 0 {
			t.Fatalf("after a left: %+v; want 1 drop, 1 open, 0 ready", st)
		}
		if err := h.finish(t); err != nil {
			t.Fatalf("the call to the departed member failed: %v", err)
		}
		waitFor(t, "the departed member's connection closes", func() bool { return p.Stats().Open == 0 })
	})

	t.Run("cause=health", func(t *testing.T) {
		s := startServer(t)
		p := newPool(t, grpcpool.Config{HealthCheckInterval: 1, HealthCheckGracePeriod: 0})
		h := newHeld()
		h.run(t, p, s.addr)
		// The held call's Check comes after its gate, so the server's
		// status must be back to SERVING by then; the connection is
		// dropped meanwhile.
		s.setServing(false)
		waitFor(t, "the failing member's connection is dropped", func() bool { return p.Stats().DropsHealth == 1 })
		s.setServing(true)
		if err := h.finish(t); err != nil {
			t.Fatalf("the call on the unhealthy member's connection failed: %v", err)
		}
		waitFor(t, "the dropped connection closes", func() bool { return p.Stats().Open == 0 })
	})

	t.Run("cause=idle", func(t *testing.T) {
		a, b := startServer(t), startServer(t)
		p := newPool(t, grpcpool.Config{IdleTimeout: 4}) // 4ns: sweeps as often as the runtime's timers go
		h := newHeld()
		h.run(t, p, a.addr)
		// b's connection, unused, goes idle: sweeps have passed over the
		// held one too.
		if err := p.Do(context.Background(), b.addr, check); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the unused connection is closed for idleness", func() bool { return p.Stats().DropsIdle >= 1 })
		if st := p.Stats(); st.DropsIdle != 1 {
			t.Fatalf("%d idle connections closed, the one in use among them", st.DropsIdle)
		}
		if err := h.finish(t); err != nil {
			t.Fatalf("the call on a long-used connection failed: %v", err)
		}
		waitFor(t, "the connection goes idle once its call returned", func() bool { return p.Stats().Open == 0 })
	})

	t.Run("cause=evicted", func(t *testing.T) {
		a, b := startServer(t), startServer(t)
		p := newPool(t, grpcpool.Config{MaxConns: 1})
		h := newHeld()
		h.run(t, p, a.addr)
		done := make(chan error, 1)
		go func() { done <- p.Do(context.Background(), b.addr, check) }()
		waitFor(t, "the call to b waits for room", func() bool { return p.Stats().Cache.RoomWaits >= 1 })
		if err := h.finish(t); err != nil {
			t.Fatalf("the call on the connection b wanted failed: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.DropsEvicted != 1 || st.PeakOpen != 1 {
			t.Fatalf("%d evicted, peak %d open; want 1 and 1 (MaxConns)", st.DropsEvicted, st.PeakOpen)
		}
	})

	t.Run("cause=close", func(t *testing.T) {
		s := startServer(t)
		p := newPool(t, grpcpool.Config{})
		h := newHeld()
		h.run(t, p, s.addr)
		closed := make(chan error, 1)
		go func() { closed <- p.Close() }()
		waitFor(t, "Close begins", func() bool {
			return errors.Is(p.Do(context.Background(), s.addr, check), grpcpool.ErrClosed)
		})
		if err := h.finish(t); err != nil {
			t.Fatalf("the call in flight at Close failed: %v", err)
		}
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Open != 0 {
			t.Fatalf("Close returned with %d connections open", st.Open)
		}
	})
}

// TestALateReportNeverDropsTheReplacement: a call that began on the old
// connection reports it bad after the replacement exists. The report
// names the old connection (CompareAndInvalidate): the replacement, and
// the call running on it, are untouched.
func TestALateReportNeverDropsTheReplacement(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{IsConnError: grpcpool.IsUnavailable})
	var old *grpc.ClientConn
	oldStarted, oldGate, oldDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		oldDone <- p.Do(context.Background(), s.addr, func(_ context.Context, cc grpc.ClientConnInterface) error {
			old = cc.(*grpc.ClientConn)
			close(oldStarted)
			<-oldGate
			return errBad // the late report
		})
	}()
	<-oldStarted
	if err := p.Do(context.Background(), s.addr, func(context.Context, grpc.ClientConnInterface) error { return errBad }); err != errBad {
		t.Fatal(err)
	}
	h := newHeld()
	h.run(t, p, s.addr) // on the replacement
	replacement := h.cc.Load()
	if replacement == old {
		t.Fatal("the dropped connection was handed out again")
	}
	close(oldGate)
	if err := <-oldDone; err != errBad {
		t.Fatal(err)
	}
	var now *grpc.ClientConn
	if err := p.Do(context.Background(), s.addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
		now = cc.(*grpc.ClientConn)
		return check(ctx, cc)
	}); err != nil {
		t.Fatal(err)
	}
	if now != replacement {
		t.Error("the late report about the old connection dropped its replacement")
	}
	if err := h.finish(t); err != nil {
		t.Errorf("the call on the replacement failed: %v", err)
	}
	if st := p.Stats(); st.Dials != 2 || st.DropsConnError != 1 || st.ConnErrors != 2 {
		t.Errorf("%d dials, %d drops, %d connection errors reported; want 2, 1, 2", st.Dials, st.DropsConnError, st.ConnErrors)
	}
}

func TestAnApplicationErrorNeverDropsTheConnection(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{})
	appErr := status.Error(codes.NotFound, "no such thing")
	for range 3 {
		if err := p.Do(context.Background(), s.addr, func(context.Context, grpc.ClientConnInterface) error { return appErr }); err != appErr {
			t.Fatal(err)
		}
	}
	if st := p.Stats(); st.Dials != 1 || st.DropsConnError != 0 {
		t.Errorf("%d dials, %d drops after application errors; want 1 and 0", st.Dials, st.DropsConnError)
	}
}

func TestSetMembersClosesConnectionsToDepartedAddresses(t *testing.T) {
	a, b, c := startServer(t), startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{})
	if err := p.Warm(context.Background(), a.addr, b.addr, c.addr); err != nil {
		t.Fatal(err)
	}
	p.SetMembers([]string{a.addr, b.addr})
	waitFor(t, "c's connection closes", func() bool { return p.Stats().Open == 2 })
	// Do still serves an address that is not a member, and closes its
	// connection after the call.
	if err := p.Do(context.Background(), c.addr, check); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Open != 2 {
		t.Errorf("the non-member's connection is open after its call: %d open; want 2", st.Open)
	}
	if st := p.Stats(); st.DropsMembership != 1 || st.DropsNonMember != 1 || st.Dials != 4 || st.Ready != 2 {
		t.Errorf("%+v: want 1 membership drop, 1 non-member's, 4 dials, 2 ready", st)
	}
}

func TestWarmDialsEveryAddressAndNamesTheFailures(t *testing.T) {
	a, b := startServer(t), startServer(t)
	dead := deadAddr(t)
	p := newPool(t, grpcpool.Config{})
	err := p.Warm(context.Background(), a.addr, b.addr, dead)
	if err == nil || !containsAll(err.Error(), dead, "connection refused") {
		t.Fatalf("Warm: %v; want an error naming %s and why", err, dead)
	}
	if st := p.Stats(); st.Ready != 2 || st.Open != 2 || a.accepted.Load() != 1 || b.accepted.Load() != 1 {
		t.Fatalf("after Warm: %d ready, %d open; want 2 and 2", st.Ready, st.Open)
	}
	if err := p.Warm(context.Background(), a.addr, b.addr); err != nil {
		t.Fatal(err)
	}
	if err := p.Do(context.Background(), a.addr, check); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Dials != 3 {
		t.Errorf("%d dials; want 3 (two warm connections reused)", st.Dials)
	}
}

func TestStatsCountWhatHappened(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{IsConnError: grpcpool.IsUnavailable})
	for range 4 {
		if err := p.Do(context.Background(), s.addr, check); err != nil {
			t.Fatal(err)
		}
	}
	_ = p.Do(context.Background(), s.addr, func(context.Context, grpc.ClientConnInterface) error { return errBad })
	waitFor(t, "the dropped connection closes", func() bool { return p.Stats().Open == 0 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	want := grpcpool.Stats{Dials: 1, Calls: 5, ConnErrors: 1, DropsConnError: 1, Closed: 1, PeakOpen: 1}
	got := grpcpool.Stats{Dials: st.Dials, Calls: st.Calls, ConnErrors: st.ConnErrors, DropsConnError: st.DropsConnError, Closed: st.Closed, PeakOpen: st.PeakOpen, Open: st.Open, Ready: st.Ready}
	if got != want {
		t.Errorf("Stats: %+v; want %+v", got, want)
	}
}

func TestDoAfterCloseReturnsErrClosed(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{})
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Do(context.Background(), s.addr, check); !errors.Is(err, grpcpool.ErrClosed) {
		t.Fatalf("Do after Close: %v; want ErrClosed", err)
	}
	if err := p.Warm(context.Background(), s.addr); !errors.Is(err, grpcpool.ErrClosed) {
		t.Fatalf("Warm after Close: %v; want ErrClosed", err)
	}
	p.SetMembers([]string{s.addr}) // harmless
}

func TestAPanickingCallLetsGoOfItsConnection(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v; want the call's panic", r)
			}
		}()
		_ = p.Do(context.Background(), s.addr, func(context.Context, grpc.ClientConnInterface) error { panic("boom") })
	}()
	// The lease ended: Close does not wait for it.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Open != 0 {
		t.Fatalf("%d connections open after Close", st.Open)
	}
}

func TestDoLeavesOnItsOwnContextWhileTheDialGoesOn(t *testing.T) {
	s := startServer(t)
	release := make(chan struct{})
	p := newPool(t, grpcpool.Config{Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		<-release
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Do(ctx, s.addr, check) }()
	waitFor(t, "the dial starts", func() bool { return p.Stats().Dials == 1 })
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("Do returned %v; want its own ctx.Err() unchanged", err)
	}
	close(release)
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Dials != 1 {
		t.Errorf("%d dials; want 1 (the second Do got the first's dial)", st.Dials)
	}
}

// TestMaxConnsBoundsTheConnectionsOpen runs calls to more servers than
// MaxConns, all at once, and counts the connections open at the level of
// the sockets as well as by the pool's own gauge.
func TestMaxConnsBoundsTheConnectionsOpen(t *testing.T) {
	const servers, maxConns, rounds = 12, 3, 4
	var addrs []string
	for range servers {
		addrs = append(addrs, startServer(t).addr)
	}
	var socks sockets
	p := newPool(t, grpcpool.Config{
		MaxConns:    maxConns,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), socks.dialOption()},
	})
	var wg sync.WaitGroup
	var served atomic.Int64
	for i := range servers {
		wg.Go(func() {
			for r := range rounds {
				if err := p.Do(context.Background(), addrs[(i+r)%servers], check); err != nil {
					t.Error(err)
					continue
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	st := p.Stats()
	if served.Load() != servers*rounds {
		t.Errorf("%d calls served; want %d", served.Load(), servers*rounds)
	}
	if st.PeakOpen > maxConns || socks.g.peak.Load() > maxConns {
		t.Errorf("peak open: %d by the pool's count, %d sockets; want at most MaxConns = %d", st.PeakOpen, socks.g.peak.Load(), maxConns)
	}
	t.Logf("peak open %d (pool), %d (sockets); %d dials, %d evictions", st.PeakOpen, socks.g.peak.Load(), st.Dials, st.DropsEvicted)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := socks.g.now.Load(); n != 0 {
		t.Errorf("%d sockets open after Close", n)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
