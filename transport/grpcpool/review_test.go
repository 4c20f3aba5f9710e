package grpcpool_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
)

// Defects an outside review reproduced: each test failed on the code
// before its fix.

// TestReviewAGrowthConnectionPublishedAfterTidyIsOrphaned: a growth dial
// whose caller left (its ctx) is still in flight when the address leaves
// and comes back (the doc: "A dial whose address leaves and comes back
// before it ends makes a member's connection, which stays"). SetMembers's
// tidy deleted the address's per-link counts meanwhile, so the connection
// the dial publishes is at a link the new counts do not know: ConnsTo
// says 0, and the next call dials another connection although a ready
// connection of the address has every stream free ("A call that fits on
// an open connection never waits for those dials").
func TestReviewAGrowthConnectionPublishedAfterTidyIsOrphaned(t *testing.T) {
	s := startServer(t)
	var dials atomic.Int64
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if dials.Add(1) == 2 {
			<-gate // the growth dial (link 1)
		}
		return d.dial(ctx, addr)
	}})
	t.Cleanup(open)
	p.SetMembers([]string{s.addr})
	hs := holdAll(t, p, s.addr, 1) // link 0, full
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Do(ctx, s.addr, check) }()
	waitFor(t, "the growth dial begins", func() bool { return dials.Load() == 2 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the growth call that left: %v", err)
	}
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
	p.SetMembers(nil)              // link 0 dropped and closed; the counts tidied away
	p.SetMembers([]string{s.addr}) // back before the growth dial ends
	open()
	waitFor(t, "the growth dial's connection is published", func() bool { return p.Stats().Ready == 1 })
	t.Logf("Ready=%d ConnsTo=%d", p.Stats().Ready, p.ConnsTo(s.addr))
	before := dials.Load()
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if n := p.ConnsTo(s.addr); int64(n) != st.Ready || dials.Load() != before {
		t.Errorf("with the address's growth connection ready (and idle): a call dialed %d more, ConnsTo=%d, Ready=%d; want 0 dials and ConnsTo == Ready", dials.Load()-before, n, st.Ready)
	}
}

// TestReviewChurnWithoutSetMembersRetainsMemory: a pool that never calls
// SetMembers (every address a member) and calls a stream of new addresses
// keeps the per-address link counts of each forever under
// MaxStreamsPerConn, though no connection or call of them is left; without
// MaxStreamsPerConn it keeps nothing.
func TestReviewChurnWithoutSetMembersRetainsMemory(t *testing.T) {
	const n = 20000
	fail := func(context.Context, string) (*grpc.ClientConn, error) { return nil, errors.New("test: down") }
	retained := func(cfg grpcpool.Config) float64 {
		p := newPool(t, cfg)
		do := func(i int) {
			addr := fmt.Sprintf("10.%d.%d.%d:9000", i>>16&255, i>>8&255, i&255)
			_ = p.Do(context.Background(), addr, check)
		}
		for i := range 1000 {
			do(i)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := 1000; i < 1000+n; i++ {
			do(i)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(p)
		return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	}
	plain := retained(grpcpool.Config{Dial: fail})
	streams := retained(grpcpool.Config{Dial: fail, MaxStreamsPerConn: 100})
	t.Logf("heap retained per address called once (no SetMembers): %.0f bytes without MaxStreamsPerConn, %.0f with", plain, streams)
	if streams > 64 {
		t.Errorf("with MaxStreamsPerConn the pool keeps %.0f bytes per address no call or connection uses any more (%d addresses: %.1f MB); without it %.0f", streams, n, streams*n/1e6, plain)
	}
}

// TestReviewSetMembersForgetsNoGrowthFailureOfAReturningMember: Config.ErrorTTL:
// "SetMembers forgets the failure of an address it adds to the members, so
// that a member that comes back is dialed at once". A growth connection's
// failed dial is remembered under the link's own key; once the address
// has left (its link counts tidied away) and comes back, SetMembers forgets
// only the first connection's key: the returning member's growth is
// answered with the old failure, and its calls queue over the limit on one
// connection instead of dialing.
func TestReviewSetMembersForgetsNoGrowthFailureOfAReturningMember(t *testing.T) {
	s := startServer(t)
	var failing atomic.Bool
	var dials atomic.Int64
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, ErrorTTL: patience, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		dials.Add(1)
		if failing.Load() {
			return nil, errors.New("test: refused for now")
		}
		return d.dial(ctx, addr)
	}})
	p.SetMembers([]string{s.addr})
	hs := holdAll(t, p, s.addr, 1) // link 0
	failing.Store(true)
	if err := p.Do(context.Background(), s.addr, check); err != nil { // link 1's dial fails: over the limit on link 0
		t.Fatal(err)
	}
	failing.Store(false)
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
	p.SetMembers(nil)              // the member leaves...
	p.SetMembers([]string{s.addr}) // ...and comes back: its failures forgotten
	hs = holdAll(t, p, s.addr, 1)  // link 0 again
	before := dials.Load()
	h2 := holdAll(t, p, s.addr, 1) // needs link 1: must dial it at once
	st := p.Stats()
	if n := p.ConnsTo(s.addr); n != 2 || dials.Load() != before+1 {
		t.Errorf("a member that came back, two calls at once, one stream a connection: %d connections, %d dials for the second call (ErrorHits %d, Forgotten %d); want 2 and 1: SetMembers forgot only the first connection's failure", n, dials.Load()-before, st.ErrorHits, st.Forgotten)
	}
	for _, h := range append(hs, h2...) {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestReviewForgetMissesAGrowthFailureAfterTidy: Forget "drops addr's
// remembered dial failure (ErrorTTL), so that the next Do dials at once;
// it reports whether there was one still in force". A departed
// address's growth failure survives the tidy of its link counts: Forget
// says false and the failure stays.
func TestReviewForgetMissesAGrowthFailureAfterTidy(t *testing.T) {
	s := startServer(t)
	var failing atomic.Bool
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, ErrorTTL: patience, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if failing.Load() {
			return nil, errors.New("test: refused for now")
		}
		return d.dial(ctx, addr)
	}})
	p.SetMembers([]string{s.addr})
	hs := holdAll(t, p, s.addr, 1)
	failing.Store(true)
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	failing.Store(false)
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
	p.SetMembers(nil)
	if p.Forget(s.addr) != true {
		t.Errorf("Forget(%s) after the address left: false, though its second connection's failure is still remembered (ErrorTTL an hour)", s.addr)
	}
}
