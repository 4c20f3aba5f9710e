package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
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

// Whether a second core is free is decided from the spin probes alone: at
// or above 1.6 in every probe; any probe below, or none at all, and it is
// not.
func TestFreeCoresAreJudgedByTheLowestProbe(t *testing.T) {
	probe := func(spins ...float64) freeCores {
		var rs []bench.Result
		for _, x := range spins {
			r := result("lease", "epcache", 10)
			r.Peers, r.Procs, r.Goroutines, r.SpinRatio = 1, 2, 2, x
			rs = append(rs, r)
		}
		// A run that needs no second core is not a probe.
		rs = append(rs, result("hit", "epcache", 3))
		return probedCores(rs)
	}
	for _, tc := range []struct {
		spins []float64
		free  bool
	}{
		{[]float64{1.95, 1.9, 1.6}, true},
		{[]float64{1.95, 1.59, 2}, false},
		{[]float64{1.2}, false},
		{nil, false},
	} {
		f := probe(tc.spins...)
		assert.Equal(t, tc.free, f.free(), "%v", tc.spins)
		assert.Equal(t, len(tc.spins), f.probes)
	}
	assert.Equal(t, "two spinning goroutines at GOMAXPROCS 2 reached 1.23× their 1-core rate (the lowest of 3 probes, one just before each run of those ratios), below the 1.6× that shows a second core free",
		freeCores{probes: 3, lowest: 1.234}.why())
	assert.Equal(t, "no run measured whether a second core was free", freeCores{}.why())

	assert.True(t, needsFreeCore(bench.Spec{Workload: "lease", Peers: 1, Procs: 2}), "the hot peer at two cores")
	assert.False(t, needsFreeCore(bench.Spec{Workload: "lease", Peers: 1, Procs: 1}), "the hot peer at one core")
	assert.False(t, needsFreeCore(bench.Spec{Workload: "lease", Peers: 128, Procs: 2}), "leases of many peers")
	assert.False(t, needsFreeCore(bench.Spec{Workload: "hotset", Peers: 1, Procs: 2}))
}

// The ratios of the hot peer's leases at two cores are judged when the
// probes saw a second core free, and skipped, with the reason, when they
// did not: a ratio past its limit then fails nothing and is not run again.
func TestCompareSkipsTheTwoCoreRatiosWithoutAFreeCore(t *testing.T) {
	hot := func(impl string, procs int, ns, spin float64) bench.Result {
		r := result("lease", impl, ns)
		r.Peers, r.Procs, r.Goroutines, r.Cost = 1, procs, procs, "none"
		if procs > 1 {
			r.SpinRatio = spin
		}
		return r
	}
	base := []bench.Result{hot("epcache", 1, 16, 0), hot("epcache", 2, 9, 1.9), hot("pool", 1, 30, 0), hot("pool", 2, 45, 1.9)}
	path := baselineFile(t, base)
	// Two cores nearly as slow as one, and epcache's lease against the
	// pool's past its limit: what a busy machine gives.
	busy := func(spin float64) []bench.Result {
		return []bench.Result{hot("epcache", 1, 16, 0), hot("epcache", 2, 15, spin), hot("pool", 1, 30, 0), hot("pool", 2, 20, spin)}
	}

	var out bytes.Buffer
	c, err := loadComparison(path, busy(1.25), 2, false)
	require.NoError(t, err)
	require.NoError(t, c.write(&out), "not judged without a free core")
	assert.Regexp(t, `Lease/impl=epcache÷pool/\S+ procs=2 +0\.200 +0\.750 +0\.600 +skipped: no second core free`, out.String())
	assert.Regexp(t, `Lease/impl=epcache/\S+ procs=2÷1 +0\.562 +0\.938 +1\.688 +skipped: no second core free`, out.String())
	assert.Regexp(t, `Lease/impl=epcache÷pool/\S+ procs=1 +0\.533 +0\.533 +1\.067 +ok`, out.String(), "one core is judged")
	assert.Contains(t, out.String(), "skipped the ratios that need a second core free (Lease/impl=epcache/")
	assert.Contains(t, out.String(), "reached 1.25× their 1-core rate (the lowest of 2 probes")
	assert.Empty(t, c.worseSpecs(specsOf(busy(1.25))), "a skipped ratio is not run again")

	c, err = loadComparison(path, busy(1.8), 2, false)
	require.NoError(t, err)
	err = c.write(&bytes.Buffer{})
	require.Error(t, err, "judged with a free core")
	assert.ErrorContains(t, err, "Lease/impl=epcache÷pool/")
	assert.NotEmpty(t, c.worseSpecs(specsOf(busy(1.8))))

	// A baseline's runs whose probe found no free core are not in its
	// ratios: a busy baseline would loosen every later limit.
	path = baselineFile(t, append(slices.Clone(base), hot("epcache", 2, 15, 1.1), hot("epcache", 2, 15, 1.2), hot("pool", 2, 20, 1.0)))
	c, err = loadComparison(path, busy(1.9), 2, false)
	require.NoError(t, err)
	out.Reset()
	require.Error(t, c.write(&out), "held to the baseline's free-core runs, 0.200")
	assert.Regexp(t, `Lease/impl=epcache÷pool/\S+ procs=2 +0\.200 +0\.750 +0\.600 +WORSE`, out.String())
	assert.Contains(t, out.String(), "leave out its 3 runs whose probe found none")
}

