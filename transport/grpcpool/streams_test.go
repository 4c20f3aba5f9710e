package grpcpool_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
)

// The tests of this file hold Config.MaxStreamsPerConn and
// Config.MaxConnsPerAddr: several connections to one address, each dialed
// once, grown when the ones held are full.

// holdAll starts n held calls to addr, one after another, each holding its
// connection before the next begins, so that the links they take are the
// rule's, in order.
func holdAll(t *testing.T, p *grpcpool.Pool, addr string, n int) []*held {
	t.Helper()
	hs := make([]*held, n)
	for i := range hs {
		hs[i] = newHeld()
		hs[i].run(t, p, addr)
	}
	return hs
}

// connsOf counts the distinct connections hs run on, and the most calls
// on one.
func connsOf(hs []*held) (conns, most int) {
	per := map[*grpc.ClientConn]int{}
	for _, h := range hs {
		per[h.cc.Load()]++
	}
	for _, n := range per {
		most = max(most, n)
	}
	return len(per), most
}

// TestCallsBeyondMaxStreamsPerConnGrowTheLinksOnceEach: five calls that
// arrive at once, two streams a connection, wait for ⌈5 ÷ 2⌉ = 3 dials,
// made at once, each once, and then all run together.
func TestCallsBeyondMaxStreamsPerConnGrowTheLinksOnceEach(t *testing.T) {
	const calls, perConn = 5, 2
	s := startServer(t)
	g := newGatedDial()
	p := newPool(t, grpcpool.Config{Dial: g.dial, MaxStreamsPerConn: perConn})
	hs := make([]*held, calls)
	for i := range hs {
		hs[i] = newHeld()
		go func() {
			defer close(hs[i].done)
			hs[i].result = p.Do(context.Background(), s.addr, hs[i].call)
		}()
	}
	for range 3 {
		<-g.entered // the three dials run at once, before any ends
	}
	close(g.gate)
	for _, h := range hs {
		select {
		case <-h.started:
		case <-h.done:
			t.Fatalf("a call returned before holding its connection: %v", h.result)
		case <-time.After(hang):
			t.Fatalf("a call did not start within %v", hang)
		}
	}
	conns, most := connsOf(hs)
	st := p.Stats()
	if n := g.d.of(s.addr); n != 3 || conns != 3 || most > perConn || st.Grown != 2 || p.ConnsTo(s.addr) != 3 {
		t.Errorf("%d calls at once, %d streams a connection: %d dials, %d connections used, at most %d calls on one, Grown=%d, ConnsTo=%d; want 3, 3, ≤%d, 2, 3", calls, perConn, n, conns, most, st.Grown, p.ConnsTo(s.addr), perConn)
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestACallThatFitsOnAnOpenConnectionDoesNotWaitForAGrowthDial: while a
// growth dial runs, a stream freed on the open connection serves the next
// call at once.
func TestACallThatFitsOnAnOpenConnectionDoesNotWaitForAGrowthDial(t *testing.T) {
	s := startServer(t)
	gate := make(chan struct{})
	var dials atomic.Int64
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 2, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if dials.Add(1) == 2 {
			<-gate // the growth dial waits for the test
		}
		return d.dial(ctx, addr)
	}})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)                // before Close, which waits for the dial
	hs := holdAll(t, p, s.addr, 2) // the first connection is full
	third := make(chan error, 1)
	go func() { third <- p.Do(context.Background(), s.addr, check) }()
	waitFor(t, "the growth dial begins", func() bool { return dials.Load() == 2 })
	if err := hs[1].finish(t); err != nil {
		t.Fatal(err)
	}
	fourth := make(chan error, 1)
	go func() { fourth <- p.Do(context.Background(), s.addr, check) }()
	select {
	case err := <-fourth:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hang):
		t.Fatalf("a call that fits on the open connection waited %v, for the growth dial", hang)
	}
	open()
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials; want 2", n)
	}
}

