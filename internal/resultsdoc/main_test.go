package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
)

func TestDirectHits(t *testing.T) {
	out := directHits(strings.Join([]string{
		"pkg: github.com/epcache/epcache/shard",
		"BenchmarkHit/impl=epcache/keys=uint64/peers=1024-2  100  9.0 ns/op", // another package
		"pkg: github.com/epcache/epcache/epcache",
		"BenchmarkHit/impl=epcache-load/keys=uint64/peers=1024-2  100  3.1 ns/op",
		"BenchmarkHit/impl=epcache/keys=uint64/peers=1024-2  100  3.0 ns/op",
		"BenchmarkHit/impl=epcache/keys=uint64/peers=1024-2  100  5.0 ns/op",
		"BenchmarkHit/impl=epcache/keys=uint64/peers=1024-2  100  4.0 ns/op",
		"BenchmarkHit/impl=xsync4/keys=string/peers=65536  100  7.5 ns/op",
		"BenchmarkLease/impl=epcache-get-2  100  3.0 ns/op",
		"BenchmarkLease/impl=epcache-get-2  100  4.0 ns/op", // an even count: the mean of the middle two
		"BenchmarkLease/impl=epcache  100  15 ns/op",
		"BenchmarkLease/impl=epcache-get  100  7 ns/op", // -cpu 1: no suffix after the impl's own dash
		"BenchmarkOther/impl=epcache  100  1 ns/op",
	}, "\n"))
	want := map[string]float64{
		"lease/epcache-get/2":        3.5,
		"lease/epcache/1":            15,
		"lease/epcache-get/1":        7,
		"epcache-load/uint64/1024/2": 3.1,
		"epcache/uint64/1024/2":      4.0, // the median of three
		"xsync4/string/65536/1":      7.5, // -cpu 1 has no suffix
	}
	if len(out) != len(want) {
		t.Fatalf("directHits = %v; want %v", out, want)
	}
	for k, v := range want {
		if out[k] != v {
			t.Errorf("directHits[%q] = %v; want %v", k, out[k], v)
		}
	}
}

// The targets table names each target once, with what was measured, and
// says "not run" for what the results lack.
func TestTargets(t *testing.T) {
	r := func(workload, impl string, ns float64, mut func(*bench.Spec)) bench.Result {
		s := bench.Spec{Workload: workload, Impl: impl, Keys: "uint64", Dist: "uniform", Peers: 32, Goroutines: 8, Cost: "none"}
		if mut != nil {
			mut(&s)
		}
		return bench.Result{Spec: s, NsPerOp: ns}
	}
	rtt5 := func(s *bench.Spec) { s.RTT = 5 * time.Millisecond }
	lease := func(s *bench.Spec) { s.Peers, s.Churn = 1024, 0.01 }
	results := []bench.Result{
		r("tcpstorm", "epcache", 40, rtt5), r("tcpstorm", "array", 38, rtt5), r("tcpstorm", "mutex", 190, rtt5),
		r("lease", "epcache", 30, lease), r("lease", "pool", 50, lease),
	}
	results[len(results)-1].ReleasedInUse = 1 // as a pool that closed under a sender would
	hot := func(impl string, ns, hit float64, peak int64, inUse uint64) bench.Result {
		r := r("hotset", impl, ns, func(s *bench.Spec) {
			s.Peers, s.Goroutines, s.Dist, s.Zipf, s.Cap, s.Cost = 100_000, 64, "zipf", 1.01, 1000, "sleep:100us"
		})
		r.HitRatio, r.PeakLive, r.ReleasedInUse = hit, peak, inUse
		return r
	}
	results = append(results, hot("epcache", 1000, 0.59, 1000, 0), hot("otter", 1200, 0.60, 1327, 12), hot("pool", 700, 0.86, 36968, 0))
	doc := targets(results, map[string]float64{
		"epcache/uint64/1024/2": 3, "xsync4/uint64/1024/2": 2.7,
		"lease/epcache/2": 7, "lease/epcache-get/2": 4,
	})
	for _, want := range []string{
		"| tcpstorm P=32 G=8 rtt 5ms: epcache ÷ array ≤ 1.10 | 1.053 | yes |",
		"| tcpstorm P=32 G=8 rtt 5ms: epcache ÷ mutex ≤ 0.50 | 0.211 | yes |",
		"| hit, uint64 keys, 1024 peers, GOMAXPROCS 2 (go test): epcache ÷ xsync v4 ≤ 0.90 | 1.111 | **no** |",
		"| tcpstorm P=32 G=8 rtt 0s: epcache ÷ array ≤ 1.10 | not run | - |",
		"| lease, uint64 keys, 1024 peers, GOMAXPROCS 2 (go test): Acquire+Release ÷ Get ≤ 2.00 | 1.750 | yes |",
		"| lease, uint64 keys, 1024 peers, GOMAXPROCS 1 (go test): Acquire+Release ÷ Get ≤ 2.00 | not run | - |",
		"| lease 1% invalidated: epcache ÷ pool ≤ 0.50 | 0.600 | **no** |",
		"| released while leased = 0 in every run | 1 runs did | **no** |", // the pool's; otter has no lease
		"| leaked = 0 in every run (8 runs) | 0 runs leaked | yes |",
		"| hotset P=100000 cap 1000: epcache peak live ≤ cap | 1000 (overshoot +0) | yes |",
		"| hotset P=100000 cap 1000: epcache released in use = 0 | 0 | yes |",
		"| hotset P=100000 cap 1000: epcache hit ratio ≥ otter's − 2 points | 59.0% (otter 60.0%) | yes |",
		"| hotset P=100000 cap 1000: epcache ÷ otter (ops/s ≥ otter's) ≤ 1.00 | 0.833 | yes |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("targets lack %q:\n%s", want, doc)
		}
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
