package bench_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := findLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// hang bounds a wait that only detects a hang: a test may wait this long
// for something that must happen, however slow or busy the machine, and
// fails only if it never does.
const hang = 2 * time.Minute

// findLeaks is goleak.VerifyTestMain's check, looked at again until hang has
// passed: goleak.Find gives a goroutine about half a second to exit, and one
// past its last synchronisation (a WaitGroup's Done, a closed channel) may
// not be scheduled that soon on a busy machine. Only a goroutine that never
// exits fails.
func findLeaks() error {
	deadline := time.Now().Add(hang)
	for {
		err := goleak.Find()
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

func spec(workload, impl, keys string) bench.Spec {
	s := bench.Spec{
		Workload: workload, Impl: impl, Keys: keys, Dist: "uniform",
		Peers: 64, Goroutines: 8, Duration: 20 * time.Millisecond,
		Cost: "none", Churn: 0.05, Failures: 2, Reads: 0.9, Seed: 1,
	}
	if workload == "hotset" {
		s.Dist, s.Zipf, s.Cap, s.Idle = "zipf", 1.1, 16, 5*time.Millisecond
	}
	return s
}

// Every comparator, every workload, both key types: no leak, no double
// release, no wrong answer, and exactly once where the comparator promises it.
func TestEveryComparatorIsCorrect(t *testing.T) {
	for _, im := range bench.Impls {
		for _, w := range bench.Workloads {
			for _, keys := range []string{"uint64", "string"} {
				t.Run(w+"/"+im.Name+"/"+keys, func(t *testing.T) {
					s := spec(w, im.Name, keys)
					switch w {
					case "storm", "flaky":
						s.Cost = "sleep:100us"
					case "tcpstorm", "ucxstorm":
						s.Peers, s.Goroutines = 16, 4
					}
					r, err := bench.Run(context.Background(), s)
					if im.Dense && keys == "string" || w == "lease" && !im.Leases {
						require.ErrorIs(t, err, bench.ErrUnsupported)
						return
					}
					require.NoError(t, err)
					assert.Empty(t, r.Failure)
					assert.Zero(t, r.Leaked)
					assert.Positive(t, r.Ops)
					assert.Equal(t, r.Creates, r.Releases)
					if w == "storm" || w == "flaky" {
						assert.Equal(t, uint64(s.Peers), r.Distinct, "every peer was created")
						assert.Positive(t, r.Completion)
					}
					if w == "tcpstorm" || w == "ucxstorm" {
						assert.EqualValues(t, s.Peers*(s.Peers-1), r.Distinct, "every pair connected")
						if r.FDsBefore >= 0 {
							assert.Equal(t, r.FDsBefore, r.FDsAfter, "every connection closed")
						}
						if im.ExactlyOnce {
							assert.EqualValues(t, s.Peers*(s.Peers-1), r.Creates, "one connection per pair and direction")
						}
					}
					if im.ExactlyOnce && (w == "storm" || w == "flaky" || w == "hit") {
						assert.EqualValues(t, s.Peers, r.Creates, "exactly once")
						assert.LessOrEqual(t, r.Overlap, 1)
					}
					if w == "flaky" {
						assert.GreaterOrEqual(t, r.Attempts, uint64(s.Peers*(s.Failures+1)))
					}
					if w == "churn" || w == "mixed" || w == "lease" {
						assert.Positive(t, r.Invalidations)
					}
					if w == "hotset" && im.Bounded {
						assert.LessOrEqual(t, r.PeakLive, int64(s.Cap), "never above the cap, creations included")
					}
					// Without a lease, an eviction may release an
					// endpoint under its use: hotset reports it.
					if w != "hotset" || im.Leases {
						assert.Zero(t, r.ReleasedInUse, "released under a lease")
					}
				})
			}
		}
	}
}

// The storm of creations that each take a while: epcache creates each peer
// once, and creations of distinct peers run at the same time; the mutex
// creates them one after another. Structure only, no clock: which of the two
// finishes first is a benchmark's business (make bench-ci), never a test's.
// That epcache's creations overlap is shown with a gate (creationsOverlap):
// a storm overlaps them only if the scheduler runs two goroutines while one
// sleeps in a creation, which a busy machine need not do.
func TestStormOverlapsCreations(t *testing.T) {
	run := func(impl string) bench.Result {
		s := spec("storm", impl, "uint64")
		s.Peers, s.Goroutines, s.Cost = 64, 16, "sleep:5ms"
		r, err := bench.Run(context.Background(), s)
		require.NoError(t, err)
		require.Empty(t, r.Failure)
		assert.EqualValues(t, s.Peers, r.Creates, "%s: one creation per peer", impl)
		assert.EqualValues(t, s.Peers, r.Releases, "%s: every endpoint released", impl)
		assert.Zero(t, r.Leaked, impl)
		assert.LessOrEqual(t, r.Overlap, 1, "%s: one creation of a peer at a time", impl)
		return r
	}
	run("epcache")
	assert.Equal(t, 1, run("mutex").Concurrency, "the mutex serialises every creation")
	assert.Equal(t, 2, creationsOverlap(t, "epcache"), "epcache's creations of distinct peers overlapped")
}

// creationsOverlap gets peer 0 from impl, whose creation waits inside
// Create until peer 1's creation has run, and gets peer 1 meanwhile; it
// returns the most creations the ledger saw in flight at once. A cache
// that ran one creation at a time would hold peer 1's Get until peer 0's
// creation returned, which waits for it: such a regression hangs until
// hang ends the wait.
func creationsOverlap(t *testing.T, impl string) int {
	l := bench.NewLedger(2, bench.MustCost("none"), 0)
	zeroStarted, oneRan := make(chan struct{}), make(chan struct{})
	c, err := bench.New(impl, bench.Env[uint64]{
		Create: func(ctx context.Context, k uint64) (*bench.Endpoint, error) {
			return l.Make(ctx, int(k), func(context.Context) (io.Closer, error) {
				if k == 1 {
					close(oneRan)
					return nil, nil
				}
				close(zeroStarted)
				select {
				case <-oneRan:
					return nil, nil
				case <-time.After(hang):
					return nil, errors.New("peer 1's creation never ran while peer 0's was in flight")
				}
			})
		},
		Release: func(_ uint64, ep *bench.Endpoint) { l.Release(ep) },
		Peers:   2,
	})
	require.NoError(t, err)
	zero := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), 0)
		zero <- err
	}()
	<-zeroStarted
	_, err = c.Get(context.Background(), 1)
	require.NoError(t, err)
	require.NoError(t, <-zero)
	require.NoError(t, c.Close())
	counts := l.Counts()
	assert.EqualValues(t, 2, counts.Creates)
	assert.Equal(t, counts.Creates, counts.Releases)
	return counts.Concurrency
}