// TestExtraConnectionsCloseOnceUnneeded: once the load falls to what one
// connection carries, the extra connections go unused and IdleTimeout
// closes them; the one still in use stays, and nothing was dialed twice.
func TestExtraConnectionsCloseOnceUnneeded(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 2, IdleTimeout: 20 * time.Millisecond})
	hs := holdAll(t, p, s.addr, 5) // links 0, 0, 1, 1, 2
	if got := p.ConnsTo(s.addr); got != 3 {
		t.Fatalf("5 calls, 2 a connection: %d connections; want 3", got)
	}
	for _, h := range hs[1:] {
		if err := h.finish(t); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the extra connections close", func() bool { return p.Stats().Shrunk == 2 })
	if got, st := p.ConnsTo(s.addr), p.Stats(); got != 1 || st.Dials != 3 {
		t.Errorf("once the load fits one connection: %d connections, %d dials; want 1 and 3", got, st.Dials)
	}
	if err := hs[0].finish(t); err != nil {
		t.Errorf("the call on the first connection: %v", err)
	}
}

// TestAConnectionErrorDropsThatConnectionAlone: of an address's several
// connections, a connection error drops the one it happened on.
func TestAConnectionErrorDropsThatConnectionAlone(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, IsConnError: grpcpool.IsUnavailable})
	hs := holdAll(t, p, s.addr, 2)
	if err := p.Do(context.Background(), s.addr, func(context.Context, grpc.ClientConnInterface) error { return errBad }); err != errBad {
		t.Fatalf("Do: %v; want the call's error", err)
	}
	if got, st := p.ConnsTo(s.addr), p.Stats(); got != 2 || st.DropsConnError != 1 {
		t.Errorf("after a connection error on the third connection: %d connections, %d dropped; want 2 and 1", got, st.DropsConnError)
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestMaxConnsPerAddrBoundsTheGrowth: at MaxConnsPerAddr, a call that
// finds every stream taken runs over the limit on the least loaded
// connection (gRPC queues it there) rather than dial another.
func TestMaxConnsPerAddrBoundsTheGrowth(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, MaxConnsPerAddr: 2})
	hs := holdAll(t, p, s.addr, 3)
	conns, _ := connsOf(hs)
	if st := p.Stats(); st.Dials != 2 || conns != 2 {
		t.Errorf("3 calls, one stream a connection, 2 connections at most: %d dials, %d connections used; want 2 and 2", st.Dials, conns)
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestMaxConnsCountsEveryConnectionOfAnAddress: an address's extra
// connections take slots under MaxConns; another address's first call
// waits for one and gets it, by eviction, when a connection goes unused.
func TestMaxConnsCountsEveryConnectionOfAnAddress(t *testing.T) {
	a, b := startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, MaxConns: 2})
	hs := holdAll(t, p, a.addr, 2) // both slots
	done := make(chan error, 1)
	go func() { done <- p.Do(context.Background(), b.addr, check) }()
	waitFor(t, "b's call waits for a slot", func() bool { return p.Stats().SlotWaits == 1 })
	if err := hs[1].finish(t); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hang):
		t.Fatalf("b's call did not get the slot a's unused connection held within %v", hang)
	}
	if st := p.Stats(); st.PeakOpen != 2 || st.DropsEvicted != 1 {
		t.Errorf("peak %d open, %d evicted; want 2 and 1", st.PeakOpen, st.DropsEvicted)
	}
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWaitsForTheCallsOnEveryConnectionOfAnAddress: Close closes
// none of an address's connections under its calls.
func TestCloseWaitsForTheCallsOnEveryConnectionOfAnAddress(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1})
	hs := holdAll(t, p, s.addr, 3)
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Errorf("a call on one of the address's connections while Close ran: %v", err)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Open != 0 {
		t.Errorf("after Close: %d open", st.Open)
	}
}

