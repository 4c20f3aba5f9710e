package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
)

// The headline shows, per row, epcache's median and range beside the
// comparator with the lowest median among those the row compares against
// (the dense array, the floor, never; a storm's only the exactly-once
// ones), and the ratio of the medians; a row with no epcache run is left
// out, and the note says how hot-peer leases scale and the hit ratios.
func TestHeadlines(t *testing.T) {
	r := func(workload, impl string, ns float64, mut func(*bench.Spec)) bench.Result {
		s := bench.Spec{Workload: workload, Impl: impl, Keys: "uint64", Dist: "uniform", Peers: 1024, Goroutines: 64, Procs: 2, Cost: "none"}
		if mut != nil {
			mut(&s)
		}
		return bench.Result{Spec: s, NsPerOp: ns, Completion: time.Duration(ns)}
	}
	storm := func(s *bench.Spec) { s.Cost = "sleep:1ms" }
	hot := func(procs int) func(*bench.Spec) {
		return func(s *bench.Spec) { s.Peers, s.Procs, s.Goroutines = 1, procs, procs }
	}
	results := []bench.Result{
		r("hit", "epcache", 5, nil), r("hit", "epcache", 6, nil), r("hit", "epcache", 9, nil),
		r("hit", "xsync4", 4, nil), r("hit", "xsync4", 5, nil), r("hit", "syncmap", 10, nil), r("hit", "array", 1, nil),
		r("storm", "epcache", 20e6, storm), r("storm", "syncmap", 10e6, storm), r("storm", "mutex", 1e9, storm),
		r("lease", "epcache", 16, hot(1)), r("lease", "epcache", 9, hot(2)), r("lease", "pool", 30, hot(1)), r("lease", "pool", 45, hot(2)),
		r("lease", "xsync4rc", 12, hot(2)),
	}
	doc := headlines(results)
	for _, want := range []string{
		"| hit: 1,024 uint64 peers | per Get | 6.0 ns (5.0 ns–9.0 ns) | xsync4 4.5 ns (4.0 ns–5.0 ns) | 1.33 |",
		"| storm: 1,024 peers, 64 goroutines, dial 1ms | until every goroutine has every peer | 20.0 ms | mutex 1.00 s | 0.02 |",
		"| lease: one hot peer, GOMAXPROCS 1 | per Acquire, use, Release | 16.0 ns | pool 30.0 ns | 0.53 |",
		"| lease: one hot peer, GOMAXPROCS 2 | per Acquire, use, Release | 9.0 ns | xsync4rc 12.0 ns | 0.75 |",
		"| 1.33 | `go run ./cmd/epbench -workload hit -keys uint64 -cost none -count 5` |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("headlines lack %q:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "string peers") || strings.Contains(doc, "array") {
		t.Errorf("headlines show a row without epcache's runs, or the floor:\n%s", doc)
	}
	note := headlineNote(results)
	if !strings.Contains(note, "epcache 0.56, the pool 1.50") {
		t.Errorf("headlineNote = %q; want the hot peer's scaling", note)
	}
}

// The hotset table shows every comparator's peak and overshoot, and the
// other tables leave hotset out.
func TestHotsetTables(t *testing.T) {
	var results []bench.Result
	for _, tc := range []struct {
		impl string
		peak int64
	}{{"epcache", 1000}, {"otter", 1327}, {"pool", 36968}} {
		results = append(results, bench.Result{
			Spec: bench.Spec{Workload: "hotset", Impl: tc.impl, Keys: "uint64", Dist: "zipf", Zipf: 1.01, Peers: 100_000,
				Goroutines: 64, Procs: 2, Cap: 1000, Cost: "sleep:100us"},
			NsPerOp: 1000, OpsPerSec: 1e6, HitRatio: 0.5, PeakLive: tc.peak,
		})
	}
	doc := hotsetTables(results)
	for _, want := range []string{
		"**Hotset/keys=uint64/dist=zipf/s=1.01/peers=100000/goroutines=64/cap=1000/cost=sleep:100us** (GOMAXPROCS=2, cap 1000",
		"| epcache | 1.00 M | 1.00 | 50.0% | 0 | 1000 | +0 | 0 |",
		"| otter | 1.00 M | 1.00 | 50.0% | 0 | 1327 | +327 | 0 |",
		"| pool | 1.00 M | 1.00 | 50.0% | 0 | 36968 | +35968 | 0 |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("hotset tables lack %q:\n%s", want, doc)
		}
	}
	if other := tables(results); other != "" {
		t.Errorf("tables = %q; want hotset left to hotsetTables", other)
	}
}

// A workload that creates nothing while it measures (hit; mixed at 100%
// reads; its fill before is free) shows no creation cost; one that
// creates shows the cost model and the measured mean.
func TestCreationCostOnlyWhereCreated(t *testing.T) {
	r := func(workload string, reads, churn float64, mean time.Duration) bench.Result {
		return bench.Result{Spec: bench.Spec{Workload: workload, Impl: "epcache", Keys: "uint64", Dist: "uniform", Peers: 1024,
			Goroutines: 2, Procs: 2, Cost: "sleep:1ms", Reads: reads, Churn: churn}, NsPerOp: 10, MeanCreate: mean}
	}
	doc := tables([]bench.Result{
		r("hit", 0, 0, 33), r("mixed", 1, 0, 33), r("churn", 0, 0.01, 1100*time.Microsecond), r("mixed", 0.99, 0, 1050*time.Microsecond),
	})
	for _, want := range []string{
		"**Hit/keys=uint64/dist=uniform/peers=1024/goroutines=2** (GOMAXPROCS=2)\n",
		"**Mixed/keys=uint64/dist=uniform/peers=1024/goroutines=2/reads=100%** (GOMAXPROCS=2)\n",
		"/churn=1%** (GOMAXPROCS=2, creation cost sleep:1ms, measured mean 1.1 ms)",
		"/reads=99%** (GOMAXPROCS=2, creation cost sleep:1ms, measured mean 1.1 ms)",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("tables lack %q:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "33 ns") {
		t.Errorf("a workload that never creates shows a creation cost:\n%s", doc)
	}
}

// The documents link epbench's HTML reports and show the charts that
// exist.
func TestReportLinks(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"epbench/index.html", "epbench/throughput.svg", "epbench/hotset.svg", "epbench-rtt/index.html"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := reports(dir, "results/"), "[the default suite](results/epbench/index.html), [tcpstorm at longer round trips](results/epbench-rtt/index.html)."; !strings.Contains(got, want) {
		t.Errorf("reports = %q; want it to hold %q", got, want)
	}
	got := chartLinks(dir, "results/")
	for _, want := range []string{"![hit: ns per Get per implementation](results/epbench/throughput.svg)", "![hotset: peak live endpoints against the cap](results/epbench/hotset.svg)"} {
		if !strings.Contains(got, want) {
			t.Errorf("chartLinks = %q; want it to hold %q", got, want)
		}
	}
	if strings.Contains(got, "storm.svg") {
		t.Errorf("chartLinks = %q shows a chart that does not exist", got)
	}
	if reports(t.TempDir(), "") != "" {
		t.Error("reports links reports that do not exist")
	}
}
