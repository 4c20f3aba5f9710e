package main

import (
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
	doc := targets(results, map[string]float64{
		"epcache/uint64/1024/2": 3, "xsync4/uint64/1024/2": 2.7,
		"lease/epcache/2": 7, "lease/epcache-get/2": 4,
	})
	for _, want := range []string{
		"| tcpstorm P=32 G=8 rtt 5ms: epcache ÷ array ≤ 1.10 | 1.053 | yes |",
		"| tcpstorm P=32 G=8 rtt 5ms: epcache ÷ mutex ≤ 0.50 | 0.211 | yes |",
		"| hit, uint64 keys, 1024 peers, GOMAXPROCS 2 (go test): epcache ÷ xsync v4 ≤ 0.90 | 1.111 | **no** |",
		"| tcpstorm P=32 G=8 rtt 0s: epcache ÷ array ≤ 1.10 | not run | - |",
		"| leaked = 0 in every run (5 runs) | 0 runs leaked | yes |",
		"| lease, uint64 keys, 1024 peers, GOMAXPROCS 2 (go test): Acquire+Release ÷ Get ≤ 2.00 | 1.750 | yes |",
		"| lease, uint64 keys, 1024 peers, GOMAXPROCS 1 (go test): Acquire+Release ÷ Get ≤ 2.00 | not run | - |",
		"| lease 1% invalidated: epcache ÷ pool ≤ 0.50 | 0.600 | **no** |",
		"| released while leased = 0 in every run | 1 runs did | **no** |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("targets lack %q:\n%s", want, doc)
		}
	}
}
