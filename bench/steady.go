package bench

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// fill creates every peer's endpoint, at no creation cost, with g
// goroutines: the starting state of the steady workloads.
func fill[K comparable](ctx context.Context, c Cache[K], ks keySet[K], g int, l *Ledger) {
	l.SetFree(true)
	defer l.SetFree(false)
	var wg sync.WaitGroup
	for w := range g {
		wg.Go(func() {
			for i := w; i < len(ks.keys); i += g {
				c.Get(ctx, ks.keys[i]) // the run's own checks catch a failure
			}
		})
	}
	wg.Wait()
}

// sampleEvery is how often the steady workloads time a Get: a clock read
// costs several times a hit, so timing every one would measure the clock.
const sampleEvery = 64

// steady runs the hit, churn or mixed loop on G goroutines for s.Duration.
func steady[K comparable](ctx context.Context, s Spec, c Cache[K], ks keySet[K], l *Ledger) phase {
	// Operations other than a plain Get happen when a random word falls below
	// this threshold: the churn fraction, or the share of writes in mixed.
	var other uint64
	switch s.Workload {
	case "churn", "lease":
		other = uint64(s.Churn * math.MaxUint64)
	case "mixed":
		other = uint64((1 - s.Reads) * math.MaxUint64)
	}
	gctx := s.getContext(ctx) // ctx itself stops the run early
	var leaser Leaser[K]
	if s.Workload == "lease" {
		leaser = c.(Leaser[K])
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	type tally struct {
		ops, errors, invalidations uint64
		hist                       *hdrhistogram.Histogram
	}
	// Everything a goroutine needs is allocated here, and the clock starts
	// once every goroutine is parked at the barrier.
	tallies := make([]tally, s.Goroutines)
	seqs := make([][]uint32, s.Goroutines)
	for g := range seqs {
		seqs[g] = accessSequence(s.Dist, s.Peers, s.Seed+uint64(g))
		tallies[g].hist = newHist()
	}
	start := make(chan struct{})
	var ready sync.WaitGroup
	for g := range s.Goroutines {
		ready.Add(1)
		wg.Go(func() {
			t := tallies[g]
			seq := seqs[g]
			rng := rand.New(rand.NewPCG(s.Seed, uint64(g)))
			// The lease workload's use, made once per goroutine so that
			// an operation allocates nothing of the harness's.
			var (
				expect int
				bad    bool
			)
			check := func(ep *Endpoint) {
				use(ep)
				bad = ep.Peer != expect
			}
			ready.Done()
			<-start
			// At least one round of 256 before the first look at stop:
			// a goroutine the scheduler starts late, on a busy machine,
			// still measures, so that a run never reports no operations.
			i := 0
			for {
				for range 256 {
					p := seq[i&(seqLen-1)]
					i++
					key := ks.keys[p]
					if leaser != nil && (other == 0 || rng.Uint64() >= other) {
						// lease: get, use and let go of the endpoint
						expect, bad = int(p), false
						if i%sampleEvery == 0 {
							t0 := time.Now()
							err := leaser.Lease(gctx, key, check)
							t.hist.RecordValue(int64(time.Since(t0)))
							bad = bad || err != nil
						} else if leaser.Lease(gctx, key, check) != nil {
							bad = true
						}
						if bad {
							t.errors++
						}
						continue
					}
					if other != 0 && rng.Uint64() < other {
						if s.Workload == "mixed" || s.Workload == "lease" {
							if c.Invalidate(key) {
								l.Invalidated(int(p))
								t.invalidations++
							}
							continue
						}
						// churn: get the endpoint, then report it as failed
						ep, err := c.Get(gctx, key)
						if err != nil || ep.Peer != int(p) {
							t.errors++
						} else if c.Report(key, ep) {
							l.Invalidated(int(p))
							t.invalidations++
						}
						continue
					}
					var (
						ep  *Endpoint
						err error
					)
					if i%sampleEvery == 0 {
						t0 := time.Now()
						ep, err = c.Get(gctx, key)
						t.hist.RecordValue(int64(time.Since(t0)))
					} else {
						ep, err = c.Get(gctx, key)
					}
					if err != nil || ep.Peer != int(p) {
						t.errors++
					}
				}
				t.ops += 256
				if stop.Load() {
					break
				}
			}
			tallies[g] = t
		})
	}
	ready.Wait()
	runtime.GC()
	m0 := mallocs()
	t0 := time.Now()
	close(start)
	timer := time.NewTimer(s.Duration)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
	}
	stop.Store(true)
	wg.Wait()
	ph := phase{elapsed: time.Since(t0), allocs: mallocs() - m0, hist: newHist(), sampling: sampleEvery}
	for _, t := range tallies {
		ph.ops += t.ops
		ph.errors += t.errors
		ph.invalidations += t.invalidations
		ph.hist.Merge(t.hist)
	}
	return ph
}
