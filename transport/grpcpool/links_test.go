package grpcpool_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Tests of several connections per address found by an outside review.

// TestDialIsCalledAtMostOnceAtATimePerConnection: Config.Dial's doc says
// "It is called at most once at a time per connection": three calls at
// once dial one connection without MaxStreamsPerConn, and three (one each,
// all at once, each once) with one stream a connection.
func TestDialIsCalledAtMostOnceAtATimePerConnection(t *testing.T) {
	for _, tc := range []struct {
		streams, most int
	}{{0, 1}, {1, 3}} {
		t.Run(fmt.Sprintf("MaxStreamsPerConn=%d", tc.streams), func(t *testing.T) {
			s := startServer(t)
			var mu sync.Mutex
			inFlight, most := 0, 0
			gate := make(chan struct{})
			entered := make(chan struct{}, 16)
			var d countingDial
			p := newPool(t, grpcpool.Config{MaxStreamsPerConn: tc.streams, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
				mu.Lock()
				inFlight++
				most = max(most, inFlight)
				mu.Unlock()
				entered <- struct{}{}
				<-gate
				mu.Lock()
				inFlight--
				mu.Unlock()
				return d.dial(ctx, addr)
			}})
			hs := make([]*held, 3)
			for i := range hs {
				hs[i] = newHeld()
				go func() {
					defer close(hs[i].done)
					hs[i].result = p.Do(context.Background(), s.addr, hs[i].call)
				}()
			}
			for range tc.most {
				<-entered
			}
			if tc.most == 1 {
				// Every call waits for the one dial: the gate holds it.
				waitFor(t, "the three calls wait for the dial", func() bool { return p.Stats().Cache.Waits >= 2 })
			}
			close(gate)
			for _, h := range hs {
				<-h.started
			}
			for _, h := range hs {
				if err := h.finish(t); err != nil {
					t.Error(err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if most != tc.most || d.of(s.addr) != tc.most {
				t.Errorf("Config.Dial ran %d times at once, %d in all; want %d, %d (once per connection)", most, d.of(s.addr), tc.most, tc.most)
			}
		})
	}
}

// TestAnAddressWithANULIsDialedAsItself: an address is the user's
// string; the pool's link keys put a NUL in addresses, and splitKey cuts
// any address at its last NUL, so Do("host:port\x00x") dials host:port.
func TestAnAddressWithANULIsDialedAsItself(t *testing.T) {
	s := startServer(t)
	var got []string
	var mu sync.Mutex
	p := newPool(t, grpcpool.Config{Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		mu.Lock()
		got = append(got, addr)
		mu.Unlock()
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}})
	odd := s.addr + "\x00x"
	err := p.Do(context.Background(), odd, check)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != odd {
		t.Errorf("Do(%q): Dial was called with %q (Do's error: %v); want the address asked for", odd, got, err)
	}
}

// TestAnAddressWithANULIsNotAnotherAddressesLink: under MaxStreamsPerConn
// the pool's keys for A's second connection hold A, a NUL and 1; a call to
// the address "A\x001" is dialed as itself, and A keeps its connections.
func TestAnAddressWithANULIsNotAnotherAddressesLink(t *testing.T) {
	s := startServer(t)
	odd := s.addr + "\x001"
	var d countingDial
	var oddDials atomic.Int64
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if addr == odd {
			oddDials.Add(1)
			return nil, errors.New("test: no such address")
		}
		return d.dial(ctx, addr)
	}})
	hs := holdAll(t, p, s.addr, 2) // A's links 0 and 1
	if n := p.ConnsTo(s.addr); n != 2 {
		t.Fatalf("ConnsTo(A)=%d; want 2", n)
	}
	if err := p.Do(context.Background(), odd, check); err == nil || !strings.Contains(err.Error(), "no such address") {
		t.Errorf("Do(%q): %v; want its own dial's error", odd, err)
	}
	if oddDials.Load() != 1 || d.of(s.addr) != 2 || p.ConnsTo(s.addr) != 2 || p.ConnsTo(odd) != 0 {
		t.Errorf("dials of %q %d, of A %d, ConnsTo(A)=%d, ConnsTo(odd)=%d; want 1, 2, 2, 0", odd, oddDials.Load(), d.of(s.addr), p.ConnsTo(s.addr), p.ConnsTo(odd))
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestAddressChurnUnderMaxStreamsPerConnRetainsNoMemory: a ring
// whose members come and go (new pod IPs on every restart) calls a stream
// of new addresses; once none is a member and every connection is gone,
// the pool must hold nothing per address.
func TestAddressChurnUnderMaxStreamsPerConnRetainsNoMemory(t *testing.T) {
	const n = 20000
	fail := func(context.Context, string) (*grpc.ClientConn, error) { return nil, errors.New("test: down") }
	retained := func(cfg grpcpool.Config) float64 {
		p := newPool(t, cfg)
		do := func(i int) {
			addr := fmt.Sprintf("10.%d.%d.%d:9000", i>>16&255, i>>8&255, i&255)
			p.SetMembers([]string{addr})
			_ = p.Do(context.Background(), addr, check)
		}
		for i := range 1000 { // warm up the maps
			do(i)
		}
		p.SetMembers(nil)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := 1000; i < 1000+n; i++ {
			do(i)
		}
		p.SetMembers(nil)
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(p)
		return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	}
	plain := retained(grpcpool.Config{Dial: fail})
	streams := retained(grpcpool.Config{Dial: fail, MaxStreamsPerConn: 100})
	t.Logf("heap retained per departed address: %.0f bytes without MaxStreamsPerConn, %.0f with", plain, streams)
	if streams > 64 {
		t.Errorf("with MaxStreamsPerConn the pool keeps %.0f bytes per address that has left (%d addresses: %.1f MB); without it %.0f", streams, n, streams*n/1e6, plain)
	}
}

// TestABurstDialsCeilWaitingOverMaxStreams: 400 callers at once, 100
// streams a connection: 4 dials, each once.
func TestABurstDialsCeilWaitingOverMaxStreams(t *testing.T) {
	const calls, per = 400, 100
	s := startServer(t)
	g := newGatedDial()
	g.entered = make(chan string, 1000)
	p := newPool(t, grpcpool.Config{Dial: g.dial, MaxStreamsPerConn: per})
	var started sync.WaitGroup
	release := make(chan struct{})
	errs := make(chan error, calls)
	started.Add(calls)
	for range calls {
		go func() {
			errs <- p.Do(context.Background(), s.addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
				started.Done()
				<-release
				return check(ctx, cc)
			})
		}()
	}
	for range 4 {
		<-g.entered
	}
	close(g.gate)
	started.Wait()
	close(release)
	for range calls {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := g.d.of(s.addr); n != 4 {
		t.Errorf("%d dials for %d calls, %d streams each; want 4", n, calls, per)
	}
	if st := p.Stats(); st.Grown != 3 {
		t.Errorf("Grown=%d; want 3; stats %+v", st.Grown, st)
	}
}

// TestMaxConnsPerAddrOneWithStreams: MaxConnsPerAddr 1 under
// MaxStreamsPerConn: one dial, every call runs (over the limit, queued by
// gRPC), none fails.
func TestMaxConnsPerAddrOneWithStreams(t *testing.T) {
	s := startServer(t)
	var d countingDial
	p := newPool(t, grpcpool.Config{Dial: d.dial, MaxStreamsPerConn: 2, MaxConnsPerAddr: 1})
	hs := holdAll(t, p, s.addr, 6)
	if c, _ := connsOf(hs); c != 1 || d.of(s.addr) != 1 || p.ConnsTo(s.addr) != 1 {
		t.Errorf("%d connections used, %d dials, ConnsTo %d; want 1, 1, 1", c, d.of(s.addr), p.ConnsTo(s.addr))
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
	if st := p.Stats(); st.StreamWaits != 4 {
		t.Errorf("StreamWaits=%d; want 4", st.StreamWaits)
	}
}

// TestAGrowthWaitForASlotIsNotRemembered: a growth call that waits
// for a slot under MaxConns until its context ends gets the slot error,
// and ErrorTTL does not remember it: the next growth dials.
func TestAGrowthWaitForASlotIsNotRemembered(t *testing.T) {
	s := startServer(t)
	var d countingDial
	p := newPool(t, grpcpool.Config{Dial: d.dial, MaxStreamsPerConn: 1, MaxConns: 1, ErrorTTL: time.Hour})
	h := holdAll(t, p, s.addr, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := p.Do(ctx, s.addr, check)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "slot") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("growth past MaxConns: %v; want the slot error wrapping DeadlineExceeded", err)
	}
	if err := h[0].finish(t); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.DialErrors != 0 || st.ErrorHits != 0 {
		t.Errorf("a wait for a slot counted as a dial failure: %+v", st)
	}
	h2 := holdAll(t, p, s.addr, 1)
	done := make(chan error, 1)
	go func() { done <- p.Do(context.Background(), s.addr, check) }()
	time.Sleep(50 * time.Millisecond)
	if err := h2[0].finish(t); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("a call that waited for a slot and then a freed stream: %v", err)
	}
}

