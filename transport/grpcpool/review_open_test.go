//go:build grpcpool_open

package grpcpool_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
)

// Defects an outside review reproduced that are not fixed yet: each test
// fails on the code as it is. Run them with -tags grpcpool_open.

// TestReviewCallsOnADroppedConnectionCountAgainstItsReplacement: two
// streams a connection. A call still runs on link 0 when a connection
// error drops it; link 0 is redialed for the next call, which is the only
// call on the new connection. A third call fits on that new connection
// (one stream of two taken), but the old connection's call is counted
// against it, and the third call waits for a growth dial ("A call that
// fits on an open connection never waits for those dials").
func TestReviewCallsOnADroppedConnectionCountAgainstItsReplacement(t *testing.T) {
	s := startServer(t)
	var dials atomic.Int64
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	var d countingDial
	p := newPool(t, grpcpool.Config{
		MaxStreamsPerConn: 2,
		IsConnError:       func(err error) bool { return errors.Is(err, errBad) },
		Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
			if dials.Add(1) == 3 {
				<-gate // a growth dial nobody should need
			}
			return d.dial(ctx, addr)
		},
	})
	t.Cleanup(open)
	old := holdAll(t, p, s.addr, 1) // on link 0's first connection, for long
	if err := p.Do(context.Background(), s.addr, func(context.Context, grpc.ClientConnInterface) error { return errBad }); err != errBad {
		t.Fatal(err)
	}
	y := holdAll(t, p, s.addr, 1) // link 0 redialed: the new connection's one call
	if y[0].cc.Load() == old[0].cc.Load() {
		t.Fatal("the call after the connection error ran on the dropped connection")
	}
	z := make(chan error, 1)
	var zOn atomic.Pointer[grpc.ClientConn]
	go func() {
		z <- p.Do(context.Background(), s.addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
			zOn.Store(cc.(*grpc.ClientConn))
			return check(ctx, cc)
		})
	}()
	select {
	case err := <-z:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("a call that fits on the open connection (1 call of 2 on it) waited 2s for a growth dial (dials %d, ConnsTo %d)", dials.Load(), p.ConnsTo(s.addr))
	}
	open()
	<-z
	for _, h := range append(old, y...) {
		if err := h.finish(t); err != nil {
			t.Error(err)
		}
	}
}

// TestReviewFullPoolOneAddressEvictsItsOwnConnection: MaxConns 1, one
// address, one stream a connection, several goroutines calling it in a
// loop: the one connection serves every call in turn. Evicting it for a
// growth dial of its own address never helps anybody (the dial makes the
// same connection again), and the package doc says "a waiting call takes a
// stream freed meanwhile, under a full MaxConns too (the freed connection
// is not evicted for a dial nobody needs any more)". Yet the pool evicts
// and redials it.
func TestReviewFullPoolOneAddressEvictsItsOwnConnection(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0)))) // the race needs parallelism
	s := startServer(t)
	var d countingDial
	p := newPool(t, grpcpool.Config{Dial: d.dial, MaxStreamsPerConn: 1, MaxConns: 1})
	if err := p.Do(context.Background(), s.addr, check); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls, bad atomic.Int64
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := p.Do(context.Background(), s.addr, check); err != nil {
					bad.Add(1)
				}
				calls.Add(1)
			}
		})
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	st := p.Stats()
	if n := d.of(s.addr); n != 1 || bad.Load() != 0 {
		t.Errorf("%d calls (%d failed) on one address under MaxConns 1: %d dials, %d evictions, grown %d; want 1 dial", calls.Load(), bad.Load(), n, st.DropsEvicted, st.Grown)
	}
}

// TestReviewAWaiterIgnoresALinkThatBecameReadyWithRoom: one stream a
// connection; link 0 is held. W1 and W2 wait for growth dials of links 1
// and 2. W1 leaves on its ctx; link 1's dial ends: a ready connection with
// its stream free. W2 still waits for link 2's dial (which hangs), though a
// new call runs on link 1 at once ("a waiting call takes a stream freed
// meanwhile").
func TestReviewAWaiterIgnoresALinkThatBecameReadyWithRoom(t *testing.T) {
	s := startServer(t)
	var dials atomic.Int64
	gate1, gate2 := make(chan struct{}), make(chan struct{})
	var once1, once2 sync.Once
	open1 := func() { once1.Do(func() { close(gate1) }) }
	open2 := func() { once2.Do(func() { close(gate2) }) }
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1, Dial: func(ctx context.Context, addr string) (*grpc.ClientConn, error) {
		switch dials.Add(1) {
		case 2:
			<-gate1
		case 3:
			<-gate2
		}
		return d.dial(ctx, addr)
	}})
	t.Cleanup(open1)
	t.Cleanup(open2)
	hs := holdAll(t, p, s.addr, 1)
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	e1 := make(chan error, 1)
	go func() { e1 <- p.Do(ctx1, s.addr, check) }()
	waitFor(t, "link 1's dial begins", func() bool { return dials.Load() == 2 })
	e2 := make(chan error, 1)
	go func() { e2 <- p.Do(context.Background(), s.addr, check) }()
	waitFor(t, "link 2's dial begins", func() bool { return dials.Load() == 3 })
	cancel1()
	<-e1
	open1()
	waitFor(t, "link 1 ready", func() bool { return p.ConnsTo(s.addr) == 2 })
	select {
	case err := <-e2:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("W2 still waits for link 2's dial 2s after link 1 became ready with its stream free (ConnsTo=%d)", p.ConnsTo(s.addr))
	}
	open2()
	if err := hs[0].finish(t); err != nil {
		t.Fatal(err)
	}
}
