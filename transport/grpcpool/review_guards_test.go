package grpcpool_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Review guards: promises attacked that held.

// TestReviewStressFullPoolCouplingAndClose: under a full pool (MaxConns
// small), MaxStreamsPerConn 1..2, many goroutines whose calls free
// streams while others wait for growth, random caller deadlines, idle
// shrinking, connection errors, SetMembers churn; then Close while calls
// keep coming. Every Do returns, Close returns, nothing is closed under a
// call, nothing is left open, Grown == Shrunk after Close.
func TestReviewStressFullPoolCouplingAndClose(t *testing.T) {
	for _, streams := range []int{1, 2} {
		t.Run(fmt.Sprintf("streams=%d", streams), func(t *testing.T) {
			reviewStressFull(t, streams)
		})
	}
}

func reviewStressFull(t *testing.T, streams int) {
	var srvs []*server
	var addrs []string
	for range 3 {
		s := startServer(t)
		srvs = append(srvs, s)
		addrs = append(addrs, s.addr)
	}
	base := openFDs(t)
	var socks sockets
	const maxConns = 4
	p, err := grpcpool.New(grpcpool.Config{
		DialOptions:         socks.options(),
		DialTimeout:         patience,
		HealthCheckTimeout:  patience,
		MaxStreamsPerConn:   streams,
		MaxConnsPerAddr:     3,
		MaxConns:            maxConns,
		IdleTimeout:         2 * time.Millisecond,
		HealthCheckInterval: 3 * time.Millisecond,
		IsConnError:         func(err error) bool { return errors.Is(err, errInjected) },
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	var firstBad atomic.Value
	var calls atomic.Int64
	for g := range 24 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 77))
			for {
				select {
				case <-stop:
					return
				default:
				}
				addr := addrs[r.IntN(len(addrs))]
				var ctx context.Context
				var cancel context.CancelFunc
				timed := r.IntN(4) == 0
				if timed {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(r.IntN(3000))*time.Microsecond)
				} else {
					ctx, cancel = context.WithCancel(context.Background())
				}
				inject := r.IntN(30) == 0
				hold := time.Duration(r.IntN(1500)) * time.Microsecond
				err := p.Do(ctx, addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
					if err := check(ctx, cc); err != nil {
						return err
					}
					time.Sleep(hold)
					if inject {
						return errInjected
					}
					return check(ctx, cc)
				})
				ended := ctx.Err() != nil
				cancel()
				calls.Add(1)
				switch {
				case err == nil, errors.Is(err, errInjected), errors.Is(err, grpcpool.ErrClosed):
				case timed && status.Code(err) == codes.DeadlineExceeded: // the server's deadline may end first
				case ended && (errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.Canceled)):
				default:
					if bad.Add(1) == 1 {
						firstBad.Store(err.Error())
					}
				}
				if r.IntN(40) == 0 {
					time.Sleep(4 * time.Millisecond)
				}
			}
		})
	}
	wg.Go(func() {
		r := rand.New(rand.NewPCG(9, 9))
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			p.SetMembers(addrs[:1+r.IntN(len(addrs))])
		}
	})
	time.Sleep(3 * time.Second)
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }() // calls still coming
	time.Sleep(50 * time.Millisecond)
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("calls did not return within 30s of Close:\n%s", buf[:n])
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("Close did not return within 30s:\n%s", buf[:n])
	}
	st := p.Stats()
	t.Logf("calls %d dials %d grown %d shrunk %d streamwaits %d slotwaits %d evicted %d idle %d connerr %d peak %d sockets %d",
		calls.Load(), st.Dials, st.Grown, st.Shrunk, st.StreamWaits, st.SlotWaits, st.DropsEvicted, st.DropsIdle, st.DropsConnError, st.PeakOpen, socks.g.peak.Load())
	if n := bad.Load(); n > 0 {
		t.Errorf("%d calls failed; first: %v", n, firstBad.Load())
	}
	if st.Open != 0 || socks.g.now.Load() != 0 || grpcpool.Guests(p) != 0 || st.Draining != 0 {
		t.Errorf("after Close: Open %d sockets %d guests %d draining %d", st.Open, socks.g.now.Load(), grpcpool.Guests(p), st.Draining)
	}
	if st.Grown != st.Shrunk {
		t.Errorf("after Close: Grown %d, Shrunk %d; want equal (every extra connection closed)", st.Grown, st.Shrunk)
	}
	if st.Dials != st.Closed {
		t.Errorf("after Close: Dials %d Closed %d", st.Dials, st.Closed)
	}
	if st.PeakOpen > maxConns || socks.g.peak.Load() > maxConns {
		t.Errorf("peak open %d, sockets %d; want ≤ %d", st.PeakOpen, socks.g.peak.Load(), maxConns)
	}
	for _, s := range srvs {
		s.stop()
	}
	checkFDs(t, base)
}