// TestStressSocketsNeverExceedMaxConns: many goroutines, several
// addresses, growth, SetMembers churn, drains, idle removals, connection
// errors; the sockets open never exceed MaxConns, no call fails because the
// pool closed its connection, and everything closes.
func TestStressSocketsNeverExceedMaxConns(t *testing.T) {
	const maxConns = 6
	var srvs []*server
	for range 3 {
		srvs = append(srvs, startServer(t))
	}
	baseline := openFDs(t)
	var socks sockets
	p, err := grpcpool.New(grpcpool.Config{
		DialOptions:         socks.options(),
		DialTimeout:         patience,
		MaxConns:            maxConns,
		MaxStreamsPerConn:   2,
		MaxConnsPerAddr:     3,
		IdleTimeout:         20 * time.Millisecond,
		DrainDelay:          5 * time.Millisecond,
		HealthCheckInterval: 3 * time.Millisecond,
		HealthCheckTimeout:  patience,
	})
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{srvs[0].addr, srvs[1].addr, srvs[2].addr}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	var firstBad atomic.Value
	var tallyMu sync.Mutex
	tally := map[string]int{}
	defer func() { t.Logf("errors: %v", tally) }()
	for g := range 24 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				addr := addrs[r.IntN(len(addrs))]
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				err := p.Do(ctx, addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
					if r.IntN(4) == 0 {
						time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
					}
					return check(ctx, cc)
				})
				cancel()
				if err != nil {
					k := err.Error()
					if i := strings.Index(k, "127.0.0.1"); i >= 0 {
						k = k[:i]
					}
					if len(k) > 60 {
						k = k[:60]
					}
					tallyMu.Lock()
					tally[k]++
					tallyMu.Unlock()
				}
				if err != nil && (strings.Contains(err.Error(), "closing") || strings.Contains(err.Error(), "Canceled")) {
					if bad.Add(1) == 1 {
						firstBad.Store(err.Error())
					}
				}
			}
		})
	}
	wg.Go(func() {
		r := rand.New(rand.NewPCG(99, 1))
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var m []string
			for _, a := range addrs {
				if r.IntN(3) > 0 {
					m = append(m, a)
				}
			}
			p.SetMembers(m)
		}
	})
	var over atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := socks.g.now.Load(); n > maxConns {
				over.Store(n)
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Error(err)
	}
	st := p.Stats()
	t.Logf("stats: dials %d grown %d shrunk %d waits %d calls %d drops member %d nonmember %d idle %d evicted %d health %d connerr %d peakopen %d socketpeak %d",
		st.Dials, st.Grown, st.Shrunk, st.StreamWaits, st.Calls, st.DropsMembership, st.DropsNonMember, st.DropsIdle, st.DropsEvicted, st.DropsHealth, st.DropsConnError, st.PeakOpen, socks.g.peak.Load())
	if pk := socks.g.peak.Load(); pk > maxConns {
		t.Errorf("%d sockets open at once; MaxConns %d", pk, maxConns)
	}
	if st.PeakOpen > maxConns {
		t.Errorf("PeakOpen %d > MaxConns %d", st.PeakOpen, maxConns)
	}
	if n := bad.Load(); n > 0 {
		t.Errorf("%d calls failed with the connection closing under them; first: %v", n, firstBad.Load())
	}
	if st.Open != 0 || st.Draining != 0 || socks.g.now.Load() != 0 {
		t.Errorf("after Close: Open %d Draining %d sockets %d", st.Open, st.Draining, socks.g.now.Load())
	}
	if grpcpool.Guests(p) != 0 {
		t.Errorf("guests left: %d", grpcpool.Guests(p))
	}
	checkFDs(t, baseline)
}