func specsOf(rs []bench.Result) []bench.Spec {
	var out []bench.Spec
	for _, r := range rs {
		out = append(out, r.Spec)
	}
	return out
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
	for _, r := range rs {
		assert.Nil(t, r.CDF, "no latency distribution in a pair's run")
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

// spinRatio gives GOMAXPROCS back as it found it. (What ratio it measures
// is the machine's: no test judges it.)
func TestSpinRatioRestoresGOMAXPROCS(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	assert.Positive(t, spinRatio(2, 5*time.Millisecond))
	assert.Equal(t, before, runtime.GOMAXPROCS(0))
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

// A baseline measured on another machine is refused, naming both machines
// and the way to a baseline of this one: its ratios are that hardware's
// (one "AMD EPYC" gave the same code another epcache ÷ otter CPU ratio
// than the next). -any-machine compares anyway; a baseline or a run that
// names no machine (one written before they did) is compared as before.
func TestCompareRefusesABaselineOfAnotherMachine(t *testing.T) {
	suite := []bench.Result{result("hit", "epcache", 3), result("hit", "syncmap", 6)}
	runs := append(suite, pairResults(1, 0.8)...)
	path := baselineFile(t, on("AMD EPYC (family 25, model 1), 2 CPUs, linux/amd64", runs))

	var out bytes.Buffer
	_, err := loadComparison(path, on("AMD EPYC (family 26, model 2), 2 CPUs, linux/amd64", runs), 2, false)
	require.NoError(t, err, "the comparison is made; its verdict refuses it")
	c, _ := loadComparison(path, on("AMD EPYC (family 26, model 2), 2 CPUs, linux/amd64", runs), 2, false)
	err = c.write(&out)
	require.Error(t, err)
	assert.ErrorContains(t, err, "was measured on another machine (AMD EPYC (family 25, model 1), 2 CPUs, linux/amd64; this one is AMD EPYC (family 26, model 2), 2 CPUs, linux/amd64)")
	assert.ErrorContains(t, err, "make baseline")
	assert.Contains(t, out.String(), "the baseline was measured on AMD EPYC (family 25, model 1)")

	out.Reset()
	c, err = loadComparison(path, on("AMD EPYC (family 26, model 2), 2 CPUs, linux/amd64", runs), 2, true)
	require.NoError(t, err)
	require.NoError(t, c.write(&out), "-any-machine compares anyway")
	assert.Contains(t, out.String(), "the baseline was measured on", "and still says so")

	out.Reset()
	require.NoError(t, compare(&out, path, runs, 2), "a run that names no machine")
	same := on("AMD EPYC (family 25, model 1), 2 CPUs, linux/amd64", runs)
	require.NoError(t, compare(&out, path, same, 2), "the same machine")
	require.NoError(t, compare(&out, baselineFile(t, runs), same, 2), "a baseline that names no machine")
	assert.NotEmpty(t, bench.Machine())
}

// A baseline holds the runs of several machines (make baseline keeps the
// others' with -keep): a run is compared with its own machine's, else
// with those that name no machine, and only else refused.
func TestCompareChoosesTheRunsOfItsMachine(t *testing.T) {
	suite := []bench.Result{result("hit", "epcache", 3), result("hit", "syncmap", 6)}
	slow := append(slices.Clone(suite), pairResults(1, 1.3)...) // the other machine's CPU figure
	fast := append(slices.Clone(suite), pairResults(1, 1.0)...)
	both := slices.Concat(on("A", slow), on("B", fast))
	path := baselineFile(t, both)
	var out bytes.Buffer
	require.NoError(t, compare(&out, path, on("A", slow), 2), "A's run against A's runs")
	err := compare(&out, path, on("B", slow), 2)
	require.Error(t, err, "B's run of 1.3 against B's 1.0")
	assert.ErrorContains(t, err, "CPU figures worse than the baseline")
	assert.NotContains(t, err.Error(), "another machine")

	legacy := baselineFile(t, slices.Concat(slow, on("B", fast)))
	require.NoError(t, compare(&out, legacy, on("C", slow), 2), "C has no runs: those that name no machine")
	err = compare(&out, baselineFile(t, on("B", fast)), on("C", fast), 2)
	assert.ErrorContains(t, err, "another machine", "no runs of C, none unnamed")

	// -keep: the others' runs, this machine's left out.
	kept, err := keptRuns(path, "A")
	require.NoError(t, err)
	assert.Equal(t, on("B", fast), kept)
	kept, err = keptRuns(filepath.Join(t.TempDir(), "none.json"), "A")
	require.NoError(t, err)
	assert.Empty(t, kept)
}

// on returns copies of rs measured on machine.
func on(machine string, rs []bench.Result) []bench.Result {
	rs = slices.Clone(rs)
	for i := range rs {
		rs[i].Machine = machine
	}
	return rs
}
