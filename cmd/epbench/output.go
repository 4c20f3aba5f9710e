package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/epcache/epcache/bench"
)

func write(w io.Writer, format string, results []bench.Result) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	case "csv":
		return writeCSV(w, results)
	case "bench":
		return writeBench(w, results)
	default:
		return writeTable(w, results)
	}
}

// group is the results of one spec, all implementations.
type group struct {
	spec    bench.Spec // Impl cleared
	results []bench.Result
}

func groups(results []bench.Result) []group {
	var gs []group
	index := map[string]int{}
	for _, r := range results {
		s := r.Spec
		s.Impl, s.Seed = "", 0
		key := groupKey(r.Spec)
		i, ok := index[key]
		if !ok {
			i = len(gs)
			index[key] = i
			gs = append(gs, group{spec: s})
		}
		gs[i].results = append(gs[i].results, r)
	}
	return gs
}

// headline is the primary measure of a run: the completion time of a storm,
// ns/op otherwise. Smaller is better.
func headline(r bench.Result) float64 { return r.NsPerOp }

// writeTable writes every group's table, between the line that says where
// the columns are explained and the legend itself.
func writeTable(w io.Writer, results []bench.Result) error {
	if _, err := fmt.Fprintln(w, legendPointer); err != nil {
		return err
	}
	for _, g := range groups(results) {
		if err := writeGroup(w, g); err != nil {
			return err
		}
	}
	return writeLegendAfterTables(w)
}

// writeLegendAfterTables ends the table format: the legend, after a blank
// line.
func writeLegendAfterTables(w io.Writer) error {
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	return writeLegend(w)
}

// writeGroup writes one group's table: its title line, then a row per
// result, in the columns of its kind of workload.
func writeGroup(w io.Writer, g group) error {
	s := g.spec
	s.Impl = "*"
	title := strings.Replace(s.Name(), "/impl=*", "", 1)
	cost := "  cost=" + s.Cost
	if s.IsMesh() || !s.MeasuresCreation() {
		cost = "" // real endpoints have their own cost, reported as "create"; a hit creates nothing
	}
	fmt.Fprintf(w, "\n%s  GOMAXPROCS=%d%s\n", title, s.Procs, cost)
	cols := columnsOf(s)
	// With -count, a group holds every run of each implementation:
	// ×epcache is over the median of epcache's.
	var eps []float64
	for _, r := range g.results {
		if r.Impl == "epcache" {
			eps = append(eps, headline(r))
		}
	}
	t := tableInfo{spec: g.spec, ref: median(eps)}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cells := make([]string, len(cols))
	for i, c := range cols {
		cells[i] = c.head
	}
	cells[len(cells)-1] = " " + cells[len(cells)-1] // the status column is left-aligned
	fmt.Fprintln(tw, strings.Join(cells, "\t"))
	for _, r := range g.results {
		for i, c := range cols {
			cells[i] = c.cell(r, t)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d)
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func si(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

var csvHeader = []string{"name", "workload", "impl", "keys", "dist", "peers", "goroutines", "procs", "cost", "churn", "failures", "reads", "ctx",
	"ops", "elapsed_ns", "ops_per_sec", "ns_per_op", "completion_ns", "p50_ns", "p99_ns", "p999_ns", "max_ns", "latency_sampling",
	"allocs_per_op", "bytes_per_entry", "creates", "attempts", "distinct", "invalidations", "duplicates", "releases", "leaked",
	"double_releases", "overlap", "concurrency", "errors", "mean_create_ns", "failure",
	"released_in_use", "peak_live", "cap", "overshoot", "hit_ratio", "zipf", "idle_ns"}

func writeCSV(w io.Writer, results []bench.Result) error {
	cw := csv.NewWriter(w)
	cw.Write(csvHeader)
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	for _, r := range results {
		cw.Write([]string{r.Name(), r.Workload, r.Impl, r.Keys, r.Dist, strconv.Itoa(r.Peers), strconv.Itoa(r.Goroutines),
			strconv.Itoa(r.Procs), r.Cost, f(r.Churn), strconv.Itoa(r.Failures), f(r.Reads), r.Ctx,
			fmt.Sprint(r.Ops), fmt.Sprint(int64(r.Elapsed)), f(r.OpsPerSec), f(r.NsPerOp), fmt.Sprint(int64(r.Completion)),
			fmt.Sprint(int64(r.P50)), fmt.Sprint(int64(r.P99)), fmt.Sprint(int64(r.P999)), fmt.Sprint(int64(r.Max)), strconv.Itoa(r.Sampling),
			f(r.AllocsPerOp), f(r.BytesPerEntry), fmt.Sprint(r.Creates), fmt.Sprint(r.Attempts), fmt.Sprint(r.Distinct),
			fmt.Sprint(r.Invalidations), fmt.Sprint(r.Duplicates), fmt.Sprint(r.Releases), fmt.Sprint(r.Leaked),
			fmt.Sprint(r.DoubleReleases), strconv.Itoa(r.Overlap), strconv.Itoa(r.Concurrency), fmt.Sprint(r.Errors), fmt.Sprint(int64(r.MeanCreate)), r.Failure,
			fmt.Sprint(r.ReleasedInUse), fmt.Sprint(r.PeakLive), strconv.Itoa(r.Cap), fmt.Sprint(r.Overshoot()), f(r.HitRatio), f(r.Zipf), fmt.Sprint(int64(r.Idle))})
	}
	cw.Flush()
	return cw.Error()
}

// writeBench writes the Go benchmark format, so that benchstat can compare
// two files: a storm is one operation whose time is the completion time; a
// steady run is Ops operations of NsPerOp each.
func writeBench(w io.Writer, results []bench.Result) error {
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: github.com/epcache/epcache/cmd/epbench\n", runtime.GOOS, runtime.GOARCH)
	for _, r := range results {
		n := r.Ops
		if r.Completion > 0 {
			n = 1
		}
		fmt.Fprintf(w, "Benchmark%s-%d\t%d\t%.4g ns/op\t%.4g allocs/op\t%d p50-ns\t%d p99-ns\t%d p99.9-ns\t%d max-ns\t%d creates\t%d duplicates\t%d leaked\t%d overlap\t%d create-ns",
			r.Name(), r.Procs, n, r.NsPerOp, r.AllocsPerOp, r.P50, r.P99, r.P999, r.Max, r.Creates, r.Duplicates, r.Leaked, r.Overlap, r.MeanCreate)
		if r.BytesPerEntry != 0 {
			fmt.Fprintf(w, "\t%.1f B/entry", r.BytesPerEntry)
		}
		if r.Workload == "hotset" {
			fmt.Fprintf(w, "\t%.4f hit-ratio\t%d peak-live\t%d overshoot\t%d in-use-releases", r.HitRatio, r.PeakLive, r.Overshoot(), r.ReleasedInUse)
		}
		fmt.Fprintln(w)
	}
	return nil
}