// TestAFreedStreamUnderAFullPoolDialsNothing: MaxConns 1, one
// stream a connection. A second call to the address waits (for a slot,
// for growth); the first call ends, freeing the stream, which the second
// takes ("a waiting call takes a stream freed meanwhile"). Nothing needs a
// second connection: the address's one connection must not be evicted
// for a growth dial nobody waits for any more.
func TestAFreedStreamUnderAFullPoolDialsNothing(t *testing.T) {
	s := startServer(t)
	var d countingDial
	p := newPool(t, grpcpool.Config{Dial: d.dial, MaxStreamsPerConn: 1, MaxConns: 1})
	h := holdAll(t, p, s.addr, 1)
	done := make(chan error, 1)
	var second atomic.Pointer[grpc.ClientConn]
	go func() {
		done <- p.Do(context.Background(), s.addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
			second.Store(cc.(*grpc.ClientConn))
			return check(ctx, cc)
		})
	}()
	waitFor(t, "the second call waits for a slot", func() bool { return p.Stats().SlotWaits > 0 })
	if err := h[0].finish(t); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Let anything in flight settle: the pool is quiet now.
	waitFor(t, "no dial in flight", func() bool { st := p.Stats(); return st.Open == st.Cache.Ready && st.Open <= 1 })
	time.Sleep(100 * time.Millisecond)
	st := p.Stats()
	if n := d.of(s.addr); n != 1 {
		t.Errorf("%d dials for one address whose one connection served every call in turn; want 1 (evicted %d, grown %d, shrunk %d; the second call ran on the first call's connection: %v)", n, st.DropsEvicted, st.Grown, st.Shrunk, second.Load() == h[0].cc.Load())
	}
}