// TestAStreamFreedDuringAGrowthDialServesACallWaitingForIt: a call that
// waits for a growth dial takes a stream freed meanwhile on the open
// connection, rather than wait for the dial; the dial goes on.
func TestAStreamFreedDuringAGrowthDialServesACallWaitingForIt(t *testing.T) {
	s := startServer(t)
	gate := make(chan struct{})
	var dials atomic.Int64
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 2, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if dials.Add(1) == 2 {
			<-gate // the growth dial waits for the test
		}
		return d.dial(ctx, addr)
	}})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)                // before Close, which waits for the dial
	hs := holdAll(t, p, s.addr, 2) // the first connection is full
	var ranOn atomic.Pointer[grpc.ClientConn]
	third := make(chan error, 1)
	go func() {
		third <- p.Do(context.Background(), s.addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
			ranOn.Store(cc.(*grpc.ClientConn))
			return check(ctx, cc)
		})
	}()
	waitFor(t, "the third call waits for the growth dial", func() bool { return dials.Load() == 2 && p.Stats().StreamWaits == 1 })
	if err := hs[1].finish(t); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-third:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hang):
		t.Fatalf("the call waiting for the growth dial did not take the stream freed on the open connection within %v", hang)
	}
	if ranOn.Load() != hs[0].cc.Load() {
		t.Error("the waiting call ran on another connection than the open one")
	}
	open()
	waitFor(t, "the growth dial's connection is ready", func() bool { return p.ConnsTo(s.addr) == 2 })
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials; want 2", n)
	}
}

// TestSetMembersDropsEveryConnectionOfADepartedMember: a member that
// departs loses all its connections at once; each closes when its call
// ends.
func TestSetMembersDropsEveryConnectionOfADepartedMember(t *testing.T) {
	a, b := startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1})
	hs := holdAll(t, p, a.addr, 2)
	p.SetMembers([]string{b.addr})
	if got, st := p.ConnsTo(a.addr), p.Stats(); got != 0 || st.DropsMembership != 2 {
		t.Errorf("after a departed: %d of its connections in the pool, %d dropped; want 0 and 2", got, st.DropsMembership)
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Errorf("a call on a departed member's connection: %v", err)
		}
	}
	if st := p.Stats(); st.Open != 0 {
		t.Errorf("once the calls ended: %d open; want 0", st.Open)
	}
}

// TestCallsToANonMemberShareOneConnectionUnderMaxStreamsPerConn: the rule
// for non-members holds: one connection, closed by the last call.
func TestCallsToANonMemberShareOneConnectionUnderMaxStreamsPerConn(t *testing.T) {
	a, b := startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1})
	p.SetMembers([]string{a.addr})
	hs := holdAll(t, p, b.addr, 3)
	if conns, _ := connsOf(hs); conns != 1 || p.Stats().Dials != 1 {
		t.Errorf("3 calls to a non-member at once: %d connections, %d dials; want 1 and 1", conns, p.Stats().Dials)
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
	if st := p.Stats(); st.Open != 0 {
		t.Errorf("after the last call: %d open; want 0", st.Open)
	}
}

// TestHealthChecksReachEveryConnectionOfAnAddress: each of an address's
// connections is checked, and dropped when its checks fail.
func TestHealthChecksReachEveryConnectionOfAnAddress(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, HealthCheckInterval: time.Millisecond})
	hs := holdAll(t, p, s.addr, 2)
	s.setServing(false)
	waitFor(t, "both connections are dropped", func() bool { return p.Stats().DropsHealth == 2 })
	s.setServing(true)
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
	if got := p.ConnsTo(s.addr); got != 0 {
		t.Errorf("%d connections in the pool; want 0", got)
	}
}

