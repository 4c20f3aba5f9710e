package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBadFlagsAreUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-impl", "redis"},
		{"-workload", "nap"},
		{"-keys", "float"},
		{"-peers", "0"},
		{"-goroutines", "x"},
		{"-procs", "-1"},
		{"-reads", "120%"},
		{"-duration", "0s"},
		{"-cost", "sleep:soon"},
		{"-format", "yaml"},
		{"-suite", "huge"},
		{"-count", "0"},
		{"-churn", "2"},
		{"-margin", "0.5"},
		{"-rtt", "-1ms"},
		{"-rtt", "soon"},
		{"-ctx", "todo"},
		{"-workload", "hit", "-rtt", "1ms"},
		{"-workload", "hotset", "-cap", "0"},
		{"-workload", "hotset", "-zipf", "1"},
		{"-workload", "hotset", "-idle", "-1s"},
		{"-workload", "hit", "-cap", "50"},
		{"-nosuchflag"},
		{"stray"},
	} {
		var stderr bytes.Buffer
		err := run(context.Background(), args, &bytes.Buffer{}, &stderr)
		var ue usageError
		assert.True(t, errors.As(err, &ue), "%v: %v is not a usage error", args, err)
	}
}

// The binary itself exits 2 on a bad flag and says why.
func TestExitStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	bin := filepath.Join(t.TempDir(), "epbench")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(bin, "-impl", "redis")
	stderr, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.ExitCode())
	assert.Contains(t, string(stderr), `-impl "redis": want one of epcache,`)
	assert.NotContains(t, string(stderr), "Workloads:", "a bad flag gets its error, not the whole usage")

	help, err := exec.Command(bin, "-h").CombinedOutput()
	require.NoError(t, err, "-h exits 0")
	for _, f := range []string{"-impl", "-workload", "-peers", "-goroutines", "-procs", "-duration", "-cost", "-seed", "-out", "-format", "-compare"} {
		assert.Contains(t, string(help), "  "+f+" ", "-h documents %s", f)
	}
}

func TestHelp(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, &bytes.Buffer{}, &stderr)
	assert.ErrorIs(t, err, flag.ErrHelp)
	assert.Contains(t, stderr.String(), "Workloads:")
}

func TestSuitesExpand(t *testing.T) {
	for _, suite := range []string{"default", "quick", "full", "ci"} {
		o, err := parseFlags([]string{"-suite", suite}, &bytes.Buffer{})
		require.NoError(t, err)
		specs, err := o.specs()
		require.NoError(t, err, suite)
		seen := map[string]bool{}
		for _, s := range specs {
			seen[s.Workload] = true
			assert.NoError(t, s.Validate())
		}
		if suite != "ci" {
			for _, w := range bench.Workloads {
				assert.True(t, seen[w], "suite %s runs %s", suite, w)
			}
		}
	}
	o, err := parseFlags([]string{"-workload", "storm", "-impl", "epcache,mutex", "-peers", "64,128", "-procs", "1,2"}, &bytes.Buffer{})
	require.NoError(t, err)
	specs, err := o.specs()
	require.NoError(t, err)
	assert.Len(t, specs, 2*2*2*2, "workload × keys × peers × procs × impls")
	for _, s := range specs {
		assert.Equal(t, 64, s.Goroutines, "storms default to 64 goroutines")
	}
	o, err = parseFlags([]string{"-workload", "tcpstorm,hit", "-impl", "epcache", "-keys", "uint64", "-rtt", "0,1ms", "-ctx", "background,cancel"}, &bytes.Buffer{})
	require.NoError(t, err)
	specs, err = o.specs()
	require.NoError(t, err)
	var names []string
	for _, s := range specs {
		names = append(names, s.Name())
	}
	assert.ElementsMatch(t, []string{
		"Tcpstorm/impl=epcache/keys=uint64/peers=1024/goroutines=8/rtt=0s",
		"Tcpstorm/impl=epcache/keys=uint64/peers=1024/goroutines=8/rtt=1ms",
		"Tcpstorm/impl=epcache/keys=uint64/peers=1024/goroutines=8/rtt=0s/ctx=cancel",
		"Tcpstorm/impl=epcache/keys=uint64/peers=1024/goroutines=8/rtt=1ms/ctx=cancel",
		"Hit/impl=epcache/keys=uint64/dist=uniform/peers=1024/goroutines=2/ctx=cancel",
		"Hit/impl=epcache/keys=uint64/dist=uniform/peers=1024/goroutines=2",
	}, names, "-rtt applies to the meshes only; -ctx to every workload")
	// hotset takes its own defaults where the flags give none.
	o, err = parseFlags([]string{"-workload", "hotset", "-impl", "epcache,otter", "-keys", "uint64"}, &bytes.Buffer{})
	require.NoError(t, err)
	specs, err = o.specs()
	require.NoError(t, err)
	names = nil
	for _, s := range specs {
		names = append(names, s.Name())
	}
	assert.Equal(t, []string{
		"Hotset/impl=epcache/keys=uint64/dist=zipf/s=1.01/peers=100000/goroutines=64/cap=1000/idle=100ms/cost=sleep:100us",
		"Hotset/impl=otter/keys=uint64/dist=zipf/s=1.01/peers=100000/goroutines=64/cap=1000/idle=100ms/cost=sleep:100us",
	}, names)
	o, err = parseFlags([]string{"-workload", "hotset", "-impl", "epcache", "-keys", "uint64", "-peers", "5000", "-cap", "50,100",
		"-zipf", "1.2", "-idle", "0", "-cost", "none", "-dist", "uniform"}, &bytes.Buffer{})
	require.NoError(t, err)
	specs, err = o.specs()
	require.NoError(t, err)
	names = nil
	for _, s := range specs {
		names = append(names, s.Name())
	}
	assert.Equal(t, []string{
		"Hotset/impl=epcache/keys=uint64/dist=uniform/peers=5000/goroutines=64/cap=50/cost=none",
		"Hotset/impl=epcache/keys=uint64/dist=uniform/peers=5000/goroutines=64/cap=100/cost=none",
	}, names)
	o, err = parseFlags([]string{"-workload", "hit", "-keys", "string", "-impl", "array"}, &bytes.Buffer{})
	require.NoError(t, err)
	specs, err = o.specs()
	require.NoError(t, err, "array with string keys is skipped at run time, not refused")
	assert.Len(t, specs, 1)
}