// TestWarmOfAMemberWithAReadyConnectionSucceeds: Warm "returns the
// dials' errors, joined (nil if every member has a connection)". An
// address whose first connection's redial failed (remembered, ErrorTTL)
// but whose second connection is ready has a connection.
func TestWarmOfAMemberWithAReadyConnectionSucceeds(t *testing.T) {
	s := startServer(t)
	var failing atomic.Bool
	var d countingDial
	p := newPool(t, grpcpool.Config{
		MaxStreamsPerConn: 1,
		ErrorTTL:          patience,
		IsConnError:       func(err error) bool { return errors.Is(err, errBad) },
		Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
			if failing.Load() {
				return nil, errors.New("test: refused for now")
			}
			return d.dial(ctx, addr)
		},
	})
	hs := holdAll(t, p, s.addr, 2) // links 0 and 1
	// A connection error on link 0 (the least loaded rule puts this call
	// on link 0 once hs[0] is done).
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
	var onFirst atomic.Bool
	if err := p.Do(context.Background(), s.addr, func(_ context.Context, cc grpc.ClientConnInterface) error {
		onFirst.Store(cc.(*grpc.ClientConn) == hs[0].cc.Load())
		return errBad
	}); err != errBad {
		t.Fatal(err)
	}
	if !onFirst.Load() {
		t.Skip("the call did not land on the first connection")
	}
	failing.Store(true)
	// link 1 is busy: this call regrows link 0, whose dial fails and is
	// remembered; it runs over the limit on link 1.
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatalf("a call while link 0's redial fails: %v", err)
	}
	if n := p.ConnsTo(s.addr); n != 1 {
		t.Fatalf("ConnsTo=%d; want 1", n)
	}
	if err := p.Warm(context.Background(), s.addr); err != nil {
		t.Errorf("Warm(%s) with %d connection ready: %v; want nil", s.addr, p.ConnsTo(s.addr), err)
	}
	if err := hs[1].finish(t); err != nil {
		t.Error(err)
	}
}

