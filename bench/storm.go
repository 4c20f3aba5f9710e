package bench

import (
	"context"
	"errors"
	"sync"
	"time"
)

// storm releases G goroutines together; each gets every one of the P peers,
// goroutine g starting at g·P/G and going round, as each MPI rank starts at
// its own rank. With callerRetries, a Get that fails with ErrNotPublished is
// retried by the caller with the flaky workload's backoff (for comparators
// that do not retry inside the creation); the retries count as one Get.
func storm[K comparable](ctx context.Context, s Spec, c Cache[K], ks keySet[K], callerRetries bool) phase {
	var wg sync.WaitGroup
	hists := make([]phase, s.Goroutines)
	start := make(chan struct{})
	for g := range s.Goroutines {
		wg.Go(func() {
			ph := phase{hist: newHist()}
			first := int(int64(g) * int64(s.Peers) / int64(s.Goroutines))
			<-start
			for i := range s.Peers {
				p := (first + i) % s.Peers
				key := ks.keys[p]
				t0 := time.Now()
				ep, err := c.Get(ctx, key)
				for attempt := 1; err != nil && callerRetries && errors.Is(err, ErrNotPublished); attempt++ {
					wait, _ := flakyRetry(attempt, err)
					time.Sleep(wait)
					ep, err = c.Get(ctx, key)
				}
				ph.hist.RecordValue(int64(time.Since(t0)))
				if err != nil || ep.Peer != p {
					ph.errors++
				}
			}
			hists[g] = ph
		})
	}
	return release(start, &wg, uint64(s.Goroutines)*uint64(s.Peers), hists)
}

// release starts a storm whose goroutines wait on start, waits for them, and
// sums what each recorded in its part: one operation, ops Gets, measured to
// completion.
func release(start chan struct{}, wg *sync.WaitGroup, ops uint64, parts []phase) phase {
	m0 := mallocs()
	t0 := time.Now()
	close(start)
	wg.Wait()
	ph := phase{completion: time.Since(t0), allocs: mallocs() - m0, hist: newHist(), sampling: 1, ops: ops}
	ph.elapsed = ph.completion
	for _, p := range parts {
		ph.errors += p.errors
		ph.hist.Merge(p.hist)
	}
	return ph
}
