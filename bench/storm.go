package bench

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
)

// storm releases G goroutines together; each gets every one of the P peers,
// goroutine g starting at g·P/G and going round, as each MPI rank starts at
// its own rank. With callerRetries, a Get that fails with ErrNotPublished is
// retried by the caller with the flaky workload's backoff (for comparators
// that do not retry inside the creation); the retries count as one Get.
func storm[K comparable](ctx context.Context, s Spec, c Cache[K], ks keySet[K], callerRetries bool) phase {
	ctx = s.getContext(ctx)
	g := newGang(s.Goroutines, s.Peers)
	for i := range s.Goroutines {
		g.Go(func(rec *recorder) {
			first := int(int64(i) * int64(s.Peers) / int64(s.Goroutines))
			for j := range s.Peers {
				p := (first + j) % s.Peers
				key := ks.keys[p]
				t0 := time.Now()
				ep, err := c.Get(ctx, key)
				for attempt := 1; err != nil && callerRetries && errors.Is(err, ErrNotPublished); attempt++ {
					wait, _ := flakyRetry(attempt, err)
					time.Sleep(wait)
					ep, err = c.Get(ctx, key)
				}
				rec.record(time.Since(t0), err != nil || ep.Peer != p)
			}
		})
	}
	return g.run()
}

// A gang is the goroutines of one storm. Each records the latency of its
// Gets in a recorder allocated before the storm, and none starts before all
// of them are parked at the barrier and the heap has been collected: the
// measured phase allocates nothing of the harness's own, and no goroutine
// gets a head start.
type gang struct {
	ready, done sync.WaitGroup
	start       chan struct{}
	recs        []recorder
	next        int // the recorder of the next goroutine Go starts
}

// recorder is one goroutine's part of a storm. The recorders lie side by
// side in one slice and each is written on every Get: the pad keeps
// neighbours off each other's cache lines.
type recorder struct {
	latencies []int64 // ns, one per Get, preallocated
	errors    uint64
	_         [128 - 32]byte
}

func (r *recorder) record(d time.Duration, failed bool) {
	r.latencies = append(r.latencies, int64(d))
	if failed {
		r.errors++
	}
}

// newGang prepares n goroutines of up to ops Gets each.
func newGang(n, ops int) *gang {
	g := &gang{start: make(chan struct{}), recs: make([]recorder, n)}
	for i := range g.recs {
		g.recs[i].latencies = make([]int64, 0, ops)
	}
	return g
}

// Go starts the next of the gang's goroutines, from one goroutine only;
// body runs once the gang is released.
func (g *gang) Go(body func(*recorder)) {
	rec := &g.recs[g.next]
	g.next++
	g.ready.Add(1)
	g.done.Go(func() {
		g.ready.Done()
		<-g.start
		body(rec)
	})
}

// run releases the gang once every goroutine is parked, waits for all of
// them, and returns the storm as one operation of ops Gets, measured to
// completion.
func (g *gang) run() phase {
	g.ready.Wait()
	runtime.GC()
	m0 := mallocs()
	cpu0 := processCPU()
	t0 := time.Now()
	close(g.start)
	g.done.Wait()
	ph := phase{completion: time.Since(t0), cpu: processCPU() - cpu0, allocs: mallocs() - m0, hist: newHist(), sampling: 1}
	ph.elapsed = ph.completion
	for i := range g.recs {
		r := &g.recs[i]
		ph.ops += uint64(len(r.latencies))
		ph.errors += r.errors
		for _, d := range r.latencies {
			ph.hist.RecordValue(d)
		}
	}
	return ph
}
