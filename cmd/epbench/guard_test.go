package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pairResults returns the halves of one pair per ratio given: epcache's
// CPU per operation is the ratio times the reference's, 100 ns, on
// hotset at GOMAXPROCS 1.
func pairResults(first int, ratios ...float64) []bench.Result {
	var out []bench.Result
	for i, x := range ratios {
		for impl, cpu := range map[string]float64{"epcache": 100 * x, "otter": 100} {
			r := result("hotset", impl, 1000) // ns/op says nothing here
			r.Procs, r.Pair, r.CPUPerOp = 1, first+i, cpu
			out = append(out, r)
		}
	}
	return out
}

// A CPU figure is the median of its pairs' ratios, each pair's epcache
// over its own reference: a pair that came out far off either way (a
// burst of other work on one half) moves it no more than any other.
func TestCPUFigureIsTheMedianOfItsPairs(t *testing.T) {
	cs := cpuRatios(pairResults(1, 0.7, 0.71, 5, 0.69, 0.1))
	require.Len(t, cs, 1)
	assert.Regexp(t, `^Hotset/impl=epcache÷otter/.* procs=1$`, cs[0].name)
	assert.InDelta(t, 0.7, cs[0].median, 1e-9)
	assert.Len(t, cs[0].pairs, 5)

	// A pair whose reference half is missing is no pair.
	rs := pairResults(1, 0.7, 0.8)
	cs = cpuRatios(rs[:3])
	require.Len(t, cs, 1)
	assert.Len(t, cs[0].pairs, 1)

	lo, hi := quartiles([]float64{4, 1, 3, 2})
	assert.Equal(t, [2]float64{1.5, 3.5}, [2]float64{lo, hi})
	lo, hi = quartiles([]float64{5, 1, 3, 2, 4})
	assert.Equal(t, [2]float64{2, 4}, [2]float64{lo, hi})
}

// -compare holds a CPU figure to 1.15 times the baseline's, whatever
// -margin allows the ratios of throughput: 1.14 times passes, 1.16 fails.
// The pairs' runs are not among the ratios of throughput.
func TestCompareHoldsCPUFiguresToTheirLimit(t *testing.T) {
	suite := []bench.Result{result("hit", "epcache", 3), result("hit", "syncmap", 6)}
	path := baselineFile(t, append(suite, pairResults(1, 0.79, 0.8, 0.81)...))

	var out bytes.Buffer
	now := append(suite, pairResults(1, 0.912, 0.95, 0.9)...)
	require.NoError(t, compare(&out, path, now, 2))
	assert.Regexp(t, `CPU per operation at GOMAXPROCS 1, epcache ÷ reference, median of interleaved pairs +baseline +now +limit \(×1\.15\) +pairs \(quartiles\)`, out.String())
	assert.Regexp(t, `Hotset/impl=epcache÷otter/\S+ procs=1 +0\.800 +0\.912 +0\.920 +3 \(0\.906–0\.931\) +ok`, out.String())
	assert.Equal(t, 1, strings.Count(out.String(), "Hotset/"), "the pairs' runs are in no ratio of throughput")

	out.Reset()
	err := compare(&out, path, append(suite, pairResults(1, 0.93, 0.95, 0.9)...), 2)
	require.Error(t, err)
	assert.ErrorContains(t, err, "CPU figures worse than the baseline past their limit (1.15×): Hotset/impl=epcache÷otter/")
	assert.ErrorContains(t, err, ": 0.930, baseline 0.800")
	assert.Contains(t, out.String(), "WORSE")
}

// A baseline without the CPU figures a run has (one written before them)
// fails the comparison with the way to a new one, rather than passing a
// run that nothing held.
func TestCompareFailsWhereTheBaselineLacksACPUFigure(t *testing.T) {
	suite := []bench.Result{result("hit", "epcache", 3), result("hit", "syncmap", 6)}
	path := baselineFile(t, suite)
	var out bytes.Buffer
	err := compare(&out, path, append(suite, pairResults(1, 0.8)...), 2)
	require.Error(t, err)
	assert.ErrorContains(t, err, "lacks (make baseline writes them): Hotset/impl=epcache÷otter/")
	assert.Regexp(t, `Hotset/impl=epcache÷otter/\S+ procs=1 +- +0\.800 +- +1 +not in the baseline`, out.String())
}

// runPairs runs epcache and then each figure's reference, pair after pair,
// every figure in each pair, all with the figure's seed, and numbers the
// pairs from 1.
func TestRunPairsInterleaves(t *testing.T) {
	figs := []bench.Spec{
		{Workload: "hit", Keys: "uint64", Dist: "uniform", Peers: 64, Goroutines: 1, Procs: 1, Duration: 5 * time.Millisecond, Cost: "none", Seed: 7},
		{Workload: "storm", Keys: "uint64", Dist: "uniform", Peers: 16, Goroutines: 4, Procs: 1, Cost: "none", Seed: 7},
	}
	rs, err := runPairs(context.Background(), figs, 2)
	require.NoError(t, err)
	var order []string
	for _, r := range rs {
		order = append(order, fmt.Sprintf("%d %s %s", r.Pair, r.Workload, r.Impl))
		assert.EqualValues(t, 7, r.Seed)
		assert.Empty(t, r.Failure)
	}
	assert.Equal(t, []string{
		"1 hit epcache", "1 hit xsync4", "1 storm epcache", "1 storm singleflight",
		"2 hit epcache", "2 hit xsync4", "2 storm epcache", "2 storm singleflight",
	}, order)
	runs, pairs := splitPairs(append(rs, result("hit", "epcache", 3)))
	assert.Len(t, runs, 1)
	assert.Len(t, pairs, 8)
}

// The ci suite's CPU figures: hotset against otter, storm against
// singleflight, the hit path of both key types against xsync4, every one
// at GOMAXPROCS 1; no other suite has any.
func TestCISuiteHasTheCPUFigures(t *testing.T) {
	figs := options{suite: "ci", seed: 1}.cpuFigures()
	var names []string
	for _, f := range figs {
		require.NoError(t, func() error { f.Impl = "epcache"; return f.Validate() }())
		assert.Equal(t, 1, f.Procs)
		names = append(names, f.Workload+"/"+f.Keys+"÷"+cpuReference(f))
	}
	assert.Equal(t, []string{"hotset/uint64÷otter", "storm/uint64÷singleflight", "hit/uint64÷xsync4", "hit/string÷xsync4"}, names)
	assert.Empty(t, options{suite: "default"}.cpuFigures())
}

// Without -compare, the table ends with the CPU figures alone.
func TestWriteCPUFigures(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, writeCPUFigures(&out, pairResults(1, 0.8, 0.9, 1)))
	assert.Regexp(t, `Hotset/impl=epcache÷otter/\S+ procs=1 +0\.900 +3 \(0\.850–0\.950\)`, out.String())
	out.Reset()
	require.NoError(t, writeCPUFigures(&out, nil))
	assert.Empty(t, out.String())
}