// epcache with a context that can end creates on goroutines of its own: the
// same promises hold in every workload.
func TestEpcacheWithCancelableContext(t *testing.T) {
	for _, w := range bench.Workloads {
		t.Run(w, func(t *testing.T) {
			s := spec(w, "epcache", "uint64")
			s.Ctx = "cancel"
			switch w {
			case "storm", "flaky":
				s.Cost = "sleep:100us"
			case "tcpstorm", "ucxstorm":
				s.Peers, s.Goroutines = 8, 4
			}
			r, err := bench.Run(context.Background(), s)
			require.NoError(t, err)
			assert.Empty(t, r.Failure)
			assert.Equal(t, r.Creates, r.Releases)
			assert.Contains(t, r.Name(), "/ctx=cancel")
		})
	}
}

// A modelled round trip delays every connection's setup by at least RTT per
// round trip (a timer never fires early), and changes nothing else.
func TestMeshRTT(t *testing.T) {
	s := spec("tcpstorm", "epcache", "uint64")
	s.Peers, s.Goroutines, s.RTT = 8, 2, 2*time.Millisecond
	r, err := bench.Run(context.Background(), s)
	require.NoError(t, err)
	assert.Empty(t, r.Failure)
	assert.EqualValues(t, s.Peers*(s.Peers-1), r.Creates, "one connection per pair and direction")
	assert.GreaterOrEqual(t, r.MeanCreate, s.RTT, "each setup waited for its round trip")
	assert.Contains(t, r.Name(), "/rtt=2ms")
}

// The ledger catches what a broken cache does: a cache that never releases
// leaks, and the run says so.
func TestLedgerCatchesLeaksAndOverlap(t *testing.T) {
	l := bench.NewLedger(2, bench.MustCost("none"), 0)
	a, err := l.Create(context.Background(), 0)
	require.NoError(t, err)
	_, err = l.Create(context.Background(), 0)
	require.NoError(t, err)
	l.Release(a)
	l.Release(a)
	c := l.Counts()
	assert.EqualValues(t, 2, c.Creates)
	assert.EqualValues(t, 1, c.Distinct)
	assert.EqualValues(t, 1, c.Releases)
	assert.EqualValues(t, 1, c.DoubleReleases)

	fl := bench.NewLedger(1, bench.MustCost("none"), 2)
	for range 2 {
		_, err := fl.Create(context.Background(), 0)
		assert.ErrorIs(t, err, bench.ErrNotPublished)
	}
	_, err = fl.Create(context.Background(), 0)
	assert.NoError(t, err)
}