var _ = strings.Contains

// TestReviewDialAtMostOnceAtATimeAfterATimeoutAndForget: Config.Dial "is
// called at most once at a time per connection". A Dial that ignores ctx
// outlives DialTimeout; Forget and SetMembers (which forget the failure)
// and later calls must not start a second Dial of that connection while it
// runs.
func TestReviewDialAtMostOnceAtATimeAfterATimeoutAndForget(t *testing.T) {
	for _, streams := range []int{0, 1} {
		t.Run(fmt.Sprintf("streams=%d", streams), func(t *testing.T) {
			s := startServer(t)
			var mu sync.Mutex
			inFlight, most := map[string]int{}, 0
			gate := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(gate) }) }
			var d countingDial
			var n atomic.Int64
			p := newPool(t, grpcpool.Config{MaxStreamsPerConn: streams, DialTimeout: 30 * time.Millisecond, ErrorTTL: patience, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
				mu.Lock()
				inFlight[addr]++
				most = max(most, inFlight[addr])
				mu.Unlock()
				defer func() { mu.Lock(); inFlight[addr]--; mu.Unlock() }()
				if n.Add(1) == 1 {
					<-gate // ignores ctx
				}
				return d.dial(ctx, addr)
			}})
			t.Cleanup(open)
			p.SetMembers([]string{s.addr})
			if err := p.Do(context.Background(), s.addr, check); err == nil {
				t.Fatal("the first call succeeded; want the DialTimeout")
			}
			p.Forget(s.addr)
			p.SetMembers(nil)
			p.SetMembers([]string{s.addr})
			// One call at a time: only the first connection is needed.
			for range 8 {
				_ = p.Do(context.Background(), s.addr, check)
				p.Forget(s.addr)
			}
			open()
			mu.Lock()
			defer mu.Unlock()
			if most != 1 {
				t.Errorf("Config.Dial of one connection ran %d times at once", most)
			}
		})
	}
}

