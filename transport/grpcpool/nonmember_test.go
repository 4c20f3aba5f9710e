package grpcpool_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The tests of this file hold the package doc's rule for the connections
// to an address that is not a member: shared by the calls that overlap,
// dialed once, closed when the last of them ends, never draining, never
// holding a unit of MaxConns after that.

// TestANonMembersConnectionClosesWhenItsLastCallEnds: DrainDelay is for a
// member that left, not for an address that never was one. Each call to
// a non-member that overlaps no other closes its connection before its Do
// returns.
func TestANonMembersConnectionClosesWhenItsLastCallEnds(t *testing.T) {
	a, b := startServer(t), startServer(t)
	var socks sockets
	p := newPool(t, grpcpool.Config{DrainDelay: patience, DialOptions: socks.options()})
	p.SetMembers([]string{a.addr})
	for range 5 {
		if err := p.Do(context.Background(), b.addr, check); err != nil {
			t.Fatal(err)
		}
	}
	if st := p.Stats(); st.Open != 0 || st.Draining != 0 || socks.to(b.addr) != 0 {
		t.Errorf("after 5 calls to a non-member, each over: Open=%d Draining=%d, %d sockets to it; want 0, 0, 0", st.Open, st.Draining, socks.to(b.addr))
	}
}

// TestFinishedCallsToANonMemberHoldNoSlot: under MaxConns, the slots
// that finished calls to a non-member used are free for a member's first
// dial at once, whatever DrainDelay is.
func TestFinishedCallsToANonMemberHoldNoSlot(t *testing.T) {
	const maxConns = 4
	a, b := startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxConns: maxConns, DrainDelay: patience})
	p.SetMembers([]string{a.addr})
	for range maxConns {
		if err := p.Do(context.Background(), b.addr, check); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Do(ctx, a.addr, check) }()
	var err error
	waitFor(t, "the member's call returns or waits for a slot", func() bool {
		select {
		case err = <-done:
			return true
		default:
			return p.Stats().SlotWaits > 0
		}
	})
	if st := p.Stats(); st.SlotWaits > 0 {
		cancel()
		<-done
		t.Fatalf("the member's first dial waited for a slot (SlotWaits=%d, Open=%d, Draining=%d) after %d finished calls to a non-member; want it dialed at once", st.SlotWaits, st.Open, st.Draining, maxConns)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentCallsToANonMemberShareOneConnection: while one call to a
// non-member holds its connection, 200 more from 8 goroutines, each
// beginning and ending while it runs, use that same connection: one dial,
// one socket, and the connection closes when the held call, the last,
// ends.
func TestConcurrentCallsToANonMemberShareOneConnection(t *testing.T) {
	const goroutines, calls = 8, 25
	a, b := startServer(t), startServer(t)
	var socks sockets
	var dials atomic.Int64
	p := newPool(t, grpcpool.Config{Dial: func(_ context.Context, addr string) (*grpc.ClientConn, error) {
		dials.Add(1)
		return grpc.NewClient(addr, socks.options()...)
	}})
	p.SetMembers([]string{a.addr})
	h := newHeld()
	h.run(t, p, b.addr)
	held := h.cc.Load()
	var wg sync.WaitGroup
	var mu sync.Mutex
	others := 0
	for range goroutines {
		wg.Go(func() {
			for range calls {
				err := p.Do(context.Background(), b.addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
					if cc != held {
						mu.Lock()
						others++
						mu.Unlock()
					}
					return check(ctx, cc)
				})
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := h.finish(t); err != nil {
		t.Fatal(err)
	}
	if n := dials.Load(); n != 1 || others != 0 || socks.g.peak.Load() != 1 {
		t.Errorf("%d calls while one held its connection: %d dials, %d calls on another connection, at most %d sockets at once; want 1, 0, 1", goroutines*calls, n, others, socks.g.peak.Load())
	}
	if st := p.Stats(); st.Open != 0 || socks.to(b.addr) != 0 {
		t.Errorf("after the last call: Open=%d, %d sockets; want 0 and 0", st.Open, socks.to(b.addr))
	}
}

// TestADialInFlightWhenItsAddressLeavesIsClosed: a connection whose dial
// SetMembers overtakes is the connection of a non-member.
func TestADialInFlightWhenItsAddressLeavesIsClosed(t *testing.T) {
	// gated returns a Dial that waits for gate and says when it began.
	gated := func() (dial func(context.Context, string) (*grpc.ClientConn, error), entered chan struct{}, gate chan struct{}) {
		entered, gate = make(chan struct{}, 16), make(chan struct{})
		return func(_ context.Context, addr string) (*grpc.ClientConn, error) {
			entered <- struct{}{}
			<-gate
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}, entered, gate
	}

	t.Run("warm", func(t *testing.T) {
		a, b := startServer(t), startServer(t)
		dial, entered, gate := gated()
		p := newPool(t, grpcpool.Config{Dial: dial})
		p.SetMembers([]string{a.addr, b.addr})
		warmed := make(chan error, 1)
		go func() { warmed <- p.Warm(context.Background(), b.addr) }()
		<-entered
		p.SetMembers([]string{a.addr})
		close(gate)
		if err := <-warmed; err != nil {
			t.Fatalf("Warm: %v", err)
		}
		if st := p.Stats(); st.Open != 0 {
			t.Errorf("after Warm of an address that left while it dialed: Open=%d Ready=%d Closed=%d; want its connection closed", st.Open, st.Ready, st.Closed)
		}
	})

	t.Run("caller-left", func(t *testing.T) {
		a, b := startServer(t), startServer(t)
		dial, entered, gate := gated()
		p := newPool(t, grpcpool.Config{Dial: dial})
		p.SetMembers([]string{a.addr, b.addr})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Do(ctx, b.addr, check) }()
		<-entered
		cancel()
		if err := <-done; err != context.Canceled {
			t.Fatalf("Do: %v; want its ctx's error", err)
		}
		p.SetMembers([]string{a.addr})
		close(gate)
		waitFor(t, "the dial ends", func() bool {
			c := p.Stats().Cache
			return c.Creates+c.CreateErrors > 0
		})
		if st := p.Stats(); st.Open != 0 || st.Ready != 0 {
			t.Errorf("after a dial nobody waits for, to an address that left while it ran: Open=%d Ready=%d; want 0 and 0", st.Open, st.Ready)
		}
	})

	t.Run("caller-waits", func(t *testing.T) {
		a, b := startServer(t), startServer(t)
		dial, entered, gate := gated()
		p := newPool(t, grpcpool.Config{Dial: dial, DrainDelay: patience})
		p.SetMembers([]string{a.addr, b.addr})
		done := make(chan error, 1)
		go func() { done <- p.Do(context.Background(), b.addr, check) }()
		<-entered
		p.SetMembers([]string{a.addr})
		close(gate)
		if err := <-done; err != nil {
			t.Fatalf("Do: %v", err)
		}
		if st := p.Stats(); st.Open != 0 || st.Draining != 0 {
			t.Errorf("after the call that waited for the dial: Open=%d Draining=%d; want 0 and 0", st.Open, st.Draining)
		}
	})

	t.Run("warm-non-member", func(t *testing.T) {
		a, b := startServer(t), startServer(t)
		p := newPool(t, grpcpool.Config{})
		p.SetMembers([]string{a.addr})
		if err := p.Warm(context.Background(), b.addr); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Open != 0 {
			t.Errorf("after Warm of a non-member: Open=%d Ready=%d; want 0 (no call holds it)", st.Open, st.Ready)
		}
	})
}

// gatedDial is a Dial that counts its calls per address, says when one
// begins, and holds each until the test opens the gate.
type gatedDial struct {
	entered chan string
	gate    chan struct{}
	d       countingDial
}

func newGatedDial() *gatedDial {
	return &gatedDial{entered: make(chan string, 64), gate: make(chan struct{})}
}

func (g *gatedDial) dial(ctx context.Context, addr string) (*grpc.ClientConn, error) {
	g.entered <- addr
	<-g.gate
	return g.d.dial(ctx, addr)
}

// TestADialThatSetMembersOvertakesServesTheMemberCallsWaitingForIt: calls
// that asked for a member's connection wait for its one dial, whatever
// SetMembers does meanwhile. If the address has left the members when the
// dial ends, they run on it all the same, and the last of them closes it
// (the rule for non-members); if it is back, the connection stays.
func TestADialThatSetMembersOvertakesServesTheMemberCallsWaitingForIt(t *testing.T) {
	const callers = 4
	for _, tc := range []struct {
		name     string
		during   func(a, b string) [][]string // the SetMembers calls made while the dial runs
		stays    bool                         // whether the connection stays once the calls are over
		sentence string
	}{
		{"leaves", func(a, b string) [][]string { return [][]string{{a}} }, false, "b leaves the members"},
		{"leaves-and-returns", func(a, b string) [][]string { return [][]string{{a}, {a, b}} }, true, "b leaves the members and comes back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startServer(t), startServer(t)
			g := newGatedDial()
			p := newPool(t, grpcpool.Config{Dial: g.dial, DrainDelay: patience, ErrorTTL: patience})
			p.SetMembers([]string{a.addr, b.addr})
			errs := make(chan error, callers)
			for range callers {
				go func() { errs <- p.Do(context.Background(), b.addr, check) }()
			}
			<-g.entered
			waitFor(t, "every call waits for the dial", func() bool { return p.Stats().Cache.Waits == callers-1 })
			for _, set := range tc.during(a.addr, b.addr) {
				p.SetMembers(set)
			}
			close(g.gate)
			for range callers {
				if err := <-errs; err != nil {
					t.Errorf("Do: %v", err)
				}
			}
			st := p.Stats()
			if n := g.d.of(b.addr); n != 1 {
				t.Errorf("when %s during its dial: %d dials of b for %d calls that waited for one; want 1", tc.sentence, n, callers)
			}
			if want := int64(0); tc.stays {
				if st.Ready != 1 {
					t.Errorf("when %s during its dial: %d connections ready once the calls are over; want 1 (b is a member)", tc.sentence, st.Ready)
				}
			} else if st.Open != want || st.Draining != 0 {
				t.Errorf("when %s during its dial: Open=%d Draining=%d once the calls are over; want 0 and 0 (a non-member's)", tc.sentence, st.Open, st.Draining)
			}
		})
	}
}

// TestADepartedMembersConnectionClosesWithTheNonMemberCallOnIt: a call
// that began while its address was not a member holds a connection that
// becomes a member's, and then a departed member's. It leaves the pool at
// once, as every departed member's, and closes when that call ends, or
// drains first (DrainDelay): it never stays open for good.
func TestADepartedMembersConnectionClosesWithTheNonMemberCallOnIt(t *testing.T) {
	for _, drain := range []time.Duration{0, patience} {
		t.Run(fmt.Sprintf("DrainDelay=%v", drain), func(t *testing.T) {
			a, b := startServer(t), startServer(t)
			p := newPool(t, grpcpool.Config{DrainDelay: drain})
			p.SetMembers([]string{a.addr})
			h := newHeld()
			h.run(t, p, b.addr) // b is not a member
			p.SetMembers([]string{a.addr, b.addr})
			if err := p.Do(context.Background(), b.addr, check); err != nil { // a member's call on the same connection
				t.Fatal(err)
			}
			p.SetMembers([]string{a.addr}) // b departs
			if st := p.Stats(); st.Ready != 0 {
				t.Errorf("after b departed: %d connections in the pool; want 0", st.Ready)
			}
			if err := h.finish(t); err != nil {
				t.Fatal(err)
			}
			st := p.Stats()
			if drain == 0 && (st.Open != 0 || st.Draining != 0) {
				t.Errorf("once the call that began while b was not a member ended, after b departed: Open=%d Draining=%d; want 0 and 0", st.Open, st.Draining)
			}
			if drain > 0 && (st.Open != 1 || st.Draining != 1 || st.Ready != 0) {
				t.Errorf("once the call that began while b was not a member ended, after b departed: Open=%d Draining=%d Ready=%d; want 1, 1, 0 (it drains, and Close ends the drain)", st.Open, st.Draining, st.Ready)
			}
			if st.DropsMembership != 1 {
				t.Errorf("%d drops of a departed member; want 1", st.DropsMembership)
			}
		})
	}
}