// TestHealthProbesAreFailFastWhateverTheDefaultCallOptions: the
// user's default call options say WaitForReady; a stopped server's
// connections (every link) are still dropped by their health checks,
// well before HealthCheckTimeout (an hour).
func TestHealthProbesAreFailFastWhateverTheDefaultCallOptions(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{
		DialOptions: []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.WaitForReady(true)),
		},
		MaxStreamsPerConn:   1,
		HealthCheckInterval: 5 * time.Millisecond,
	})
	hs := holdAll(t, p, s.addr, 3)
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.ConnsTo(s.addr); n != 3 {
		t.Fatalf("ConnsTo=%d; want 3", n)
	}
	s.stop()
	waitFor(t, "every connection of the stopped server dropped", func() bool { return p.ConnsTo(s.addr) == 0 })
}

// TestAGrowthDialOvertakenBySetMembersClosesWithItsLastCall: a
// member's growth call waits for its link's dial; SetMembers removes the
// address; the dial serves the call, and the connection is closed before
// that call's Do returns (the rule for non-members).
func TestAGrowthDialOvertakenBySetMembersClosesWithItsLastCall(t *testing.T) {
	s := startServer(t)
	var socks sockets
	var dials atomic.Int64
	gate := make(chan struct{})
	opts := socks.options()
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if dials.Add(1) == 2 {
			<-gate
		}
		return grpc.NewClient(addr, opts...)
	}})
	p.SetMembers([]string{s.addr})
	if err := p.Do(context.Background(), s.addr, check); err != nil { // link 0 ready: the held call below takes the hit path, uncounted
		t.Fatal(err)
	}
	hs := holdAll(t, p, s.addr, 1)
	second := newHeld()
	go func() {
		defer close(second.done)
		second.result = p.Do(context.Background(), s.addr, second.call)
	}()
	waitFor(t, "the growth dial begins", func() bool { return dials.Load() == 2 })
	p.SetMembers(nil)
	close(gate)
	select {
	case <-second.started:
	case <-second.done:
		t.Fatalf("the growth call failed: %v", second.result)
	}
	if err := second.finish(t); err != nil {
		t.Fatal(err)
	}
	if n := socks.to(s.addr); n != 1 {
		st := p.Stats()
		t.Errorf("after the growth call's Do returned: %d sockets to the departed address; want 1 (the first call's). ConnsTo=%d Open=%d Dials=%d Ready=%d DropsNonMember=%d DropsMembership=%d Abandoned=%d same conn as first: %v", n, p.ConnsTo(s.addr), st.Open, st.Dials, st.Ready, st.DropsNonMember, st.DropsMembership, st.Abandoned, second.cc.Load() == hs[0].cc.Load())
	}
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no socket left", func() bool { return socks.to(s.addr) == 0 })
	if st := p.Stats(); st.Dials != 2 {
		t.Errorf("%d dials; want 2", st.Dials)
	}
}