// The peak of live endpoints: a creation counts from its start, a failed
// one until it fails, a created one until its release; a double release
// does not count twice; and concurrent creations are all seen.
func TestLedgerPeakLive(t *testing.T) {
	ctx := context.Background()
	l := bench.NewLedger(4, bench.MustCost("none"), 0)
	a, err := l.Create(ctx, 0)
	require.NoError(t, err)
	var during int64
	_, err = l.Make(ctx, 1, func(context.Context) (io.Closer, error) {
		during = l.Counts().PeakLive
		return nil, errors.New("refused")
	})
	require.Error(t, err)
	assert.EqualValues(t, 2, during, "a creation is live from its start")
	b, err := l.Create(ctx, 2)
	require.NoError(t, err)
	assert.EqualValues(t, 2, l.Counts().PeakLive, "the failed creation is live no more")
	l.Release(a)
	l.Release(a) // a double release, counted as one, lowers nothing twice
	l.Release(b)
	var eps []*bench.Endpoint
	for range 3 {
		ep, err := l.Create(ctx, 3)
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	assert.EqualValues(t, 3, l.Counts().PeakLive)
	for _, ep := range eps {
		l.Release(ep)
	}

	// n goroutines each create, then wait until all have, then release:
	// all n are live at once, and the peak says exactly n.
	const n = 32
	cl := bench.NewLedger(n, bench.MustCost("none"), 0)
	var created, done sync.WaitGroup
	created.Add(n)
	for i := range n {
		done.Go(func() {
			ep, err := cl.Create(ctx, i)
			created.Done()
			if !assert.NoError(t, err) {
				return
			}
			created.Wait()
			cl.Release(ep)
		})
	}
	done.Wait()
	c := cl.Counts()
	assert.EqualValues(t, n, c.PeakLive)
	assert.EqualValues(t, n, c.Releases)
}

// MeanCreate is the mean of the creations made while a run measured: the
// free ones that fill a cache first are left out, so a run that created
// nothing while it measured has none to report.
func TestLedgerMeanCreateLeavesOutTheFill(t *testing.T) {
	ctx := context.Background()
	l := bench.NewLedger(3, bench.MustCost("sleep:2ms"), 0)
	l.SetFree(true)
	_, err := l.Create(ctx, 0)
	require.NoError(t, err)
	l.SetFree(false)
	c := l.Counts()
	assert.EqualValues(t, 1, c.Creates)
	assert.Zero(t, c.MeanCreate, "a free creation is no measurement")
	_, err = l.Create(ctx, 1)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, l.Counts().MeanCreate, 2*time.Millisecond, "the paid creation alone, not halved by the free one")
	for _, tc := range []struct {
		s    bench.Spec
		want bool
	}{
		{bench.Spec{Workload: "hit"}, false},
		{bench.Spec{Workload: "mixed", Reads: 1}, false},
		{bench.Spec{Workload: "mixed", Reads: 0.99}, true},
		{bench.Spec{Workload: "churn", Churn: 0}, false},
		{bench.Spec{Workload: "lease", Churn: 0.01}, true},
		{bench.Spec{Workload: "storm"}, true},
		{bench.Spec{Workload: "hotset"}, true},
		{bench.Spec{Workload: "tcpstorm"}, true},
	} {
		assert.Equal(t, tc.want, tc.s.MeasuresCreation(), "%+v", tc.s)
	}
}

func TestBadSpecs(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*bench.Spec)
		want   string
	}{
		{func(s *bench.Spec) { s.Workload = "nap" }, `unknown workload "nap"`},
		{func(s *bench.Spec) { s.Impl = "redis" }, `unknown implementation "redis"`},
		{func(s *bench.Spec) { s.Keys = "float" }, `keys "float"`},
		{func(s *bench.Spec) { s.Dist = "pareto" }, `dist "pareto"`},
		{func(s *bench.Spec) { s.Peers = 0 }, "peers 0"},
		{func(s *bench.Spec) { s.Goroutines = -1 }, "goroutines -1"},
		{func(s *bench.Spec) { s.Duration = 0 }, "duration 0s"},
		{func(s *bench.Spec) { s.Cost = "sleep:soon" }, `cost "sleep:soon"`},
		{func(s *bench.Spec) { s.Churn = 2 }, "churn 2"},
		{func(s *bench.Spec) { s.Ctx = "todo" }, `ctx "todo"`},
		{func(s *bench.Spec) { s.RTT = -time.Millisecond }, "rtt -1ms"},
		{func(s *bench.Spec) { s.RTT = time.Millisecond }, "only the mesh workloads"},
		{func(s *bench.Spec) { s.Cap = 10 }, "only hotset bounds"},
		{func(s *bench.Spec) { s.Workload, s.Dist, s.Zipf = "hotset", "zipf", 1.1 }, "cap 0"},
		{func(s *bench.Spec) { s.Workload, s.Dist, s.Cap, s.Zipf = "hotset", "zipf", 10, 1 }, "zipf 1"},
		{func(s *bench.Spec) { s.Workload, s.Cap, s.Idle = "hotset", 10, -time.Second }, "idle -1s"},
	} {
		s := spec("hit", "epcache", "uint64")
		tc.mutate(&s)
		_, err := bench.Run(context.Background(), s)
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestParseCost(t *testing.T) {
	for in, want := range map[string]string{
		"none": "none", "sleep:1ms": "sleep:1ms", "spin:20us": "spin:20µs", "lognormal:500us:1.5": "lognormal:500µs:1.5",
	} {
		c, err := bench.ParseCost(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, c.String())
	}
	for _, bad := range []string{"", "sleep", "sleep:-1ms", "spin:x", "lognormal:1ms", "lognormal:1ms:0", "none:1", "wait:1ms"} {
		_, err := bench.ParseCost(bad)
		assert.Error(t, err, bad)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.True(t, errors.Is(bench.MustCost("sleep:1h").Pay(ctx), context.Canceled), "a sleep ends with its context")
}
