package grpcpool_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStressMembersAndNonMembersUnderMaxConns: many goroutines call
// members and non-members at random under MaxConns, some leaving their
// calls at once, while the members change, health checks run and departed
// members drain. No call fails that did not leave; the sockets never
// exceed MaxConns; once the calls are over, no non-member keeps a
// connection and no call is still counted; after Close, nothing is left:
// sockets, descriptors, goroutines (TestMain).
func TestStressMembersAndNonMembersUnderMaxConns(t *testing.T) {
	const servers, maxConns = 8, 5
	goroutines, calls := max(16, 8*runtime.GOMAXPROCS(0)), 150
	if testing.Short() {
		calls = 30
	}
	base := openFDs(t)
	var addrs []string
	var srvs []*server
	for range servers {
		s := startServer(t)
		srvs = append(srvs, s)
		addrs = append(addrs, s.addr)
	}
	// The member sets SetMembers cycles through: each leaves some
	// addresses out, and the last is the one the test ends with.
	sets := [][]string{addrs[0:4], addrs[2:6], append([]string{addrs[7]}, addrs[0:2]...), addrs[3:5]}
	var socks sockets
	p := newPool(t, grpcpool.Config{
		MaxConns:            maxConns,
		DialOptions:         socks.options(),
		DrainDelay:          time.Millisecond,
		HealthCheckInterval: 5 * time.Millisecond,
	})
	p.SetMembers(sets[0])

	var done, failed, left atomic.Int64
	var churn sync.Mutex // one SetMembers at a time, in order
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 39))
			for range calls {
				addr := addrs[rng.IntN(servers)]
				ctx, cancel := context.WithCancel(context.Background())
				leaves := rng.IntN(8) == 0
				if leaves {
					go cancel() // leaves at some point of its call, or before it
				}
				var err error
				if rng.IntN(16) == 0 {
					err = p.Warm(ctx, addr)
				} else {
					err = p.Do(ctx, addr, check)
				}
				cancel()
				switch {
				case err == nil:
				case leaves && (errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled):
					left.Add(1)
				default:
					failed.Add(1)
					t.Errorf("%s: %v", addr, err)
				}
				if n := done.Add(1); n%40 == 0 {
					churn.Lock()
					p.SetMembers(sets[next.Add(1)%int64(len(sets))])
					churn.Unlock()
				}
			}
		})
	}
	wg.Wait()
	final := sets[len(sets)-1]
	p.SetMembers(final)
	isMember := map[string]bool{}
	for _, a := range final {
		isMember[a] = true
	}
	// A call to each non-member: its connection, if a dial left one as
	// SetMembers ran (the package doc's Limits), is its and closes with it.
	for _, a := range addrs {
		if !isMember[a] {
			if err := p.Do(context.Background(), a, check); err != nil {
				t.Errorf("%s: %v", a, err)
			}
		}
	}
	for _, a := range addrs {
		if !isMember[a] {
			waitFor(t, "no connection to a non-member", func() bool { return socks.to(a) == 0 })
		}
	}
	if n := grpcpool.Guests(p); n != 0 {
		t.Errorf("%d addresses still count calls after the last", n)
	}
	st := p.Stats()
	t.Logf("%d calls (%d left at once, %d failed); %d dials, %d abandoned, %d evicted; drops: %d departed, %d non-member, %d health; peak %d sockets, %d by the pool's count",
		done.Load(), left.Load(), failed.Load(), st.Dials, st.Abandoned, st.DropsEvicted, st.DropsMembership, st.DropsNonMember, st.DropsHealth, socks.g.peak.Load(), st.PeakOpen)
	if st.PeakOpen > maxConns || socks.g.peak.Load() > maxConns {
		t.Errorf("peak open: %d by the pool's count, %d sockets; want at most MaxConns = %d", st.PeakOpen, socks.g.peak.Load(), maxConns)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := socks.g.now.Load(); n != 0 {
		t.Errorf("%d sockets open after Close", n)
	}
	for _, s := range srvs {
		s.stop()
	}
	checkFDs(t, base)
}
