package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// hotsetWarm is how many operations, per endpoint of the cap, the hotset
// workload makes at no creation cost before it measures: enough to fill
// the cache and turn its contents over a few times, so that the hit ratio
// is the steady state's, not a cold start's.
const hotsetWarm = 10

// hotset runs the hotset loop: G goroutines each take peers from their
// own access sequence, get the endpoint (a lease where the comparator has
// one, a Get otherwise), use it briefly and let it go, for s.Duration,
// every operation timed. Before the clock starts they make hotsetWarm·Cap
// operations together at no creation cost. The ledger's peak of live
// endpoints covers the whole run; the hit ratio, the measured phase.
func hotset[K comparable](ctx context.Context, s Spec, c Cache[K], ks keySet[K], l *Ledger) phase {
	gctx := s.getContext(ctx) // ctx itself stops the run early
	leaser, _ := c.(Leaser[K])
	seqs := hotsetSequences(s)
	warm := min((hotsetWarm*s.Cap+s.Goroutines-1)/s.Goroutines, seqLen/4)
	type tally struct {
		ops, errors uint64
		hist        *hdrhistogram.Histogram
	}
	tallies := make([]tally, s.Goroutines)
	var (
		stop            atomic.Bool
		wg              sync.WaitGroup
		ready, warmed   sync.WaitGroup
		warmGo, measure = make(chan struct{}), make(chan struct{})
	)
	for g := range s.Goroutines {
		ready.Add(1)
		warmed.Add(1)
		wg.Go(func() {
			seq := seqs[g]
			// What the goroutine writes on every operation, in one
			// allocation padded off its neighbours' (see steadyWorker).
			w := &struct {
				t      tally
				expect int
				bad    bool
				_      [128]byte
			}{t: tally{hist: newHist()}}
			check := func(ep *Endpoint) {
				useBriefly(ep)
				w.bad = ep.Peer != w.expect
			}
			op := func(i int) {
				p := seq[i&SeqMask]
				key := ks.keys[p]
				w.expect, w.bad = int(p), false
				if leaser != nil {
					w.bad = leaser.Lease(gctx, key, check) != nil || w.bad
				} else if ep, err := c.Get(gctx, key); err != nil {
					w.bad = true
				} else {
					check(ep)
				}
				if w.bad {
					w.t.errors++
				}
			}
			ready.Done()
			<-warmGo
			for i := range warm {
				op(i)
			}
			warmed.Done()
			<-measure
			// One operation at least before the first look at stop, as
			// in steady: a run always measures something.
			for i := warm; ; i++ {
				t0 := time.Now()
				op(i)
				w.t.hist.RecordValue(int64(time.Since(t0)))
				w.t.ops++
				if stop.Load() {
					break
				}
			}
			tallies[g] = w.t
		})
	}
	ready.Wait()
	l.SetFree(true)
	close(warmGo)
	warmed.Wait()
	l.SetFree(false)
	created := l.Counts().Creates
	runtime.GC()
	m0 := mallocs()
	cpu0 := processCPU()
	t0 := time.Now()
	close(measure)
	timer := time.NewTimer(s.Duration)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
	}
	stop.Store(true)
	wg.Wait()
	ph := phase{elapsed: time.Since(t0), cpu: processCPU() - cpu0, allocs: mallocs() - m0, hist: newHist(), sampling: 1}
	created = l.Counts().Creates - created
	for _, t := range tallies {
		ph.ops += t.ops
		ph.errors += t.errors
		ph.hist.Merge(t.hist)
	}
	if ph.ops > 0 {
		ph.hitRatio = 1 - float64(created)/float64(ph.ops)
	}
	return ph
}

// sequenceMemo holds the access sequences of the last hotset shape run,
// which a run of the same shape and seed takes again: drawing them (64
// goroutines' seqLen Zipf numbers) takes several times as long as a
// 200 ms run measures, at one core, and epbench's CPU figures run one
// shape and seed dozens of times. The sequences are only read.
var sequenceMemo struct {
	sync.Mutex
	key  string
	seqs [][]uint32
}

// hotsetSequences returns every goroutine's access sequence
// (hotsetSequence), drawn on a goroutine each, or the memo's.
func hotsetSequences(s Spec) [][]uint32 {
	key := fmt.Sprint(s.Seed, s.Dist, s.Zipf, s.Peers, s.Goroutines)
	sequenceMemo.Lock()
	defer sequenceMemo.Unlock()
	if sequenceMemo.key != key {
		seqs := make([][]uint32, s.Goroutines)
		var wg sync.WaitGroup
		for g := range seqs {
			wg.Go(func() { seqs[g] = hotsetSequence(s, uint64(g)) })
		}
		wg.Wait()
		sequenceMemo.key, sequenceMemo.seqs = key, seqs
	}
	return sequenceMemo.seqs
}

// hotsetSequence returns goroutine g's access sequence: seqLen peer
// numbers drawn from s.Dist, Zipf with exponent s.Zipf over peer numbers
// (peer 0 the hottest, for every goroutine alike) or uniform, with a
// math/rand/v2 generator of the goroutine's own seeded by s.Seed and g.
func hotsetSequence(s Spec, g uint64) []uint32 {
	r := rand.New(rand.NewPCG(s.Seed, g))
	seq := make([]uint32, seqLen)
	if s.Dist == "zipf" {
		z := rand.NewZipf(r, s.Zipf, 1, uint64(s.Peers-1))
		for i := range seq {
			seq[i] = uint32(z.Uint64())
		}
		return seq
	}
	for i := range seq {
		seq[i] = uint32(r.IntN(s.Peers))
	}
	return seq
}
