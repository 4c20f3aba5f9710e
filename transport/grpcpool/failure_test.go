package grpcpool_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// deadAddr is a loopback address nothing listens on: dials are refused.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestErrorTTLRemembersAFailedDialAndSetMembersForgetsIt(t *testing.T) {
	dead := deadAddr(t)
	p := newPool(t, grpcpool.Config{ErrorTTL: patience})
	first := p.Do(context.Background(), dead, check)
	if first == nil || !containsAll(first.Error(), dead, "connection refused") {
		t.Fatalf("Do on a dead address: %v; want the dial's error", first)
	}
	for range 3 {
		if err := p.Do(context.Background(), dead, check); err == nil || err.Error() != first.Error() {
			t.Fatalf("Do within ErrorTTL: %v; want the remembered %v", err, first)
		}
	}
	if st := p.Stats(); st.Dials != 1 || st.ErrorHits != 3 {
		t.Fatalf("%d dials, %d remembered answers; want 1 and 3", st.Dials, st.ErrorHits)
	}
	p.SetMembers([]string{dead}) // added: forgotten
	_ = p.Do(context.Background(), dead, check)
	p.SetMembers([]string{dead}) // still a member: remembered
	_ = p.Do(context.Background(), dead, check)
	if st := p.Stats(); st.Dials != 2 || st.Forgotten != 1 {
		t.Fatalf("%d dials, %d forgotten; want 2 and 1", st.Dials, st.Forgotten)
	}
	p.SetMembers(nil)
	p.SetMembers([]string{dead}) // back: forgotten
	_ = p.Do(context.Background(), dead, check)
	if !p.Forget(dead) {
		t.Error("Forget found no remembered failure")
	}
	_ = p.Do(context.Background(), dead, check)
	if st := p.Stats(); st.Dials != 4 || st.Open != 0 {
		t.Fatalf("%d dials, %d open; want 4 and 0", st.Dials, st.Open)
	}
}

func TestWithoutErrorTTLEveryDoDials(t *testing.T) {
	dead := deadAddr(t)
	p := newPool(t, grpcpool.Config{})
	for range 3 {
		if err := p.Do(context.Background(), dead, check); err == nil {
			t.Fatal("Do on a dead address succeeded")
		}
	}
	if st := p.Stats(); st.Dials != 3 || st.DialErrors != 3 || st.Open != 0 {
		t.Fatalf("%d dials, %d failed, %d open; want 3, 3, 0", st.Dials, st.DialErrors, st.Open)
	}
}

func TestDialRetryRetriesWithinOneDial(t *testing.T) {
	dead := deadAddr(t)
	p := newPool(t, grpcpool.Config{DialRetry: epcache.Backoff(time.Millisecond, 4*time.Millisecond, 3, nil)})
	if err := p.Do(context.Background(), dead, check); err == nil {
		t.Fatal("Do on a dead address succeeded")
	}
	if st := p.Stats(); st.Dials != 3 || st.Cache.CreateErrors != 1 {
		t.Fatalf("%d dial attempts in %d failed dials; want 3 in 1", st.Dials, st.Cache.CreateErrors)
	}
}

