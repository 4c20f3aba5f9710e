package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// A mesh is a set of P peers in this process that can open real endpoints to
// each other: loopback TCP connections (tcpstorm) or UCX endpoints between
// workers (ucxstorm, with -tags ucx). Each peer keeps its endpoints in a
// comparator of its own, as each process of an MPI job keeps its own.
type mesh interface {
	// open makes an endpoint from peer from to peer to. It may be called by
	// many goroutines at once, for the same pair too: that is the point.
	open(ctx context.Context, from, to int) (io.Closer, error)
	// roundTrips is how many round trips opening an endpoint waits for:
	// what Spec.RTT is paid for, per endpoint.
	roundTrips() int
	// close tears the peers down, once every endpoint is closed.
	close() error
}

// meshes are the mesh workloads, by name. A build-tagged file may add one
// in its init.
var meshes = map[string]func(peers int) (mesh, error){
	"tcpstorm": newTCPMesh,
}

// meshStorm is the storm of a mesh: P peers, each with its own comparator
// and G goroutines, all released together, each goroutine getting every
// other peer's endpoint in rotated order. The ledger is indexed by pair
// (from·P + to), so duplicates and overlap are counted per pair. Open file
// descriptors are counted before the peers start and after everything is
// closed: a difference is a leak.
func meshStorm[K comparable](ctx context.Context, s Spec, ks keySet[K], dense bool, r *Result) (phase, *Ledger, error) {
	P, G := s.Peers, s.Goroutines
	warmNetpoll()
	fdsBefore := openFDs()
	m, err := meshes[s.Workload](P)
	if err != nil {
		return phase{}, nil, err
	}
	l := NewLedger(P*P, MustCost("none"), 0)
	caches := make([]Cache[K], P)
	for from := range P {
		env := Env[K]{
			Create: func(ctx context.Context, k K) (*Endpoint, error) {
				to := ks.peer(k)
				return l.Make(ctx, from*P+to, func(ctx context.Context) (io.Closer, error) {
					if err := delay(ctx, s.RTT*time.Duration(m.roundTrips())); err != nil {
						return nil, err
					}
					return m.open(ctx, from, to)
				})
			},
			Release: func(_ K, ep *Endpoint) { l.Release(ep) },
			Peers:   P,
		}
		if dense {
			env.Index = ks.peer
		}
		if caches[from], err = New(s.Impl, env); err != nil {
			m.close()
			return phase{}, nil, err
		}
	}
	gctx := s.getContext(ctx)
	g := newGang(P*G, P-1)
	for from := range P {
		for i := range G {
			g.Go(func(rec *recorder) {
				first := int(int64(i) * int64(P) / int64(G))
				for j := range P {
					to := (first + j) % P
					if to == from {
						continue
					}
					t0 := time.Now()
					ep, err := caches[from].Get(gctx, ks.keys[to])
					rec.record(time.Since(t0), err != nil || ep.Peer != from*P+to)
				}
			})
		}
	}
	ph := g.run()
	var closeErr error
	for _, c := range caches {
		if err := c.Close(); err != nil && closeErr == nil {
			closeErr = err
		}
	}
	if err := m.close(); err != nil && closeErr == nil {
		closeErr = err
	}
	r.FDsBefore, r.FDsAfter = fdsBefore, openFDs()
	return ph, l, closeErr
}

// delay waits d (a modelled network delay, a creation's cost) or until ctx
// ends, whichever comes first, and returns ctx's error in the second case.
func delay(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var netpollOnce sync.Once

// warmNetpoll makes the runtime open its network poller's descriptors (an
// epoll instance and a wakeup descriptor, kept for the life of the process)
// before the first count, so that they are not taken for a leak.
func warmNetpoll() {
	netpollOnce.Do(func() {
		if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
			ln.Close()
		}
	})
}

// openFDs counts this process's open file descriptors, or returns -1 where
// /proc/self/fd does not exist.
func openFDs() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(entries) - 1 // the directory being read is one of them
}

func fdLeak(r Result) string {
	if r.FDsBefore < 0 || r.FDsBefore == r.FDsAfter {
		return ""
	}
	return fmt.Sprintf("%d file descriptors open after Close, %d before", r.FDsAfter, r.FDsBefore)
}
