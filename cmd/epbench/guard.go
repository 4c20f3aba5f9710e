package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/epcache/epcache/bench"
)

// The CPU figures of -suite ci are what -compare holds closest: epcache's
// CPU time per operation over a comparator's, at GOMAXPROCS 1, measured in
// pairs of runs one after the other (epcache, the comparator, epcache, the
// comparator, …) and judged by the median of the pairs' ratios.
//
// CPU time, not time: a process on a shared machine loses wall time to
// every other program that takes its core, in phases seconds long, and a
// ratio of two throughputs taken seconds apart moves with them; the CPU it
// spends per operation moves much less, for it does not count the time it
// waited. One core, so that no figure depends on a second one being free.
// Pairs, so that the two halves of each ratio ran within a second of each
// other, and a median, so that the pairs a burst of other work did reach
// do not decide it.

// cpuMargin is how many times the baseline's ratio a CPU figure may be.
// On this 2-core machine with other engineers' work on it, single pairs of
// hotset ranged from 0.6 to 3, but the medians of 60 came within 5 % of
// the baseline's in four runs of one build, two busy loops beside one of
// them (hotset 1.23 to 1.27 against 1.21), and the build whose evictions
// cost more (epcache_slowdemo) came to 1.61 to 1.75: 1.15 tells the two
// apart every time. Heavier load moves the medians (hotset's came to 1.29
// to 1.36 at a load of 10 to 12), and a regression of exactly 15 % would
// fail about half the time.
const cpuMargin = 1.15

// runPairs runs n interleaved pairs of every figure (a spec without its
// Impl): pair i runs epcache and then the figure's reference
// (cpuReferences), for each figure in turn, so that each figure's pairs are
// spread over the whole phase. Every pair runs the figure's seed: the
// pairs differ by the machine's noise, not by their access sequences.
// Every result has Pair set.
func runPairs(ctx context.Context, figs []bench.Spec, n int) ([]bench.Result, error) {
	var out []bench.Result
	for i := range n {
		for _, f := range figs {
			for _, impl := range []string{"epcache", cpuReference(f)} {
				s := f
				s.Impl = impl
				r, err := bench.Run(ctx, s)
				if err != nil {
					return out, err
				}
				r.Pair = i + 1
				r.CDF = nil // the figures read CPU per operation; the distributions would double a baseline's size
				out = append(out, r)
				if ctx.Err() != nil {
					return out, ctx.Err()
				}
			}
		}
	}
	return out, nil
}

// splitPairs separates the runs of the CPU figures' pairs from the others.
func splitPairs(results []bench.Result) (runs, pairs []bench.Result) {
	for _, r := range results {
		if r.Pair > 0 {
			pairs = append(pairs, r)
		} else {
			runs = append(runs, r)
		}
	}
	return runs, pairs
}

// cpuRatio is a CPU figure: epcache's CPU per operation over ref's, one
// ratio per pair, in the order of the pairs.
type cpuRatio struct {
	name   string // the spec's name with impl=epcache÷ref, and its GOMAXPROCS
	pairs  []float64
	median float64
}

// cpuRatios returns the CPU figures of the pairs among results, sorted by
// name. A pair whose halves did not both measure CPU time is left out.
func cpuRatios(results []bench.Result) []cpuRatio {
	type half struct{ epcache, ref float64 }
	byPair := map[string]map[int]*half{} // by figure name, then pair
	for _, r := range results {
		if r.Pair == 0 {
			continue
		}
		s := r.Spec
		ref := r.Impl
		if ref == "epcache" {
			ref = cpuReference(s)
		}
		s.Impl = "epcache÷" + ref
		name := fmt.Sprintf("%s procs=%d", s.Name(), s.Procs)
		if byPair[name] == nil {
			byPair[name] = map[int]*half{}
		}
		h := byPair[name][r.Pair]
		if h == nil {
			h = &half{}
			byPair[name][r.Pair] = h
		}
		if r.Impl == "epcache" {
			h.epcache = r.CPUPerOp
		} else {
			h.ref = r.CPUPerOp
		}
	}
	var out []cpuRatio
	for name, m := range byPair {
		c := cpuRatio{name: name}
		for _, p := range slices.Sorted(maps.Keys(m)) {
			if h := m[p]; h.epcache > 0 && h.ref > 0 {
				c.pairs = append(c.pairs, h.epcache/h.ref)
			}
		}
		if len(c.pairs) > 0 {
			c.median = median(c.pairs)
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b cpuRatio) int { return strings.Compare(a.name, b.name) })
	return out
}