// TestGrowthEvictsAnIdleConnectionRatherThanWaitOutADrain: MaxConns
// 3: A's connection busy, B's draining (DrainDelay an hour), C's idle. A's
// growth evicts C at once.
func TestGrowthEvictsAnIdleConnectionRatherThanWaitOutADrain(t *testing.T) {
	a, b, c := startServer(t), startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxConns: 3, MaxStreamsPerConn: 1, DrainDelay: patience})
	p.SetMembers([]string{a.addr, b.addr, c.addr})
	if err := p.Warm(context.Background(), b.addr, c.addr); err != nil {
		t.Fatal(err)
	}
	hs := holdAll(t, p, a.addr, 1)
	p.SetMembers([]string{a.addr, c.addr}) // B drains
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	h2 := newHeld()
	go func() {
		defer close(h2.done)
		h2.result = p.Do(ctx, a.addr, h2.call)
	}()
	select {
	case <-h2.started:
	case <-h2.done:
		t.Fatalf("growth: %v", h2.result)
	}
	if st := p.Stats(); st.DropsEvicted != 1 || p.ConnsTo(c.addr) != 0 || p.ConnsTo(a.addr) != 2 {
		t.Errorf("evicted %d, ConnsTo(C)=%d, ConnsTo(A)=%d; want 1, 0, 2", st.DropsEvicted, p.ConnsTo(c.addr), p.ConnsTo(a.addr))
	}
	for _, h := range append(hs, h2) {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestCloseWithGrowthWaitersForASlot: calls waiting for a slot for
// growth return ErrClosed once Close begins; Close returns once the calls
// holding connections end.
func TestCloseWithGrowthWaitersForASlot(t *testing.T) {
	s := startServer(t)
	p, err := grpcpool.New(grpcpool.Config{MaxConns: 2, MaxStreamsPerConn: 1, DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		t.Fatal(err)
	}
	hs := holdAll(t, p, s.addr, 2)
	errs := make(chan error, 5)
	for range 5 {
		go func() { errs <- p.Do(context.Background(), s.addr, check) }()
	}
	waitFor(t, "the waiters wait", func() bool { return p.Stats().StreamWaits >= 5 })
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	for range 5 {
		select {
		case err := <-errs:
			if err != nil && !errors.Is(err, grpcpool.ErrClosed) {
				t.Errorf("a waiter: %v; want nil or ErrClosed", err)
			}
		case <-time.After(hang):
			t.Fatal("a waiter did not return after Close began")
		}
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Errorf("a held call failed after Close began: %v", err)
		}
	}
	if err := <-closed; err != nil {
		t.Error(err)
	}
}

func TestNewFieldsRejectNegatives(t *testing.T) {
	for _, tc := range []struct {
		cfg   grpcpool.Config
		field string
	}{
		{grpcpool.Config{MaxStreamsPerConn: -1}, "MaxStreamsPerConn"},
		{grpcpool.Config{MaxConnsPerAddr: -1}, "MaxConnsPerAddr"},
		{grpcpool.Config{MaxStreamsPerConn: 1, MaxConnsPerAddr: -5}, "MaxConnsPerAddr"},
	} {
		_, err := grpcpool.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v): %v; want an error naming %s", tc.cfg, err, tc.field)
		}
	}
}

// TestStressShrinkRacingLoad: tiny IdleTimeout, injected connection
// errors, SetMembers churn, health rounds, bursts: no call fails but the
// injected ones, and everything closes.
func TestStressShrinkRacingLoad(t *testing.T) {
	var srvs []*server
	for range 2 {
		srvs = append(srvs, startServer(t))
	}
	var socks sockets
	var injected = status0()
	p, err := grpcpool.New(grpcpool.Config{
		DialOptions:         socks.options(),
		DialTimeout:         patience,
		MaxStreamsPerConn:   2,
		IdleTimeout:         time.Millisecond,
		HealthCheckInterval: 2 * time.Millisecond,
		HealthCheckTimeout:  patience,
		IsConnError:         func(err error) bool { return errors.Is(err, injected) },
	})
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{srvs[0].addr, srvs[1].addr}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	var firstBad atomic.Value
	for g := range 32 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for {
				select {
				case <-stop:
					return
				default:
				}
				addr := addrs[r.IntN(len(addrs))]
				inject := r.IntN(20) == 0
				err := p.Do(context.Background(), addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
					if err := check(ctx, cc); err != nil {
						return err
					}
					if r.IntN(3) == 0 {
						time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
					}
					if inject {
						return injected
					}
					return check(ctx, cc)
				})
				if err != nil && !errors.Is(err, injected) {
					if bad.Add(1) == 1 {
						firstBad.Store(err.Error())
					}
				}
				if r.IntN(50) == 0 {
					time.Sleep(3 * time.Millisecond) // let links idle out
				}
			}
		})
	}
	wg.Go(func() {
		r := rand.New(rand.NewPCG(5, 5))
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			if r.IntN(2) == 0 {
				p.SetMembers(addrs)
			} else {
				p.SetMembers(addrs[:r.IntN(2)])
			}
		}
	})
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Error(err)
	}
	st := p.Stats()
	t.Logf("dials %d grown %d shrunk %d waits %d calls %d idle %d connerr %d member %d nonmember %d health %d peak sockets %d",
		st.Dials, st.Grown, st.Shrunk, st.StreamWaits, st.Calls, st.DropsIdle, st.DropsConnError, st.DropsMembership, st.DropsNonMember, st.DropsHealth, socks.g.peak.Load())
	if n := bad.Load(); n > 0 {
		t.Errorf("%d calls failed; first: %v", n, firstBad.Load())
	}
	if st.Open != 0 || socks.g.now.Load() != 0 || grpcpool.Guests(p) != 0 {
		t.Errorf("after Close: Open %d sockets %d guests %d", st.Open, socks.g.now.Load(), grpcpool.Guests(p))
	}
}