// TestStressSeveralConnectionsPerAddress: many goroutines call two
// addresses, two streams a connection, under MaxConns, while IdleTimeout
// closes the connections the load leaves unused and the second address
// leaves and rejoins the members. No call fails, no connection of the
// member ever carries more than MaxStreamsPerConn calls at once, and
// after Close every connection dialed was closed, once.
func TestStressSeveralConnectionsPerAddress(t *testing.T) {
	const perConn = 2
	goroutines, calls := 16, 100
	if testing.Short() {
		calls = 20
	}
	a, b := startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: perConn, IdleTimeout: 2 * time.Millisecond, MaxConns: 8})
	var load sync.Map // *grpc.ClientConn → *gauge
	var over atomic.Int64
	// Only a's calls are weighed: a stays a member, while b's calls, when
	// it is not one, share its one connection without a limit.
	weighed := func(ctx context.Context, cci grpc.ClientConnInterface) error {
		g, _ := load.LoadOrStore(cci, new(gauge))
		gg := g.(*gauge)
		gg.up()
		defer gg.now.Add(-1)
		if gg.now.Load() > perConn {
			over.Add(1)
		}
		return check(ctx, cci)
	}
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			for j := range calls {
				addr, call := a.addr, weighed
				if (i+j)%3 == 0 {
					addr, call = b.addr, check
				}
				if err := p.Do(context.Background(), addr, call); err != nil {
					t.Errorf("%s: %v", addr, err)
				}
				if i == 0 && j%25 == 0 {
					p.SetMembers([]string{a.addr, b.addr}[:1+j%2])
				}
			}
		})
	}
	wg.Wait()
	if n := over.Load(); n != 0 {
		t.Errorf("%d calls found their connection carrying more than %d calls", n, perConn)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	t.Logf("%d calls; %d dials, %d grown, %d shrunk, %d stream waits, %d evicted, peak %d open", st.Calls, st.Dials, st.Grown, st.Shrunk, st.StreamWaits, st.DropsEvicted, st.PeakOpen)
	if st.Open != 0 || st.Closed != st.Dials || st.PeakOpen > 8 {
		t.Errorf("after Close: %d open, %d closed of %d dialed, peak %d; want 0, all, at most MaxConns 8", st.Open, st.Closed, st.Dials, st.PeakOpen)
	}
}

// TestAFailedGrowthDialFallsBackToAnOpenConnection: when the dial of an
// extra connection fails, and while ErrorTTL remembers the failure, calls
// that find every stream taken run over the limit on the open connection,
// where gRPC queues them, rather than fail.
func TestAFailedGrowthDialFallsBackToAnOpenConnection(t *testing.T) {
	s := startServer(t)
	var dials atomic.Int64
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, ErrorTTL: patience, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if dials.Add(1) > 1 {
			return nil, errors.New("test: no second connection")
		}
		return d.dial(ctx, addr)
	}})
	hs := holdAll(t, p, s.addr, 1) // the one stream of the first connection
	for i := range 3 {
		if err := p.Do(context.Background(), s.addr, check); err != nil {
			t.Errorf("call %d, its growth dial failed: %v; want it run on the open connection", i+1, err)
		}
	}
	if st := p.Stats(); dials.Load() != 2 || st.ErrorHits != 2 || p.ConnsTo(s.addr) != 1 {
		t.Errorf("%d dials, %d remembered failures answered, %d connections; want 2, 2, 1", dials.Load(), st.ErrorHits, p.ConnsTo(s.addr))
	}
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
}

// TestALightLoadGoesToTheFirstConnections: once the load falls, the calls
// go to the connections it needs, the first ones, so that the others go
// unused together (and IdleTimeout closes them in one step): two calls,
// two streams a connection, share the first connection, though two
// others are open and idle.
func TestALightLoadGoesToTheFirstConnections(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 2})
	for _, h := range holdAll(t, p, s.addr, 5) { // three connections
		if err := h.finish(t); err != nil {
			t.Fatal(err)
		}
	}
	hs := holdAll(t, p, s.addr, 2)
	if conns, _ := connsOf(hs); conns != 1 || p.ConnsTo(s.addr) != 3 {
		t.Errorf("2 calls, 2 streams a connection, 3 connections open: the calls ran on %d connections; want 1", conns)
	}
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}