// A small custom run end to end: every output format, and the files -out
// writes.
func TestRunWritesEveryFormat(t *testing.T) {
	dir := t.TempDir()
	args := []string{"-workload", "hit,storm", "-impl", "epcache,syncmap,array", "-keys", "uint64,string",
		"-peers", "64", "-duration", "20ms", "-cost", "sleep:100us", "-out", dir}
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(context.Background(), append(args, "-format", "json"), &stdout, &stderr), stderr.String())
	var results []bench.Result
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &results))
	assert.Len(t, results, 2*3*2-2, "array skips string keys")
	for _, r := range results {
		assert.Empty(t, r.Failure)
	}
	for _, name := range []string{"results.json", "results.csv", "results.txt", "results.table",
		"throughput.svg", "throughput.png", "storm.svg", "storm.png", "latency.svg", "latency.png", "index.html"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if assert.NoError(t, err, name) {
			assert.Positive(t, fi.Size(), name)
		}
	}
	rows, err := csv.NewReader(mustOpen(t, filepath.Join(dir, "results.csv"))).ReadAll()
	require.NoError(t, err)
	assert.Len(t, rows, len(results)+1)
	assert.Equal(t, csvHeader, rows[0])
	txt, err := os.ReadFile(filepath.Join(dir, "results.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(txt), "BenchmarkStorm/impl=epcache/keys=uint64/peers=64/goroutines=64/cost=sleep:100us-")
	assert.Contains(t, string(txt), " ns/op")
	table, err := os.ReadFile(filepath.Join(dir, "results.table"))
	require.NoError(t, err)
	assert.Contains(t, string(table), "×epcache")
}

func mustOpen(t *testing.T, path string) *os.File {
	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

func result(workload, impl string, ns float64) bench.Result {
	return bench.Result{Spec: bench.Spec{Workload: workload, Impl: impl, Keys: "uint64", Dist: "uniform", Peers: 1024, Goroutines: 64, Procs: 2, Cost: "sleep:1ms"}, NsPerOp: ns}
}

// baselineFile writes results as a baseline file for -compare and returns
// its path.
func baselineFile(t *testing.T, results []bench.Result) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "baseline.json")
	data, err := json.Marshal(results)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path
}