func TestDialRetryWaitsForAMemberRestartingInPlace(t *testing.T) {
	addr := deadAddr(t)
	var once sync.Once
	var srv *grpc.Server
	// The server comes back when the first attempt has failed.
	retry := epcache.Backoff(time.Millisecond, 10*time.Millisecond, 0, nil)
	p := newPool(t, grpcpool.Config{DialRetry: func(attempt int, err error) (time.Duration, bool) {
		once.Do(func() {
			ln, lerr := net.Listen("tcp", addr)
			if lerr != nil {
				t.Error(lerr)
				return
			}
			srv = newHealthServer()
			go func() { _ = srv.Serve(ln) }()
		})
		return retry(attempt, err)
	}})
	if err := p.Do(context.Background(), addr, check); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Dials < 2 || st.Open != 1 {
		t.Errorf("%d dial attempts, %d open; want at least 2 and 1", st.Dials, st.Open)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if srv != nil {
		srv.Stop()
	}
}

// TestBadInputGetsAClearErrorAndLeaksNothing: each bad address or Dial
// fails Do with an error naming the address and the reason, and leaves no
// connection, goroutine (TestMain) or descriptor behind.
func TestBadInputGetsAClearErrorAndLeaksNothing(t *testing.T) {
	insecureDial := func(_ context.Context, addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	notGRPC := func(t *testing.T) string {
		// A server that is not gRPC: it accepts and closes.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		})
		t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
		return ln.Addr().String()
	}
	for _, tc := range []struct {
		name string
		addr func(t *testing.T) string
		dial func(ctx context.Context, addr string) (*grpc.ClientConn, error)
		opts []grpc.DialOption
		want []string // in the error, beside the address
	}{
		{name: "unresolvable", addr: func(*testing.T) string { return "nosuchhost.invalid:50051" }, want: []string{"nosuchhost.invalid", "connection failed"}},
		{name: "refused", addr: deadAddr, want: []string{"connection refused"}},
		{name: "not-grpc", addr: notGRPC, want: []string{"connection failed"}},
		{name: "malformed", addr: func(*testing.T) string { return "127.0.0.1:99999" }, want: []string{"connection failed"}},
		{name: "panicking-dial", addr: deadAddr, dial: func(context.Context, string) (*grpc.ClientConn, error) { panic("dial exploded") }, want: []string{"panicked", "dial exploded"}},
		{name: "dial-error", addr: deadAddr, dial: func(context.Context, string) (*grpc.ClientConn, error) { return nil, errors.New("no route") }, want: []string{"no route"}},
		{name: "nil-conn", addr: deadAddr, dial: func(context.Context, string) (*grpc.ClientConn, error) { return nil, nil }, want: []string{"neither a connection nor an error"}},
		{name: "no-credentials", addr: deadAddr, opts: []grpc.DialOption{grpc.WithUserAgent("x")}, want: []string{"no transport security set"}},
		{name: "empty-address", addr: func(*testing.T) string { return "" }, dial: insecureDial, want: []string{"empty address"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.addr(t) // a listener of its own, if any, counts in the baseline
			base := openFDs(t)
			cfg := grpcpool.Config{Dial: tc.dial, DialOptions: tc.opts}
			if tc.dial == nil && tc.opts == nil {
				cfg.Dial = insecureDial
			}
			p := newPool(t, cfg)
			err := p.Do(context.Background(), addr, check)
			if err == nil || !strings.HasPrefix(err.Error(), "grpcpool: ") || !containsAll(err.Error(), append(tc.want, addr)...) {
				t.Fatalf("Do(%q): %v; want a grpcpool error naming the address and %q", addr, err, tc.want)
			}
			if tc.name == "panicking-dial" {
				if pe := (*epcache.PanicError)(nil); !errors.As(err, &pe) {
					t.Errorf("a panic in Dial: %T, not a *epcache.PanicError", err)
				}
			}
			t.Log(err)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.Open != 0 {
				t.Fatalf("%d connections open after a failed dial and Close", st.Open)
			}
			checkFDs(t, base)
		})
	}
}

// TestADialThatIgnoresItsContext: the callers get a DialTimeout error at
// once; the connection Dial returns late is closed.
func TestADialThatIgnoresItsContext(t *testing.T) {
	s := startServer(t)
	base := openFDs(t)
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	p := newPool(t, grpcpool.Config{
		DialTimeout: time.Millisecond, // the Dial below outlasts it: it waits for the test
		Dial: func(_ context.Context, addr string) (*grpc.ClientConn, error) {
			entered <- struct{}{}
			<-gate // ignores its ctx
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		},
	})
	err := p.Do(context.Background(), s.addr, check)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !containsAll(err.Error(), s.addr, "DialTimeout") {
		t.Fatalf("Do with a hung Dial: %v; want a DialTimeout error naming %s", err, s.addr)
	}
	<-entered
	close(gate)
	waitFor(t, "the late connection is closed", func() bool {
		st := p.Stats()
		return st.Dials == 1 && st.Open == 0
	})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if s.accepted.Load() > 1 {
		t.Errorf("%d connections accepted; want at most 1", s.accepted.Load())
	}
	checkFDs(t, base)
}

// silentAddr is a listener that never accepts: the kernel completes the
// TCP handshake, and no HTTP/2 ever comes back.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String()
}

// TestAnAddressThatNeverAnswersFailsAtDialTimeout: a silent address holds
// its dial until DialTimeout, not every call until its own deadline.
func TestAnAddressThatNeverAnswersFailsAtDialTimeout(t *testing.T) {
	addr := silentAddr(t)
	p := newPool(t, grpcpool.Config{DialTimeout: time.Millisecond, ErrorTTL: patience})
	err := p.Do(context.Background(), addr, check)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !containsAll(err.Error(), addr, "DialTimeout") {
		t.Fatalf("Do to a silent address: %v; want a DialTimeout error naming it", err)
	}
	// Remembered: the next callers get the error without a dial.
	if err := p.Do(context.Background(), addr, check); err == nil {
		t.Fatal("the second Do succeeded")
	}
	waitFor(t, "the timed-out dial's connection closes", func() bool { return p.Stats().Open == 0 })
	if st := p.Stats(); st.Dials != 1 {
		t.Errorf("%d dials; want 1", st.Dials)
	}
}

// TestASilentAddressDoesNotHoldUpOthers: while a dial to a silent address
// hangs, other addresses are dialed and served, and the silent address's
// caller leaves on its own context.
func TestASilentAddressDoesNotHoldUpOthers(t *testing.T) {
	silent := silentAddr(t)
	s := startServer(t)
	p := newPool(t, grpcpool.Config{})
	errc := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { errc <- p.Do(ctx, silent, check) }()
	waitFor(t, "the dial to the silent address starts", func() bool { return p.Stats().Dials == 1 })
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("Do to a silent address: %v; want its ctx's error", err)
	}
	if err := p.Close(); err != nil { // cancels the hung dial
		t.Fatal(err)
	}
}

func TestNewRejectsABadConfigNamingTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg   grpcpool.Config
		field string
	}{
		{grpcpool.Config{MaxConns: -1}, "MaxConns"},
		{grpcpool.Config{IdleTimeout: -1}, "IdleTimeout"},
		{grpcpool.Config{DialTimeout: -1}, "DialTimeout"},
		{grpcpool.Config{HealthCheckInterval: -1}, "HealthCheckInterval"},
		{grpcpool.Config{HealthCheckTimeout: -1}, "HealthCheckTimeout"},
		{grpcpool.Config{HealthCheckGracePeriod: -1}, "HealthCheckGracePeriod"},
		{grpcpool.Config{MaxConcurrentHealthChecks: -1}, "MaxConcurrentHealthChecks"},
		{grpcpool.Config{DrainDelay: -1}, "DrainDelay"},
		{grpcpool.Config{ErrorTTL: -1}, "ErrorTTL"},
		{grpcpool.Config{MaxStreamsPerConn: -1}, "MaxStreamsPerConn"},
		{grpcpool.Config{MaxConnsPerAddr: -1}, "MaxConnsPerAddr"},
	} {
		p, err := grpcpool.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), "Config."+tc.field) {
			t.Errorf("New with a bad %s: %v; want an error naming it", tc.field, err)
		}
		if p != nil {
			t.Errorf("New with a bad %s returned a pool", tc.field)
		}
	}
}

func TestDoWithANilCall(t *testing.T) {
	p := newPool(t, grpcpool.Config{})
	if err := p.Do(context.Background(), "127.0.0.1:1", nil); err == nil {
		t.Fatal("Do with a nil call succeeded")
	}
	if st := p.Stats(); st.Dials != 0 {
		t.Errorf("%d dials for a nil call", st.Dials)
	}
}

// TestTheFailureProbeIgnoresTheUsersWaitForReady: a dial that fails
// reports gRPC's reason (here "connection refused") even when the user's
// DialOptions make every call wait for a Ready connection by default.
func TestTheFailureProbeIgnoresTheUsersWaitForReady(t *testing.T) {
	dead := deadAddr(t)
	p := newPool(t, grpcpool.Config{DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)),
	}})
	err := p.Do(context.Background(), dead, check)
	if err == nil || !containsAll(err.Error(), dead, "connection refused") {
		t.Fatalf("Do on a dead address with WaitForReady by default: %v; want the dial's reason (connection refused)", err)
	}
}
