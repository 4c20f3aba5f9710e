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

// steady runs the hit, churn, mixed or lease loop on s.Goroutines
// goroutines for s.Duration.
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
	var leaser Leaser[K]
	if s.Workload == "lease" {
		leaser = c.(Leaser[K])
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	// Everything a goroutine needs is made here, and the clock starts once
	// every goroutine is parked at the barrier.
	workers := make([]*steadyWorker[K], s.Goroutines)
	for g := range workers {
		workers[g] = &steadyWorker[K]{
			workload: s.Workload, ctx: s.getContext(ctx), // ctx itself stops the run early
			c: c, leaser: leaser, ks: ks, l: l, other: other,
			seq:  accessSequence(s.Dist, s.Peers, s.Seed+uint64(g)),
			rng:  rand.New(rand.NewPCG(s.Seed, uint64(g))),
			hist: newHist(),
		}
	}
	start := make(chan struct{})
	var ready sync.WaitGroup
	for _, w := range workers {
		ready.Add(1)
		wg.Go(func() {
			ready.Done()
			<-start
			// At least one round of 256 before the first look at stop:
			// a goroutine the scheduler starts late, on a busy machine,
			// still measures, so that a run never reports no operations.
			for {
				w.round()
				if stop.Load() {
					break
				}
			}
		})
	}
	ready.Wait()
	runtime.GC()
	m0 := mallocs()
	cpu0 := processCPU()
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
	ph := phase{elapsed: time.Since(t0), cpu: processCPU() - cpu0, allocs: mallocs() - m0, hist: newHist(), sampling: sampleEvery}
	for _, w := range workers {
		ph.ops += w.ops
		ph.errors += w.errors
		ph.invalidations += w.invalidations
		ph.hist.Merge(w.hist)
	}
	return ph
}

// steadyWorker is one goroutine of the steady workloads: its sequence of
// peers, its random numbers and its tallies.
type steadyWorker[K comparable] struct {
	workload string
	ctx      context.Context
	c        Cache[K]
	leaser   Leaser[K] // the lease workload's, else nil
	ks       keySet[K]
	l        *Ledger
	other    uint64 // see steady
	seq      []uint32
	rng      *rand.Rand
	i        int // operations so far

	ops, errors, invalidations uint64
	hist                       *hdrhistogram.Histogram

	// The lease's check of the endpoint it is handed, made once so that
	// an operation allocates nothing of the harness's.
	expect int
	bad    bool
	check  func(*Endpoint)

	// Workers are allocated one after another, and each writes its own
	// fields on every operation: the pad keeps the fields one worker
	// writes off the cache lines another reads (its first fields), which
	// would otherwise move between the cores on every operation and
	// charge every comparator for the harness's false sharing.
	_ [128]byte
}

// round makes the worker's next 256 operations: leases, invalidations or
// reports (churn, mixed, lease), and Gets, written out here so that a Get
// costs the loop what it did inline. One operation in sampleEvery is timed.
func (w *steadyWorker[K]) round() {
	for range 256 {
		p := w.seq[w.i&(seqLen-1)]
		w.i++
		key := w.ks.keys[p]
		timed := w.i%sampleEvery == 0
		if w.leaser != nil && (w.other == 0 || w.rng.Uint64() >= w.other) {
			w.lease(p, key, timed)
			continue
		}
		if w.other != 0 && w.rng.Uint64() < w.other {
			w.invalidate(p, key)
			continue
		}
		var (
			ep  *Endpoint
			err error
		)
		if timed {
			t0 := time.Now()
			ep, err = w.c.Get(w.ctx, key)
			w.hist.RecordValue(int64(time.Since(t0)))
		} else {
			ep, err = w.c.Get(w.ctx, key)
		}
		if err != nil || ep.Peer != int(p) {
			w.errors++
		}
	}
	w.ops += 256
}

// lease gets, uses and lets go of peer p's endpoint.
func (w *steadyWorker[K]) lease(p uint32, key K, timed bool) {
	if w.check == nil {
		w.check = func(ep *Endpoint) {
			if use(ep) {
				w.l.releasedInUse.Add(1)
			}
			w.bad = ep.Peer != w.expect
		}
	}
	w.expect, w.bad = int(p), false
	var t0 time.Time
	if timed {
		t0 = time.Now()
	}
	err := w.leaser.Lease(w.ctx, key, w.check)
	if timed {
		w.hist.RecordValue(int64(time.Since(t0)))
	}
	if w.bad || err != nil {
		w.errors++
	}
}

// invalidate drops peer p's endpoint: mixed and lease invalidate it, churn
// gets it and reports it failed.
func (w *steadyWorker[K]) invalidate(p uint32, key K) {
	if w.workload == "mixed" || w.workload == "lease" {
		if w.c.Invalidate(key) {
			w.l.Invalidated(int(p))
			w.invalidations++
		}
		return
	}
	ep, err := w.c.Get(w.ctx, key)
	if err != nil || ep.Peer != int(p) {
		w.errors++
	} else if w.c.Report(key, ep) {
		w.l.Invalidated(int(p))
		w.invalidations++
	}
}