func TestCompare(t *testing.T) {
	base := []bench.Result{result("hit", "epcache", 3), result("hit", "syncmap", 6), result("storm", "epcache", 20e6), result("storm", "mutex", 1.2e9)}
	path := baselineFile(t, base)

	var out bytes.Buffer
	same := []bench.Result{result("hit", "epcache", 30), result("hit", "syncmap", 55), result("storm", "epcache", 25e6), result("storm", "mutex", 1.1e9)}
	require.NoError(t, compare(&out, path, same, 2), "a slower machine keeps the ratios")
	assert.Contains(t, out.String(), "epcache÷syncmap")
	assert.Contains(t, out.String(), "0.500")

	worse := []bench.Result{result("hit", "epcache", 12), result("hit", "syncmap", 6), result("storm", "epcache", 20e6), result("storm", "mutex", 1.2e9)}
	err := compare(&bytes.Buffer{}, path, worse, 2)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "epcache÷syncmap")
	assert.NotContains(t, err.Error(), "epcache÷mutex", "the storm ratio did not move")

	err = compare(&bytes.Buffer{}, path, []bench.Result{result("churn", "epcache", 1)}, 2)
	assert.ErrorContains(t, err, "no run of epcache and a reference comparator is in both")
	assert.ErrorContains(t, compare(&bytes.Buffer{}, filepath.Join(t.TempDir(), "none.json"), same, 2), "no such file")
}

// TestCompareWidensTheLimitOfASwingingWorkload: hotset's ratio may be up
// to 4× the baseline's (its swing, 2, times the margin); other workloads
// keep the margin.
func TestCompareWidensTheLimitOfASwingingWorkload(t *testing.T) {
	path := baselineFile(t, []bench.Result{result("hotset", "epcache", 1), result("hotset", "otter", 2), result("hit", "epcache", 3), result("hit", "syncmap", 6)})
	var out bytes.Buffer
	require.NoError(t, compare(&out, path, []bench.Result{result("hotset", "epcache", 3), result("hotset", "otter", 2), result("hit", "epcache", 3), result("hit", "syncmap", 6)}, 2),
		"3x the baseline's ratio is within hotset's limit")
	assert.Contains(t, out.String(), "limit (×2; hotset ×4)")
	assert.Contains(t, out.String(), "2.000", "hotset's limit: 0.5 × 4")

	err := compare(&bytes.Buffer{}, path, []bench.Result{result("hotset", "epcache", 4.2), result("hotset", "otter", 2), result("hit", "epcache", 3), result("hit", "syncmap", 6)}, 2)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Hotset/")

	err = compare(&bytes.Buffer{}, path, []bench.Result{result("hotset", "epcache", 1), result("hotset", "otter", 2), result("hit", "epcache", 7), result("hit", "syncmap", 6)}, 2)
	require.Error(t, err, "hit keeps the margin of 2")
	assert.Contains(t, err.Error(), "Hit/")
	assert.NotContains(t, err.Error(), "Hotset/")
}

// -compare holds epcache's hotset hit ratio to within 2 points of otter's in
// this run, whatever the baseline's: a point and a half below passes, two
// and a half fails, and its spec is one that -recheck runs again.
func TestCompareChecksHitRatios(t *testing.T) {
	hot := func(impl string, ns, hits float64) bench.Result {
		r := result("hotset", impl, ns)
		r.HitRatio = hits
		return r
	}
	path := baselineFile(t, []bench.Result{hot("epcache", 1, 0.6), hot("otter", 2, 0.6)})
	var out bytes.Buffer
	require.NoError(t, compare(&out, path, []bench.Result{hot("epcache", 1, 0.595), hot("epcache", 1, 0.60), hot("epcache", 1, 0.45), hot("otter", 2, 0.61)}, 2),
		"the median, 59.5%%, is 1.5 points below otter's")
	assert.Contains(t, out.String(), "hit ratio, epcache and reference (at most 2 points below)")
	assert.Regexp(t, `Hotset/impl=epcache÷otter/\S+ procs=2 +59\.5% +61\.0% +ok`, out.String())

	current := []bench.Result{hot("epcache", 1, 0.59), hot("otter", 2, 0.615)}
	out.Reset()
	err := compare(&out, path, current, 2)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "hit ratios more than 2 points below the reference's: Hotset/impl=epcache÷otter/")
	assert.Contains(t, err.Error(), "59.0% against 61.5%")
	assert.NotContains(t, err.Error(), "ratios worse than the baseline", "the speed ratio is the baseline's")
	assert.Contains(t, out.String(), "LOW")

	c, err := loadComparison(path, current, 2, false)
	require.NoError(t, err)
	assert.Len(t, c.worseSpecs([]bench.Spec{current[0].Spec}), 1, "a low hit ratio is rechecked")
}

