package grpcpool_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestADialThatCallsGoexitLeaksNothing: a Dial that calls runtime.Goexit
// (t.FailNow in a test's Dial does) fails its dial, with an error naming
// the pool and the address, and gives its slot back: under MaxConns 1 the
// next address is dialed, and Close returns.
func TestADialThatCallsGoexitLeaksNothing(t *testing.T) {
	s := startServer(t)
	dead := deadAddr(t)
	p, err := grpcpool.New(grpcpool.Config{
		MaxConns:    1,
		DialTimeout: patience,
		Dial: func(_ context.Context, addr string) (*grpc.ClientConn, error) {
			if addr == dead {
				runtime.Goexit()
			}
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Do(context.Background(), dead, check)
	if err == nil || !strings.HasPrefix(err.Error(), "grpcpool: ") || !strings.Contains(err.Error(), strconv.Quote(dead)) || !errors.Is(err, epcache.ErrGoexit) {
		t.Errorf("Do with a Dial that calls Goexit: %v; want a grpcpool error naming %q that matches epcache.ErrGoexit", err, dead)
	}
	if st := p.Stats(); st.Open != 0 || st.DialErrors != 1 || st.Closed != 1 {
		t.Errorf("after the Goexit: Open=%d DialErrors=%d Closed=%d; want 0, 1, 1", st.Open, st.DialErrors, st.Closed)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Do(ctx, s.addr, check) }()
	var next error
	waitFor(t, "the next address's Do returns or waits for a slot", func() bool {
		select {
		case next = <-done:
			return true
		default:
			return p.Stats().SlotWaits > 0
		}
	})
	if st := p.Stats(); st.SlotWaits > 0 {
		t.Fatalf("the next address's dial waits for the slot the Goexit kept: SlotWaits=%d Open=%d", st.SlotWaits, st.Open)
	}
	if next != nil {
		t.Errorf("the next address's Do: %v", next)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hang):
		t.Fatalf("Close did not return within %v (Stats %+v)", hang, p.Stats())
	}
}

// TestEveryErrorNamesThePoolAndTheAddress: whatever went wrong, Do's
// and Warm's errors (other than the call's own, and ctx.Err() itself)
// start with "grpcpool: ", name the address, and still match what they
// wrap.
func TestEveryErrorNamesThePoolAndTheAddress(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  grpcpool.Config
		// do makes the pool fail, and returns the error and the address
		// it must name; s is a server the case may use.
		do   func(t *testing.T, p *grpcpool.Pool, s *server) (string, error)
		is   error // what the error must still match, if anything
		want string
	}{
		{
			name: "panicking-retry",
			cfg:  grpcpool.Config{DialRetry: func(int, error) (time.Duration, bool) { panic("retry exploded") }},
			do: func(t *testing.T, p *grpcpool.Pool, _ *server) (string, error) {
				dead := deadAddr(t)
				return dead, p.Do(context.Background(), dead, check)
			},
			want: "retry exploded",
		},
		{
			name: "goexit-in-retry",
			cfg: grpcpool.Config{DialRetry: func(int, error) (time.Duration, bool) {
				runtime.Goexit()
				return 0, false
			}},
			do: func(t *testing.T, p *grpcpool.Pool, _ *server) (string, error) {
				dead := deadAddr(t)
				return dead, p.Do(context.Background(), dead, check)
			},
			is:   epcache.ErrGoexit,
			want: "Goexit",
		},
		{
			name: "closed",
			do: func(t *testing.T, p *grpcpool.Pool, s *server) (string, error) {
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
				return s.addr, p.Do(context.Background(), s.addr, check)
			},
			is:   grpcpool.ErrClosed,
			want: "closed",
		},
		{
			name: "warm-closed",
			do: func(t *testing.T, p *grpcpool.Pool, s *server) (string, error) {
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
				return s.addr, p.Warm(context.Background(), s.addr)
			},
			is:   grpcpool.ErrClosed,
			want: "closed",
		},
		{
			name: "nil-call",
			do: func(t *testing.T, p *grpcpool.Pool, s *server) (string, error) {
				return s.addr, p.Do(context.Background(), s.addr, nil)
			},
			want: "nil call",
		},
		{
			name: "no-room",
			// The room under MaxConns is a held call's: the second call
			// waits for room until its context is cancelled.
			cfg: grpcpool.Config{MaxConns: 1},
			do: func(t *testing.T, p *grpcpool.Pool, s *server) (string, error) {
				h := newHeld()
				h.run(t, p, s.addr)
				defer func() { _ = h.finish(t) }()
				other := startServer(t)
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- p.Do(ctx, other.addr, check) }()
				waitFor(t, "the call waits for room", func() bool { return p.Stats().Cache.RoomWaits > 0 })
				cancel()
				return other.addr, <-done
			},
			is:   context.Canceled,
			want: "MaxConns",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t)
			p := newPool(t, tc.cfg)
			addr, err := tc.do(t, p, s)
			if err == nil {
				t.Fatal("no error")
			}
			t.Log(err)
			if msg := err.Error(); !strings.HasPrefix(msg, "grpcpool: ") || !strings.Contains(msg, strconv.Quote(addr)) || !strings.Contains(msg, tc.want) {
				t.Errorf("%q; want it to start with \"grpcpool: \", name %q and say %q", msg, addr, tc.want)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("%v does not match %v", err, tc.is)
			}
			if tc.name == "panicking-retry" {
				if pe := (*epcache.PanicError)(nil); !errors.As(err, &pe) {
					t.Errorf("a panic in DialRetry: %T, not a *epcache.PanicError", err)
				}
			}
		})
	}
}
