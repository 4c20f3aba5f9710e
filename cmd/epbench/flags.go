package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/epcache/epcache/internal/flaglist"
)

// listFlag, oneOf, positiveInt and nonNegativeDuration are the shared
// list flag and parsers, which epmesh uses too.
type listFlag[T any] = flaglist.List[T]

var (
	oneOf               = flaglist.OneOf
	nonNegativeDuration = flaglist.NonNegativeDuration
)

func positiveInt(flagName string) func(string) (int, error) { return flaglist.IntAtLeast(flagName, 1) }

func fraction(flagName string) func(string) (float64, error) {
	return func(s string) (float64, error) {
		pct := strings.HasSuffix(s, "%")
		f, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
		if pct {
			f /= 100
		}
		if err != nil || f < 0 || f > 1 {
			return 0, fmt.Errorf("%s %q: want a fraction from 0 to 1 (or a percentage)", flagName, s)
		}
		return f, nil
	}
}

const usageHead = `epbench runs endpoint-cache workloads against epcache and its comparators.

Usage:
  epbench [flags]

With no flags, the default suite runs (about a minute and a half on two
cores) and each workload's table is printed as the workload ends; on stderr,
a progress bar on a terminal, else a line per workload with the time elapsed
and the time left. Flags that name workloads, implementations or sizes build
a custom suite instead: every combination of the lists given runs once per
-count. Lists are comma-separated. The columns are explained at the end.

Workloads:
  hit     every peer ready, 100% Get (uint64 or string keys, uniform or zipf)
  storm   G goroutines released together, each Gets all P peers in rotated order
  churn   mostly hits; -churn of the operations report the endpoint as failed
  flaky   a storm whose creations fail -failures times per peer first
  mixed   -reads of the operations are Gets, the rest Invalidates
  lease   hold the endpoint while it is used (epcache Acquire and Release, a
          Consul-style pool, xsync v4 with a hand-written count); -churn of
          the operations Invalidate: released-in-use must stay 0
  hotset  G goroutines (64) lease, use briefly and let go of peers drawn by
          Zipf (-zipf) from 100,000, under a cap (-cap 1000), creations
          costing sleep:100us unless -cost says otherwise: hit ratio, peak
          live endpoints and overshoot past the cap, releases under a use;
          epcache against otter, golang-lru and a pool with a reaper (-idle)
  tcpstorm  P peers on loopback TCP, each with its own cache and G goroutines,
          all connecting to each other at once: connections opened,
          duplicates, file descriptors before and after; -rtt adds a
          modelled network round trip to each connection's setup
  ucxstorm  the same with UCX endpoints between P workers (a binary built
          with -tags ucx: go run -tags ucx ./cmd/epbench -workload ucxstorm)

Suites (-suite):
  default  hit, storm, churn (cost none, 1% and 5%, and 5% with -ctx cancel),
           flaky, mixed and lease (1% invalidated) at 1,024 peers, hotset
           (cap 1,000 of 100,000 peers), tcpstorm at 32 with rtt 0 and 1ms
  quick    the default suite with shorter runs (about 30 s)
  full     adds zipf access, 1,000,000 peers, a heavy-tailed creation cost
           (lognormal:500us:1.5), tcpstorm at rtt 5ms and 20ms and with
           -ctx cancel to the default suite (several minutes)
  ci       the short suite CI compares with a baseline, and its CPU figures:
           CPU per operation at GOMAXPROCS 1, epcache over otter (hotset),
           singleflight (storm) and xsync4 (hit), in -pairs interleaved
           pairs (one to three minutes, as busy as the machine is)

Contexts (-ctx): the Gets pass a context that never ends (background, as a
send that never gives up on a peer does), or one that can (cancel). epcache
runs Create on the claiming Get's goroutine in the first case only; the
other comparators do not care.

Flags:
`

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("epbench", flag.ContinueOnError)
	// The flag package prints the usage on every error; only -h gets it here,
	// a bad flag gets its error and a hint (see main).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	impls := &listFlag[string]{Vals: bench.ImplNames(), Parse: oneOf("-impl", bench.ImplNames()...)}
	workloads := &listFlag[string]{Vals: bench.Workloads, Parse: oneOf("-workload", bench.Workloads...)}
	keys := &listFlag[string]{Vals: []string{"uint64", "string"}, Parse: oneOf("-keys", "uint64", "string")}
	dists := &listFlag[string]{Vals: []string{"uniform"}, Parse: oneOf("-dist", "uniform", "zipf")}
	peers := &listFlag[int]{Vals: []int{1024}, Parse: positiveInt("-peers")}
	goroutines := &listFlag[int]{Parse: positiveInt("-goroutines")}
	procs := &listFlag[int]{Vals: defaultProcs(), Parse: positiveInt("-procs")}
	reads := &listFlag[float64]{Vals: []float64{1, 0.99, 0.9}, Parse: fraction("-reads")}
	rtts := &listFlag[time.Duration]{Vals: []time.Duration{0}, Parse: nonNegativeDuration("-rtt")}
	ctxs := &listFlag[string]{Vals: []string{"background"}, Parse: oneOf("-ctx", "background", "cancel")}
	caps := &listFlag[int]{Vals: []int{hotsetCap}, Parse: positiveInt("-cap")}
	fs.StringVar(&o.suite, "suite", "default", "the suite to run when no workload or size flag is given: default, quick, full or ci")
	fs.Var(impls, "impl", "implementations to run: "+strings.Join(bench.ImplNames(), ", "))
	fs.Var(workloads, "workload", "workloads to run: "+strings.Join(bench.Workloads, ", "))
	fs.Var(keys, "keys", "key types: uint64, string (array runs only with uint64)")
	fs.Var(dists, "dist", "access distributions for hit, churn and mixed, and hotset (which takes zipf unless this is given): uniform, zipf")
	fs.Var(peers, "peers", "numbers of peers P (hotset takes 100000 unless this is given)")
	fs.Var(goroutines, "goroutines", "numbers of goroutines G (default: GOMAXPROCS for hit, churn and mixed; 64 for storm, flaky and hotset; 8 per peer for tcpstorm)")
	fs.Var(procs, "procs", "GOMAXPROCS values to run under, such as 1,2,4,8,16 for a scaling sweep")
	fs.Var(reads, "reads", "mixed: read ratios, as fractions or percentages")
	fs.Var(rtts, "rtt", "tcpstorm, ucxstorm: modelled network delay, paid once per round trip of an endpoint's setup (a timer, not a measurement), such as 0,1ms,5ms")
	fs.Var(ctxs, "ctx", "contexts the Gets pass: background (never ends: epcache creates on the claiming goroutine), cancel (can end: epcache creates on a goroutine of its own)")
	fs.Var(caps, "cap", "hotset: bounds on the endpoints a comparator may hold, creations included")
	fs.Float64Var(&o.zipf, "zipf", hotsetZipf, "hotset: the exponent s of the Zipf access distribution, above 1")
	fs.DurationVar(&o.idle, "idle", hotsetIdle, "hotset: how long an endpoint may stay unused before the pool's reaper, and epcache-idle, remove it (0: never)")
	fs.DurationVar(&o.duration, "duration", time.Second, "how long each hit, churn, mixed, lease and hotset run measures")
	fs.StringVar(&o.cost, "cost", "sleep:1ms", "creation cost model: none, sleep:D, spin:D or lognormal:MEDIAN:SIGMA (storm, churn, flaky, mixed; hotset takes "+hotsetCost+" unless this is given)")
	fs.Float64Var(&o.churn, "churn", 0.01, "churn: fraction of operations that report their endpoint as failed; lease: fraction that Invalidate")
	fs.IntVar(&o.failures, "failures", 3, "flaky: failed creation attempts per peer before the first success")
	fs.IntVar(&o.count, "count", 1, "run every spec this many times (use 10 or more for benchstat)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the access sequences and random choices")
	fs.StringVar(&o.out, "out", "", "directory to write results.json, results.csv, results.txt (Go benchmark format) and charts (SVG and PNG) into")
	fs.StringVar(&o.format, "format", "table", "output on stdout: table, json, csv or bench (Go benchmark format, for benchstat)")
	fs.StringVar(&o.compare, "compare", "", "baseline results.json to compare with: ratios measured in this run against the baseline's; fails past -margin")
	fs.Float64Var(&o.margin, "margin", 2, "with -compare: how many times worse than the baseline a ratio may be")
	fs.StringVar(&o.keep, "keep", "", "with -format json: a baseline whose runs on other machines to write first, so that a baseline holds each machine's runs (make baseline); a missing file keeps none")
	fs.BoolVar(&o.anyMachine, "any-machine", false, "with -compare: compare with a baseline measured on another machine (by default an error: its ratios are that machine's, not this code's)")
	fs.IntVar(&o.recheck, "recheck", 2, "with -compare: run the specs of a ratio worse than -margin allows this many more times, and judge the ratio by the medians of all runs (0: judge the first runs)")
	fs.IntVar(&o.pairs, "pairs", 60, "with -suite ci: interleaved pairs of runs of each CPU figure (epcache, then its comparator, at GOMAXPROCS 1), per -count; -compare judges each figure by the median of its pairs' ratios")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the runs to this file (go tool pprof)")
	fs.StringVar(&o.debug, "debug", "", "serve a debug page of the epcache caches the runs build at this address (such as localhost:6060) while they run: every peer's state, the totals, creation latency")
	fs.StringVar(&o.trace, "trace", "", "write an execution trace of the runs to this file (go tool trace): scheduler latency, blocking, creations")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usageHead)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			fmt.Fprintln(stderr)
			writeLegend(stderr)
			return o, err
		}
		return o, usageError{err}
	}
	if fs.NArg() > 0 {
		return o, usageError{fmt.Errorf("unexpected argument %q: epbench takes flags only", fs.Arg(0))}
	}
	if !slices.Contains([]string{"table", "json", "csv", "bench"}, o.format) {
		return o, usageError{fmt.Errorf("-format %q: want table, json, csv or bench", o.format)}
	}
	if !slices.Contains([]string{"default", "quick", "full", "ci"}, o.suite) {
		return o, usageError{fmt.Errorf("-suite %q: want default, quick, full or ci", o.suite)}
	}
	if _, err := bench.ParseCost(o.cost); err != nil {
		return o, usageError{err}
	}
	switch {
	case o.count < 1:
		return o, usageError{fmt.Errorf("-count %d: want at least 1", o.count)}
	case o.duration <= 0:
		return o, usageError{fmt.Errorf("-duration %v: want a positive duration", o.duration)}
	case o.churn < 0 || o.churn > 1:
		return o, usageError{fmt.Errorf("-churn %v: want a fraction from 0 to 1", o.churn)}
	case o.failures < 0:
		return o, usageError{fmt.Errorf("-failures %d: want 0 or more", o.failures)}
	case o.pairs < 0:
		return o, usageError{fmt.Errorf("-pairs %d: want 0 or more", o.pairs)}
	case o.recheck < 0:
		return o, usageError{fmt.Errorf("-recheck %d: want 0 or more", o.recheck)}
	case o.margin < 1:
		return o, usageError{fmt.Errorf("-margin %v: want at least 1", o.margin)}
	}
	if rtts.Given && !slices.ContainsFunc(workloads.Vals, func(w string) bool { return bench.Spec{Workload: w}.IsMesh() }) {
		return o, usageError{fmt.Errorf("-rtt models the network of the mesh workloads (tcpstorm, ucxstorm); -workload %s has none", workloads)}
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if (o.set["cap"] || o.set["zipf"] || o.set["idle"]) && !slices.Contains(workloads.Vals, "hotset") {
		return o, usageError{fmt.Errorf("-cap, -zipf and -idle shape the hotset workload; -workload %s does not run it", workloads)}
	}
	switch {
	case !(o.zipf > 1 && o.zipf < 100):
		return o, usageError{fmt.Errorf("-zipf %v: want an exponent above 1 (and below 100)", o.zipf)}
	case o.idle < 0:
		return o, usageError{fmt.Errorf("-idle %v: want 0 (never) or a positive duration", o.idle)}
	}
	o.impls, o.workloads, o.keys, o.dists = impls.Vals, workloads.Vals, keys.Vals, dists.Vals
	o.peers, o.goroutines, o.procs, o.reads, o.ctxs, o.rtts = peers.Vals, goroutines.Vals, procs.Vals, reads.Vals, ctxs.Vals, rtts.Vals
	o.caps = caps.Vals
	if workloads.Given || keys.Given || dists.Given || peers.Given || goroutines.Given || reads.Given || ctxs.Given || rtts.Given || caps.Given || o.set["zipf"] || o.set["idle"] {
		o.suite = "" // a custom suite
	}
	return o, nil
}