// TestRecheck runs epbench against a baseline that one of its two specs
// cannot meet: that spec's implementations run -recheck more times, the
// other spec's do not, and the ratio that is still worse fails the run.
func TestRecheck(t *testing.T) {
	args := []string{"-workload", "hit", "-impl", "epcache,syncmap", "-keys", "uint64", "-peers", "64", "-procs", "1,2", "-duration", "10ms", "-format", "json"}
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(context.Background(), args, &stdout, &stderr), stderr.String())
	var base []bench.Result
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &base))
	require.Len(t, base, 4)
	for i := range base {
		if base[i].Impl != "epcache" {
			continue
		}
		if base[i].Procs == 1 {
			base[i].NsPerOp *= 1e-6 // a ratio no run can hold to
		} else {
			base[i].NsPerOp *= 1e6 // a ratio no run can miss, however busy the machine
		}
	}
	path := baselineFile(t, base)

	// runs counts the runs of every implementation at each GOMAXPROCS.
	runs := func(recheck string) (map[int]map[string]int, string, error) {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append(args, "-compare", path, "-recheck", recheck), &stdout, &stderr)
		var results []bench.Result
		dec := json.NewDecoder(&stdout)
		require.NoError(t, dec.Decode(&results))
		n := map[int]map[string]int{1: {}, 2: {}}
		seeds := map[string]bool{}
		for _, r := range results {
			n[r.Procs][r.Impl]++
			key := fmt.Sprint(r.Procs, r.Impl, r.Seed)
			assert.False(t, seeds[key], "%s ran twice with seed %d", r.Impl, r.Seed)
			seeds[key] = true
		}
		rest, _ := io.ReadAll(io.MultiReader(dec.Buffered(), &stdout))
		return n, string(rest), err
	}

	n, table, err := runs("2")
	require.Error(t, err, "a regression stays worse however often it runs")
	assert.ErrorContains(t, err, "procs=1")
	assert.NotContains(t, err.Error(), "procs=2")
	assert.Equal(t, map[string]int{"epcache": 3, "syncmap": 3}, n[1], "the worse spec ran twice more")
	assert.Equal(t, map[string]int{"epcache": 1, "syncmap": 1}, n[2], "the spec that held ran once")
	assert.Contains(t, table, "ran 2 more times")

	n, table, err = runs("0")
	require.Error(t, err)
	assert.Equal(t, map[string]int{"epcache": 1, "syncmap": 1}, n[1], "-recheck 0 judges the first run")
	assert.NotContains(t, table, "more times")
}

// TestCompareJudgesByMediansOfAllRuns: a ratio worse in one run, whose
// rechecks hold, passes on the medians of all the runs; the spec whose
// ratio held is not among those run again.
func TestCompareJudgesByMediansOfAllRuns(t *testing.T) {
	base := []bench.Result{result("hit", "epcache", 3), result("hit", "syncmap", 6), result("storm", "epcache", 20e6), result("storm", "mutex", 1.2e9)}
	path := baselineFile(t, base)

	first := []bench.Result{result("hit", "epcache", 15), result("hit", "syncmap", 6), result("storm", "epcache", 20e6), result("storm", "mutex", 1.2e9)}
	c, err := loadComparison(path, first, 2, false)
	require.NoError(t, err)
	again := c.worseSpecs([]bench.Spec{first[0].Spec, first[1].Spec, first[2].Spec, first[3].Spec})
	require.Len(t, again, 2, "only the hit spec's implementations run again")
	for _, s := range again {
		assert.Equal(t, "hit", s.Workload)
	}
	var out bytes.Buffer
	c.rechecks = 2
	require.Error(t, c.write(&out), "one slow run alone fails")

	rechecked := append(slices.Clone(first), result("hit", "epcache", 3.1), result("hit", "syncmap", 6.2), result("hit", "epcache", 2.9), result("hit", "syncmap", 5.8))
	c, err = loadComparison(path, rechecked, 2, false)
	require.NoError(t, err)
	c.rechecks = 2
	out.Reset()
	require.NoError(t, c.write(&out), "the medians of all three runs hold")
	assert.Contains(t, out.String(), "ran 2 more times")
	// The note stands apart from the table, whose headings stay over
	// their columns.
	lines := strings.Split(out.String(), "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "epcache ÷ reference") })
	require.Greater(t, i, 0, out.String())
	assert.Contains(t, lines[i-1], "more times")
	row := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "Hit/") })
	require.Greater(t, row, i, out.String())
	assert.Equal(t, strings.Index(lines[i], "baseline"), strings.Index(lines[row], "0.500"), "the baseline column under its heading:\n%s", out.String())

	// Two runs: the median is their mean, not the slower one.
	assert.InDelta(t, 4.5, median([]float64{6, 3}), 1e-12)
	assert.InDelta(t, 3, median([]float64{9, 3, 2}), 1e-12)
	assert.Zero(t, median(nil))
}