// writeCPUFigures prints the CPU figures of pairs, for a run without
// -compare (whose table has them beside the baseline's).
func writeCPUFigures(w io.Writer, pairs []bench.Result) error {
	cs := cpuRatios(pairs)
	if len(cs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\nCPU per operation at GOMAXPROCS 1, epcache ÷ reference, median of interleaved pairs\tnow\tpairs (quartiles)\t\n")
	for _, c := range cs {
		lo, hi := quartiles(c.pairs)
		fmt.Fprintf(tw, "%s\t%.3f\t%d (%.3f–%.3f)\t\n", c.name, c.median, len(c.pairs), lo, hi)
	}
	return tw.Flush()
}

// cpuReferences names each figure's comparator by workload: otter on
// hotset (a cache under a cap that does not hold it), singleflight on
// storm (a creation shared by its callers, and no more), xsync4 on hit (a
// concurrent map's Load, the floor of a hit).
var cpuReferences = map[string]string{"hotset": "otter", "storm": "singleflight", "hit": "xsync4"}

func cpuReference(s bench.Spec) string { return cpuReferences[s.Workload] }

// cpuRow is a CPU figure beside the baseline's.
type cpuRow struct {
	cpuRatio
	baseline float64
}

func (r cpuRow) limit() float64 { return r.baseline * cpuMargin }
func (r cpuRow) worse() bool    { return r.median > r.limit() }

// quartiles returns the lower and upper quartiles of vs (medians of its
// lower and upper halves), for the spread of a figure's pairs.
func quartiles(vs []float64) (lo, hi float64) {
	vs = slices.Clone(vs)
	slices.Sort(vs)
	n := len(vs)
	return median(vs[:n/2+n%2]), median(vs[n/2:])
}

// pairCPU compares the CPU figures of current with the baseline's: the rows
// of figures both have, and current's figures that the baseline lacks.
func pairCPU(baseline, current []bench.Result) (rows []cpuRow, missing []cpuRatio) {
	base := map[string]float64{}
	for _, c := range cpuRatios(baseline) {
		base[c.name] = c.median
	}
	for _, c := range cpuRatios(current) {
		if b, ok := base[c.name]; ok {
			rows = append(rows, cpuRow{c, b})
		} else {
			missing = append(missing, c)
		}
	}
	return rows, missing
}

// freeCoreSpin is the spin ratio (see spinRatio) from which a second core
// counts as free: two free cores give 2, less what the runtime's own
// threads take; one busy loop beside the spinners, 1.33 (four thirds of a
// core among three threads, against a whole one), two busy loops, 1.5
// (one core among four threads, against two thirds of one among three). On
// this machine, with other engineers' builds and tests on both cores, the
// probes gave 0.6 to 1.4; with two busy loops added, 0.2 to 3.3, the
// loops starving one quarter and not the next: so the lowest of a run's
// probes decides.
const freeCoreSpin = 1.6

// spinProbe is how long spinRatio spins, in all: several of the
// scheduler's 10 ms slices at each GOMAXPROCS, short beside the run it
// precedes.
const spinProbe = 100 * time.Millisecond

// needsFreeCore reports whether the ratios s's runs enter measure how well
// more than one core runs at once: the hot peer's lease at more than one
// GOMAXPROCS (against the pool, and over its time at one; see swings).
func needsFreeCore(s bench.Spec) bool { return swingKey(s) == hotPeerSwing }

// runSpec runs s, after a spin probe at its GOMAXPROCS if needsFreeCore:
// just before, so that the probe saw the cores the run got.
func runSpec(ctx context.Context, s bench.Spec) (bench.Result, error) {
	spin := 0.0
	if needsFreeCore(s) {
		spin = spinRatio(s.Procs, spinProbe)
	}
	r, err := bench.Run(ctx, s)
	r.SpinRatio = spin
	return r, err
}

// freeCores is what the spin probes of a run say: whether every run whose
// ratios need a second core had one free, and the lowest spin ratio.
type freeCores struct {
	probes int
	lowest float64
}

// free reports whether the ratios that need a second core may be judged:
// some probe was made, and none fell below freeCoreSpin.
func (f freeCores) free() bool { return f.probes > 0 && f.lowest >= freeCoreSpin }

// why says why the ratios that need a second core were not judged.
func (f freeCores) why() string {
	if f.probes == 0 {
		return "no run measured whether a second core was free"
	}
	return fmt.Sprintf("two spinning goroutines at GOMAXPROCS 2 reached %.2f× their 1-core rate (the lowest of %d probes, one just before each run of those ratios), below the %.2g× that shows a second core free", f.lowest, f.probes, freeCoreSpin)
}

// withoutBusyCores returns results less the runs whose probe found no
// second core free, and how many it left out: a baseline's ratios that
// need a second core are taken from its runs that had one, as this run's
// are judged only if it had one.
func withoutBusyCores(results []bench.Result) ([]bench.Result, int) {
	out := results[:0:0]
	for _, r := range results {
		if needsFreeCore(r.Spec) && r.SpinRatio > 0 && r.SpinRatio < freeCoreSpin {
			continue
		}
		out = append(out, r)
	}
	return out, len(results) - len(out)
}

// probedCores collects the spin probes of results.
func probedCores(results []bench.Result) freeCores {
	var f freeCores
	for _, r := range results {
		if !needsFreeCore(r.Spec) {
			continue
		}
		if f.probes == 0 || r.SpinRatio < f.lowest {
			f.lowest = r.SpinRatio
		}
		f.probes++
	}
	return f
}

// spinRatio returns how much faster procs goroutines that do nothing but
// spin run at GOMAXPROCS procs than at 1, for d in all: near procs where
// that many cores are free for this process, near 1 where other programs
// hold all but one. The quarters run at 1, procs, procs, 1, so that load
// that rises or falls steadily over the probe weighs on both rates alike.
// It restores GOMAXPROCS.
func spinRatio(procs int, d time.Duration) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	q := d / 4
	one := spinRate(1, procs, q)
	many := spinRate(procs, procs, q) + spinRate(procs, procs, q)
	one += spinRate(1, procs, q)
	if one == 0 {
		return 0
	}
	return many / one
}

// spinRate runs n spinning goroutines for d at GOMAXPROCS procs and returns
// their iterations per second, all together.
func spinRate(procs, n int, d time.Duration) float64 {
	runtime.GOMAXPROCS(procs)
	type counter struct {
		n uint64
		_ [120]byte // each spinner writes its own line
	}
	counts := make([]counter, n)
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range counts {
		wg.Go(func() {
			<-start
			x, k := uint64(i)+1, uint64(0)
			for !stop.Load() {
				for range 1024 {
					x ^= x << 13 // xorshift: work the compiler cannot fold
					x ^= x >> 7
					x ^= x << 17
				}
				k++
			}
			counts[i].n = k + x&1 // x kept live; one iteration either way
		})
	}
	t0 := time.Now()
	close(start)
	time.Sleep(d)
	elapsed := time.Since(t0)
	stop.Store(true)
	wg.Wait()
	var total uint64
	for _, c := range counts {
		total += c.n
	}
	return float64(total) / elapsed.Seconds()
}
