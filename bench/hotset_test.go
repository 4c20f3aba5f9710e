package bench_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hotsetSpec is the hotset workload at test scale: 2,000 peers, a cap of
// 50, 16 goroutines, creations that sleep a little so that they overlap.
func hotsetSpec(impl string) bench.Spec {
	s := spec("hotset", impl, "uint64")
	s.Peers, s.Goroutines, s.Cap, s.Zipf = 2000, 16, 50, 1.1
	s.Cost, s.Duration, s.Idle = "sleep:20us", 100*time.Millisecond, 10*time.Millisecond
	return s
}

// epcache under a cap: never more endpoints live than the cap, creations
// in flight included, none released under a lease, none leaked. Structure
// only: the speed is the benchmark's business.
//
// The hit ratio is judged over hotsetMinOps measured operations at least. A
// run measures for its duration, and a slow or busy machine makes fewer
// operations in it (about 2,300 under -race on an idle 2-core machine, half
// that with two busy loops beside it): the test runs the spec again, with
// the next seed, until its runs together have made that many, and takes
// the ratio of them all.
func TestHotsetEpcacheStaysWithinCap(t *testing.T) {
	for _, impl := range []string{"epcache", "epcache-idle"} {
		for _, ctx := range []string{"background", "cancel"} {
			t.Run(impl+"/"+ctx, func(t *testing.T) {
				s := hotsetSpec(impl)
				s.Ctx = ctx
				var ops, created uint64
				for ops < hotsetMinOps {
					r, err := bench.Run(context.Background(), s)
					require.NoError(t, err)
					assert.Empty(t, r.Failure)
					// Each goroutine measures one operation at least, so
					// that this loop ends however slow the machine.
					require.GreaterOrEqual(t, r.Ops, uint64(s.Goroutines))
					assert.Positive(t, r.Creates)
					assert.LessOrEqual(t, r.PeakLive, int64(s.Cap), "peak live, creations included, within the cap")
					assert.LessOrEqual(t, r.Overshoot(), int64(0))
					assert.Zero(t, r.ReleasedInUse, "released under a lease")
					assert.Zero(t, r.Leaked)
					assert.Zero(t, r.DoubleReleases)
					assert.Zero(t, r.Errors)
					assert.LessOrEqual(t, r.Overlap, 1, "one creation of a peer at a time")
					ops += r.Ops
					created += uint64(math.Round((1 - r.HitRatio) * float64(r.Ops)))
					s.Seed++
				}
				hitRatio := 1 - float64(created)/float64(ops)
				t.Logf("hit ratio %.3f over %d operations in %d runs", hitRatio, ops, s.Seed-hotsetSpec(impl).Seed)
				assert.Less(t, hitRatio, 1.0, "a peer beyond the cap is created on every return")
				if impl == "epcache" {
					// epcache-idle's floor would depend on speed: on a
					// slow machine more values sit idle for 10 ms.
					floor := 0.8 * zipfTopMass(s.Zipf, s.Peers, s.Cap)
					assert.GreaterOrEqual(t, hitRatio, floor, "eviction keeps the hot set")
				}
			})
		}
	}
}

// hotsetMinOps is how many measured operations the hit ratio of
// TestHotsetEpcacheStaysWithinCap is taken over: its standard error is
// then about 0.011, an eighth of the distance from the 0.61 epcache keeps
// to the floor, 0.518; over a few dozen operations the ratio is the luck
// of the draw.
const hotsetMinOps = 2000

// zipfTopMass is the share of a Zipf workload's accesses that go to its
// cap hottest peers: the hit ratio of a cache that held exactly those. At
// test scale it is 0.648; epcache's eviction keeps 0.61 of the accesses
// hits (under -race too), an LRU of the same size 0.52, random and FIFO
// replacement 0.46 (simulated). Four fifths of it, 0.518, is a floor that
// an eviction which loses track of the hot peers fails, and that no
// speed of the machine moves: the ratio counts creations, not time.
func zipfTopMass(s float64, peers, hot int) float64 {
	var top, all float64
	for k := range peers { // P(k) ∝ (1+k)^-s, as rand.NewZipf(r, s, 1, peers-1)
		p := math.Pow(float64(1+k), -s)
		all += p
		if k < hot {
			top += p
		}
	}
	return top / all
}

// The comparators without a hard cap: the ledger sees them go past it. The
// pool reaps nothing within a run shorter than its idle time, and the warm
// phase alone (ten operations per endpoint of the cap, over 2,000 peers)
// touches more peers than the cap.
func TestHotsetShowsOvershoot(t *testing.T) {
	for _, impl := range []string{"pool", "syncmap"} {
		t.Run(impl, func(t *testing.T) {
			s := hotsetSpec(impl)
			s.Idle = time.Hour
			r, err := bench.Run(context.Background(), s)
			require.NoError(t, err)
			assert.Empty(t, r.Failure)
			assert.Positive(t, r.Overshoot(), "peak live %d, cap %d", r.PeakLive, s.Cap)
			assert.Zero(t, r.Leaked)
			assert.Zero(t, r.ReleasedInUse, "nothing releases before Close")
		})
	}
}

// Every comparator the suites run in hotset finishes it without a leak, a
// double release or a wrong answer; the bounded ones within the cap, the
// leased ones with no release under a use.
func TestHotsetComparators(t *testing.T) {
	for _, im := range bench.Impls {
		if !im.Evicts {
			continue
		}
		t.Run(im.Name, func(t *testing.T) {
			s := hotsetSpec(im.Name)
			r, err := bench.Run(context.Background(), s)
			require.NoError(t, err)
			assert.Empty(t, r.Failure)
			assert.Zero(t, r.Leaked)
			assert.Zero(t, r.DoubleReleases)
			assert.Zero(t, r.Errors)
			assert.Equal(t, r.Creates, r.Releases)
			if im.Bounded {
				assert.LessOrEqual(t, r.PeakLive, int64(s.Cap))
			}
			if im.Leases {
				assert.Zero(t, r.ReleasedInUse)
			}
			if im.ExactlyOnce {
				assert.LessOrEqual(t, r.Overlap, 1)
			}
			assert.Contains(t, r.Name(), "Hotset/impl="+im.Name+"/keys=uint64/dist=zipf/s=1.1/peers=2000/goroutines=16/cap=50/idle=10ms/cost=sleep:20us")
		})
	}
}