func TestTableFormatting(t *testing.T) {
	r := result("storm", "epcache", 0)
	r.Completion = 12 * time.Millisecond
	r.Failure = "leaked 3 endpoints"
	var out bytes.Buffer
	require.NoError(t, writeTable(&out, []bench.Result{r}))
	assert.Contains(t, out.String(), "12.0ms")
	assert.True(t, strings.Contains(out.String(), "FAIL: leaked 3 endpoints"))

	// hotset: every comparator's peak and overshoot past the cap.
	var hot []bench.Result
	for _, tc := range []struct {
		impl  string
		peak  int64
		inUse uint64
	}{{"epcache", 1000, 0}, {"otter", 1327, 12437}} {
		r := result("hotset", tc.impl, 1200)
		r.Dist, r.Zipf, r.Peers, r.Cap, r.Cost = "zipf", 1.01, 100_000, 1000, "sleep:100us"
		r.HitRatio, r.PeakLive, r.ReleasedInUse = 0.6037, tc.peak, tc.inUse
		hot = append(hot, r)
	}
	out.Reset()
	require.NoError(t, writeTable(&out, hot))
	for _, want := range []string{"peak live", "overshoot", "in-use releases", "60.37%", "1327", "+327", "12437", "+0"} {
		assert.Contains(t, out.String(), want)
	}
}

// -compare holds epcache's two-core time over its one-core time on a hot
// peer's leases to the baseline's, beside the ratios against comparators,
// and a spec of a worse one is one -recheck runs again, at both core counts.
func TestCompareHoldsTheHotPeerLeaseScaling(t *testing.T) {
	hot := func(impl string, procs int, ns float64) bench.Result {
		r := result("lease", impl, ns)
		r.Peers, r.Procs, r.Goroutines, r.Cost = 1, procs, procs, "none"
		if procs > 1 {
			r.SpinRatio = 1.9 // a second core free: the ratios are judged
		}
		return r
	}
	path := baselineFile(t, []bench.Result{hot("epcache", 1, 16), hot("epcache", 2, 9), hot("pool", 1, 30), hot("pool", 2, 45)})
	var out bytes.Buffer
	now := []bench.Result{hot("epcache", 1, 32), hot("epcache", 2, 20), hot("pool", 1, 60), hot("pool", 2, 90)}
	require.NoError(t, compare(&out, path, now, 2), "a slower machine keeps the scaling")
	assert.Regexp(t, `Lease/impl=epcache/\S+ procs=2÷1 +0\.562 +0\.625`, out.String())

	// A lease whose cores write one line: two cores 1.9x one (the limit,
	// with the hot peer's swing, is 1.69).
	worse := []bench.Result{hot("epcache", 1, 16), hot("epcache", 2, 30), hot("pool", 1, 30), hot("pool", 2, 45)}
	c, err := loadComparison(path, worse, 2, false)
	require.NoError(t, err)
	err = c.write(&bytes.Buffer{})
	require.Error(t, err, "two cores slower than one, where the baseline's were faster")
	assert.Contains(t, err.Error(), "procs=2÷1: 1.875, baseline 0.562")
	var rerun []string
	for _, s := range c.worseSpecs([]bench.Spec{worse[0].Spec, worse[1].Spec, worse[2].Spec}) {
		rerun = append(rerun, fmt.Sprintf("%s@%d", s.Impl, s.Procs))
	}
	assert.ElementsMatch(t, []string{"epcache@1", "epcache@2"}, rerun, "-recheck runs epcache's hot-peer leases again at both core counts")
}