var errInjected = errors.New("test: injected connection error")

func status0() error { return errInjected }

// TestAPanickingCallOnAGrowthLinkLeavesTheCountsRight: a call that
// panics on a growth connection lets it go: the stream counts, the guests
// and the connections come out right, and the next calls use the freed
// stream.
func TestAPanickingCallOnAGrowthLinkLeavesTheCountsRight(t *testing.T) {
	s := startServer(t)
	var d countingDial
	p := newPool(t, grpcpool.Config{Dial: d.dial, MaxStreamsPerConn: 1, MaxConnsPerAddr: 2})
	hs := holdAll(t, p, s.addr, 1)
	func() {
		defer func() {
			if r := recover(); r != "test: boom" {
				t.Errorf("recovered %v; want the call's panic", r)
			}
		}()
		_ = p.Do(context.Background(), s.addr, func(context.Context, grpc.ClientConnInterface) error { panic("test: boom") })
	}()
	// Both streams must be free for one call each again: link 1 is free.
	h2 := holdAll(t, p, s.addr, 1)
	if c, most := connsOf(append(hs, h2...)); c != 2 || most != 1 {
		t.Errorf("%d connections, at most %d calls on one; want 2 and 1", c, most)
	}
	for _, h := range append(hs, h2...) {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
	if n := d.of(s.addr); n != 2 {
		t.Errorf("%d dials; want 2", n)
	}
	if g := grpcpool.Guests(p); g != 0 {
		t.Errorf("guests %d once every call ended; want 0", g)
	}
}

// TestACallLeavingAGrowthWaitGetsCtxErrItself: Do "returns
// ctx.Err() itself if ctx ended while Do waited for a dial"; the growth
// dial goes on and its connection serves the next call.
func TestACallLeavingAGrowthWaitGetsCtxErrItself(t *testing.T) {
	s := startServer(t)
	var dials atomic.Int64
	gate := make(chan struct{})
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if dials.Add(1) == 2 {
			<-gate
		}
		return d.dial(ctx, addr)
	}})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	hs := holdAll(t, p, s.addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Do(ctx, s.addr, check) }()
	waitFor(t, "the growth dial begins", func() bool { return dials.Load() == 2 })
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Errorf("a call that left its growth wait: %v; want context.Canceled itself", err)
	}
	open()
	waitFor(t, "the growth connection is ready", func() bool { return p.ConnsTo(s.addr) == 2 })
	h2 := holdAll(t, p, s.addr, 1)
	if c, _ := connsOf(append(hs, h2...)); c != 2 || dials.Load() != 2 {
		t.Errorf("%d connections, %d dials; want 2, 2", c, dials.Load())
	}
	for _, h := range append(hs, h2...) {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestCallsRunAtOnceOnAServerWithMaxConcurrentStreams: a server
// that allows 2 streams a connection; the pool, told so, runs 6 calls at
// once on 3 connections, none queued by gRPC.
func TestCallsRunAtOnceOnAServerWithMaxConcurrentStreams(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxConcurrentStreams(2))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	addr := ln.Addr().String()
	var d countingDial
	p := newPool(t, grpcpool.Config{Dial: d.dial, MaxStreamsPerConn: 2})
	held := holdAll(t, p, addr, 6)
	if c, most := connsOf(held); c != 3 || most != 2 || d.of(addr) != 3 {
		t.Errorf("%d connections, at most %d calls on one, %d dials; want 3, 2, 3", c, most, d.of(addr))
	}
	for _, h := range held {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}
