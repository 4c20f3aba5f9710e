package grpcpool_test

import (
	"context"
	"testing"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// TestAServersUnavailableAnswerKeepsItsConnection: a server shedding
// load answers Unavailable from its handler over a Ready connection. That
// is the server's answer, not a broken connection: by default the pool
// keeps the connection, rather than adding a dial to the load.
func TestAServersUnavailableAnswerKeepsItsConnection(t *testing.T) {
	const calls = 20
	s := startServer(t)
	s.shed.Store(true)
	var socks sockets
	p := newPool(t, grpcpool.Config{DialOptions: socks.options()})
	for range calls {
		if err := p.Do(context.Background(), s.addr, check); status.Code(err) != codes.Unavailable {
			t.Fatalf("Do on a shedding server: %v; want its Unavailable", err)
		}
	}
	if st := p.Stats(); st.Dials != 1 || st.DropsConnError != 0 || s.accepted.Load() != 1 || socks.g.peak.Load() != 1 {
		t.Errorf("%d calls shed by the server: %d dials, %d connections dropped, %d accepted by the server, %d sockets at most; want 1, 0, 1, 1", calls, st.Dials, st.DropsConnError, s.accepted.Load(), socks.g.peak.Load())
	}
}

// TestABrokenConnectionIsDropped: a call that fails with Unavailable on
// a connection gRPC has seen fail drops it, and the next call dials anew.
func TestABrokenConnectionIsDropped(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{})
	var cc *grpc.ClientConn
	if err := p.Do(context.Background(), s.addr, func(ctx context.Context, cci grpc.ClientConnInterface) error {
		cc = cci.(*grpc.ClientConn)
		return check(ctx, cci)
	}); err != nil {
		t.Fatal(err)
	}
	s.stop()
	waitFor(t, "gRPC sees the connection fail", func() bool { return cc.GetState() != connectivity.Ready })
	if err := p.Do(context.Background(), s.addr, check); status.Code(err) != codes.Unavailable {
		t.Fatalf("Do on a stopped server: %v; want Unavailable", err)
	}
	if st := p.Stats(); st.DropsConnError != 1 || st.ConnErrors != 1 {
		t.Fatalf("%d connections dropped, %d connection errors; want 1 and 1", st.DropsConnError, st.ConnErrors)
	}
	if err := p.Do(context.Background(), s.addr, check); err == nil {
		t.Fatal("Do on a stopped server succeeded")
	}
	if st := p.Stats(); st.Dials != 2 {
		t.Errorf("%d dials; want 2: the broken connection was replaced", st.Dials)
	}
}
