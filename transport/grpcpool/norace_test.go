//go:build !race

package grpcpool_test

import (
	"context"
	"testing"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
)

func noop(context.Context, grpc.ClientConnInterface) error { return nil }

// TestDoOnAReadyConnectionAllocatesNothing: Do's own cost on a ready
// connection is a lease and a counter, no allocation. (Not under -race,
// which allocates for its own bookkeeping.)
func TestDoOnAReadyConnectionAllocatesNothing(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{})
	ctx := context.Background()
	if err := p.Do(ctx, s.addr, check); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = p.Do(ctx, s.addr, noop) }); n != 0 {
		t.Errorf("Do on a ready connection: %v allocations; want 0", n)
	}
}

// TestDoUnderMaxStreamsPerConnAllocatesNothing: choosing among an
// address's connections costs no allocation either, on a connection with
// a free stream.
func TestDoUnderMaxStreamsPerConnAllocatesNothing(t *testing.T) {
	s := startServer(t)
	p := newPool(t, grpcpool.Config{MaxStreamsPerConn: 1})
	h := newHeld()
	h.run(t, p, s.addr) // the first connection is full: the calls below use the second
	ctx := context.Background()
	if err := p.Do(ctx, s.addr, check); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = p.Do(ctx, s.addr, noop) }); n != 0 {
		t.Errorf("Do on one of several connections: %v allocations; want 0", n)
	}
	if err := h.finish(t); err != nil {
		t.Fatal(err)
	}
}