// TestReviewBurstOnAFullFirstConnectionDialsCeil: the first connection
// is ready and full (3 streams); 7 more calls at once: ⌈7 ÷ 3⌉ = 3 growth
// dials, at once, each once, and no more.
func TestReviewBurstOnAFullFirstConnectionDialsCeil(t *testing.T) {
	const per, more = 3, 7
	s := startServer(t)
	var n atomic.Int64
	entered := make(chan struct{}, 64)
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: per, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		if n.Add(1) > 1 {
			entered <- struct{}{}
			<-gate
		}
		return d.dial(ctx, addr)
	}})
	t.Cleanup(open)
	first := holdAll(t, p, s.addr, per)
	hs := make([]*held, more)
	for i := range hs {
		hs[i] = newHeld()
		go func() {
			defer close(hs[i].done)
			hs[i].result = p.Do(context.Background(), s.addr, hs[i].call)
		}()
	}
	for range 3 {
		<-entered
	}
	time.Sleep(100 * time.Millisecond) // a 4th dial would begin now
	open()
	for _, h := range hs {
		select {
		case <-h.started:
		case <-h.done:
			t.Fatalf("a call returned early: %v", h.result)
		}
	}
	conns, most := connsOf(append(first, hs...))
	if n.Load() != 4 || conns != 4 || most > per || p.Stats().Grown != 3 {
		t.Errorf("dials %d, conns %d, most %d, grown %d; want 4, 4, ≤%d, 3", n.Load(), conns, most, p.Stats().Grown, per)
	}
	for _, h := range append(first, hs...) {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestReviewGoexitAndPanicInACallUnderAFullPoolWithWaiters: MaxConns 1,
// one stream a connection: a call that panics or calls runtime.Goexit
// while another waits for growth frees its stream; the waiter takes it,
// and nothing is dialed twice.
func TestReviewGoexitAndPanicInACallUnderAFullPoolWithWaiters(t *testing.T) {
	for _, how := range []string{"panic", "goexit"} {
		t.Run(how, func(t *testing.T) {
			s := startServer(t)
			var d countingDial
			p := newPool(t, grpcpool.Config{Dial: d.dial, MaxStreamsPerConn: 1, MaxConns: 1})
			started := make(chan struct{})
			release := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer func() { _ = recover() }()
				_ = p.Do(context.Background(), s.addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
					close(started)
					<-release
					if how == "panic" {
						panic("test: boom")
					}
					runtime.Goexit()
					return nil
				})
			}()
			<-started
			w := make(chan error, 1)
			go func() { w <- p.Do(context.Background(), s.addr, check) }()
			waitFor(t, "the waiter waits for a slot", func() bool { return p.Stats().SlotWaits > 0 })
			close(release)
			<-done
			select {
			case err := <-w:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(hang):
				t.Fatal("the waiter never ran")
			}
			if n := d.of(s.addr); n != 1 {
				t.Errorf("%d dials; want 1", n)
			}
		})
	}
}

// TestReviewChurnOfLiveAddressesRetainsNothing: addresses with real
// connections (and growth) come and go through SetMembers: once gone,
// nothing of theirs is left open, and the heap does not grow per address.
func TestReviewChurnOfLiveAddressesRetainsNothing(t *testing.T) {
	s := startServer(t)
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, Dial: func(ctx context.Context, _ string) (*grpc.ClientConn, error) {
		return d.dial(ctx, s.addr)
	}})
	do := func(i int) {
		addr := fmt.Sprintf("fake-%d:1", i)
		p.SetMembers([]string{addr})
		hs := holdAll(t, p, addr, 2)
		for _, h := range hs {
			_ = h.finish(t)
		}
	}
	for i := range 200 {
		do(i)
	}
	p.SetMembers(nil)
	var before, after runtime.MemStats
	waitFor(t, "all closed", func() bool { return p.Stats().Open == 0 })
	g0 := runtime.NumGoroutine() // the warm-up's lazily started goroutines included
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 500
	for i := 200; i < 200+n; i++ {
		do(i)
	}
	p.SetMembers(nil)
	waitFor(t, "all closed", func() bool { return p.Stats().Open == 0 })
	// The closed connections' goroutines (and the buffers they hold) gone
	// before the heap is read, however slowly they exit.
	waitFor(t, "the closed connections' goroutines exit", func() bool { return runtime.NumGoroutine() <= g0 })
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	t.Logf("retained per address: %.0f bytes", per)
	if per > 256 {
		t.Errorf("%.0f bytes retained per departed address", per)
	}
	if st := p.Stats(); st.Grown != st.Shrunk {
		t.Errorf("Grown %d Shrunk %d", st.Grown, st.Shrunk)
	}
}

// TestReviewDoAndWarmAfterCloseUnderStreams: "Do and Warm return an error
// matching ErrClosed from its first step", under MaxStreamsPerConn too,
// with links grown before.
func TestReviewDoAndWarmAfterCloseUnderStreams(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, MaxConns: 3})
	hs := holdAll(t, p, s.addr, 3)
	for _, h := range hs {
		if err := h.finish(t); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- p.Do(context.Background(), s.addr, check) }()
	go func() { done <- p.Warm(context.Background(), s.addr) }()
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, grpcpool.ErrClosed) {
				t.Errorf("after Close: %v; want ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Do or Warm after Close hangs")
		}
	}
}
