package main

import (
	"context"
	"fmt"
	"time"

	"github.com/epcache/epcache/bench"
)

// StormResult is the connection storm across processes for one comparator
// and one modelled round trip, over -count runs: every process, from G
// goroutines at once, gets an endpoint to every other process through its
// own cache (one of bench's comparators), each endpoint a raw loopback
// connection dialed after a modelled delay of RTT, as epbench's tcpstorm
// does within one process.
type StormResult struct {
	Impl       string        `json:"impl"`
	RTT        time.Duration `json:"rtt_ns"`
	Processes  int           `json:"processes"`
	Goroutines int           `json:"goroutines"`
	// Completes are, run by run, the longest any process took until every
	// goroutine of it had every other process's endpoint: the mesh
	// complete. Complete is their median; PerProcess the median over the
	// runs of the median process's time.
	Completes  []time.Duration `json:"completes_ns"`
	Complete   time.Duration   `json:"complete_ns"`
	PerProcess time.Duration   `json:"per_process_ns"`
	// Creates is the endpoints made in one run, all processes (the most of
	// any run): N(N-1) for an exactly-once cache. Duplicates counts, over
	// all runs, endpoints beyond one per process and peer; Overlap is the
	// most creations of one process's endpoint to one peer in flight at
	// once.
	Creates    uint64 `json:"creates"`
	Duplicates uint64 `json:"duplicates"`
	Overlap    int    `json:"overlap"`
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// FDsBefore and FDsAfter are summed over the processes, before each
	// run and once its connections were closed, for the run whose counts
	// differed (the last one when none did).
	FDsBefore  int      `json:"fds_before"`
	FDsAfter   int      `json:"fds_after"`
	Violations []string `json:"violations,omitempty"`
}

// runStorm runs the storm with n processes for every comparator and round
// trip, o.count times each, the comparators taking turns.
func runStorm(ctx context.Context, e *env, n int) ([]StormResult, error) {
	o := e.o
	set, err := e.start(ctx, "storm", n, -1)
	if err != nil {
		return nil, err
	}
	defer set.close()
	if _, err := callAll[listenReply](ctx, set.procs, func(*proc) request { return request{Op: opRawListen} }); err != nil {
		return nil, err
	}
	if _, err := callAll[struct{}](ctx, set.procs, func(*proc) request {
		return request{Op: opSync, Dir: dirRaw, Timeout: o.timeout}
	}); err != nil {
		return nil, err
	}
	var out []StormResult
	accepted := make([]int64, n) // by process: the connections dialed to it so far, all runs
	for _, rtt := range o.rtts {
		first := len(out)
		for _, impl := range o.impls {
			out = append(out, StormResult{Impl: impl, RTT: rtt, Processes: n, Goroutines: o.g})
		}
		var perProcess = make([][]time.Duration, len(o.impls))
		for range o.count {
			for k, impl := range o.impls {
				r := &out[first+k]
				// Counted while every process is idle: once a run starts,
				// a process may count a connection from another that
				// started first.
				before, err := callAll[settleReply](ctx, set.procs, func(*proc) request { return request{Op: opFDs} })
				if err != nil {
					return out, err
				}
				reps, err := callAll[stormReply](ctx, set.procs, func(*proc) request {
					return request{Op: opStorm, Impl: impl, RTT: rtt, G: o.g, Timeout: o.timeout}
				})
				if err != nil {
					return out, err
				}
				for _, rep := range reps {
					for to, k := range rep.DialedTo {
						accepted[to] += k
					}
				}
				settled, err := callAll[settleReply](ctx, set.procs, func(p *proc) request {
					return request{Op: opSettle, FDs: before[p.id].FDs, Accepted: accepted[p.id], Timeout: o.timeout}
				})
				if err != nil {
					return out, err
				}
				var complete time.Duration
				var times []time.Duration
				var creates uint64
				fdsBefore, fdsAfter := 0, 0
				for i, rep := range reps {
					complete = max(complete, rep.Elapsed)
					times = append(times, rep.Elapsed)
					creates += rep.Counts.Creates
					r.Duplicates += rep.Counts.Duplicates
					r.Overlap = max(r.Overlap, rep.Counts.Overlap)
					r.Errors += rep.Errors
					if rep.FirstErr != "" && r.FirstError == "" {
						r.FirstError = fmt.Sprintf("process %d: %s", i, rep.FirstErr)
					}
					fdsBefore += before[i].FDs
					fdsAfter += settled[i].FDs
				}
				r.Completes = append(r.Completes, complete)
				perProcess[k] = append(perProcess[k], median(times))
				r.Creates = max(r.Creates, creates)
				if r.FDsBefore == r.FDsAfter {
					r.FDsBefore, r.FDsAfter = fdsBefore, fdsAfter
				}
			}
		}
		for k := range o.impls {
			r := &out[first+k]
			r.Complete, r.PerProcess = median(r.Completes), median(perProcess[k])
			r.Violations = r.check()
		}
	}
	return out, set.close()
}

func (r *StormResult) check() []string {
	var v []string
	if r.Errors > 0 {
		v = append(v, fmt.Sprintf("%d Gets failed (%s)", r.Errors, r.FirstError))
	}
	if im, err := bench.ImplNamed(r.Impl); err == nil && im.ExactlyOnce && r.Duplicates > 0 {
		v = append(v, fmt.Sprintf("%d duplicate endpoints from an exactly-once cache", r.Duplicates))
	}
	if want := uint64(r.Processes * (r.Processes - 1)); r.Creates < want {
		v = append(v, fmt.Sprintf("%d endpoints made in a run; want at least %d", r.Creates, want))
	}
	if r.FDsAfter != r.FDsBefore {
		v = append(v, fmt.Sprintf("%d descriptors open after a run, %d before", r.FDsAfter, r.FDsBefore))
	}
	return v
}
