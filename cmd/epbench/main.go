// Command epbench runs epcache's benchmark workloads against epcache and the
// comparators of package bench, and prints throughput, latency and the
// exactly-once ledger for each run.
//
// With no flags it runs the default suite (about a minute and a half on two
// cores) and prints each workload's table as it ends; on stderr, a progress
// bar on a terminal, else a line per workload. -h lists every flag and
// explains every column.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
	var ue usageError
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "epbench:", err)
		fmt.Fprintln(os.Stderr, "run 'epbench -h' for the flags")
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "epbench:", err)
		os.Exit(1)
	}
}

// usageError is a bad flag or argument: exit status 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

type options struct {
	suite      string
	impls      []string
	workloads  []string
	keys       []string
	dists      []string
	peers      []int
	goroutines []int
	procs      []int
	reads      []float64
	ctxs       []string
	rtts       []time.Duration
	caps       []int
	zipf       float64
	idle       time.Duration
	set        map[string]bool // the flags given
	duration   time.Duration
	cost       string
	churn      float64
	failures   int
	count      int
	seed       uint64
	out        string
	format     string
	compare    string
	margin     float64
	anyMachine bool   // -any-machine
	keep       string // -keep
	recheck    int
	pairs      int
	cpuprofile string
	trace      string
	debug      string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	specs, err := o.specs()
	if err != nil {
		return usageError{err}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()

	var debug *debugServer
	if o.debug != "" {
		if debug, err = startDebug(o.debug, stderr); err != nil {
			return err
		}
		defer debug.close()
	}
	stopProfiles, err := startProfiles(o.cpuprofile, o.trace)
	if err != nil {
		return err
	}
	// The table format streams: each group's table as its last run ends.
	// The others are written once every run has ended.
	var tables *tableStream
	if o.format == "table" {
		tables = &tableStream{w: stdout}
	}
	results, err := runAll(ctx, specs, o.count, stderr, debug, tables)
	var pairs []bench.Result // the CPU figures' runs (see guard.go)
	if err == nil {
		pairs, err = runPairs(ctx, o.cpuFigures(), o.pairs*o.count)
	}
	if perr := stopProfiles(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	machine := bench.Machine()
	for _, rs := range [][]bench.Result{results, pairs} {
		for i := range rs {
			rs[i].Machine = machine
		}
	}
	info := reportInfo{args: args, date: time.Now()}
	if o.compare != "" {
		info.comparison, info.compareErr = loadComparison(o.compare, slices.Concat(results, pairs), o.margin, o.anyMachine)
		// A ratio from one run can be a slow phase of the machine that hit
		// one implementation and not the other. The specs of a worse ratio
		// run again, and the ratio is taken from the medians of all their
		// runs: a real regression stays worse, a passing hiccup does not.
		if info.compareErr == nil && o.recheck > 0 {
			if again := info.comparison.worseSpecs(specs); len(again) > 0 {
				for i := range again {
					again[i].Seed += uint64(o.count) // seeds the first runs did not use
				}
				more, err := runAll(ctx, again, o.recheck, stderr, debug, nil)
				if err != nil {
					return err
				}
				for i := range more {
					more[i].Machine = machine
				}
				results = append(results, more...)
				if tables != nil {
					writeRechecked(tables, results, again)
				}
				info.comparison, info.compareErr = loadComparison(o.compare, slices.Concat(results, pairs), o.margin, o.anyMachine)
				if info.comparison != nil {
					info.comparison.rechecks = o.recheck
				}
			}
		}
	}
	// JSON, what a baseline is, has the pairs' runs too, each with its
	// pair; the other formats show the suite's runs, and the table's
	// comparison the pairs' figures.
	switch {
	case tables != nil:
		if o.compare == "" { // with -compare, its table shows them
			err = writeCPUFigures(stdout, pairs)
		}
		if eerr := tables.end(); err == nil { // the legend, after every table
			err = eerr
		}
	case o.format == "json":
		var kept []bench.Result
		if kept, err = keptRuns(o.keep, machine); err == nil {
			err = write(stdout, o.format, slices.Concat(kept, results, pairs))
		}
	default:
		err = write(stdout, o.format, results)
	}
	if err != nil {
		return err
	}
	if o.out != "" {
		if err := writeDir(o.out, results, info); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "epbench: wrote %s (the report: %s)\n", o.out, filepath.Join(o.out, "index.html"))
	}
	var failed []string
	for _, r := range slices.Concat(results, pairs) {
		if r.Failure != "" {
			failed = append(failed, r.Name()+": "+r.Failure)
		}
	}
	switch {
	case info.compareErr != nil:
		failed = append(failed, info.compareErr.Error())
	case info.comparison != nil:
		if err := info.comparison.write(stdout); err != nil {
			failed = append(failed, err.Error())
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d failed:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	return nil
}

// runAll runs every spec count times, and the caches of each on debug's
// page (if not nil). Comparators that cannot serve a spec's keys are
// skipped. On stderr, a progress bar when it is a terminal, else a line as
// each workload completes (see progressLine); tables, if not nil, gets each
// group's table as the group's last run ends.
func runAll(ctx context.Context, specs []bench.Spec, count int, stderr io.Writer, debug *debugServer, tables *tableStream) ([]bench.Result, error) {
	total := len(specs) * count
	visible := false
	if f, ok := stderr.(*os.File); ok {
		visible = term.IsTerminal(int(f.Fd()))
	}
	bar := progressbar.NewOptions(total,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetVisibility(visible),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetWidth(30),
	)
	defer bar.Close()
	t := newTracker(specs, count)
	start := time.Now()
	var results []bench.Result
	for i := range count {
		for _, s := range specs {
			bar.Describe(s.Name())
			s.Seed += uint64(i)
			debug.begin(s)
			r, err := runSpec(ctx, s)
			bar.Add(1)
			ran := !errors.Is(err, bench.ErrUnsupported)
			if err != nil && ran {
				return nil, err
			}
			if ran {
				results = append(results, r)
			}
			workloadDone, table := t.done(i, s, r, ran)
			if table != nil && tables != nil {
				if visible {
					bar.Clear() // the table may go to the same terminal
				}
				tables.table(*table)
			}
			if workloadDone && !visible {
				fmt.Fprint(stderr, progressLine(t, i, s, time.Since(start)))
			}
			if ran && ctx.Err() != nil {
				return results, ctx.Err()
			}
		}
	}
	return results, nil
}

// writeRechecked writes the tables of the groups that -recheck ran again,
// with every run, after a line that says so.
func writeRechecked(tables *tableStream, results []bench.Result, again []bench.Spec) {
	keys := map[string]bool{}
	for _, s := range again {
		keys[groupKey(s)] = true
	}
	if tables.err == nil {
		_, tables.err = fmt.Fprintf(tables.w, "\nRun again (-recheck), every run of each:\n")
	}
	for _, g := range groups(results) {
		if keys[groupKey(g.spec)] {
			tables.table(g)
		}
	}
}

// writeDir writes the results into dir in every format, the charts as SVG
// and PNG, and the report, index.html, that shows them all.
func writeDir(dir string, results []bench.Result, info reportInfo) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for format, name := range map[string]string{"json": "results.json", "csv": "results.csv", "bench": "results.txt", "table": "results.table"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = write(f, format, results)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	charts, err := writeCharts(dir, results)
	if err != nil {
		return err
	}
	return writeReport(dir, results, charts, info)
}

// startProfiles starts a CPU profile and an execution trace (runtime/trace,
// for go tool trace) into the files named, where they are not empty; the
// function it returns stops them and closes the files.
func startProfiles(cpuprofile, traceFile string) (stop func() error, err error) {
	var stops []func() error
	stop = func() error {
		var errs []error
		for _, s := range slices.Backward(stops) {
			errs = append(errs, s())
		}
		return errors.Join(errs...)
	}
	open := func(name string) (*os.File, error) {
		f, err := os.Create(name)
		if err == nil {
			stops = append(stops, f.Close)
		}
		return f, err
	}
	if cpuprofile != "" {
		f, err := open(cpuprofile)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, errors.Join(fmt.Errorf("-cpuprofile: %w", err), stop())
		}
		stops = append(stops, func() error { pprof.StopCPUProfile(); return nil })
	}
	if traceFile != "" {
		f, err := open(traceFile)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		if err := trace.Start(f); err != nil {
			return nil, errors.Join(fmt.Errorf("-trace: %w", err), stop())
		}
		stops = append(stops, func() error { trace.Stop(); return nil })
	}
	return stop, nil
}

func defaultProcs() []int { return []int{runtime.GOMAXPROCS(0)} }
