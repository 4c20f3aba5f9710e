package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// svgTexts returns the text of every <text> element of an SVG document, in
// document order.
func svgTexts(t *testing.T, svg []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var out []string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err, "the SVG does not parse")
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "text" {
			var s string
			require.NoError(t, dec.DecodeElement(&s, &se))
			out = append(out, strings.TrimSpace(s))
		}
	}
}

// fakeRun is a result as a run of the default suite makes it, numbers
// chosen to span the ranges of results/epbench.
func fakeRun(workload, impl, keys string, procs int, ns float64) bench.Result {
	s := bench.Spec{Workload: workload, Impl: impl, Keys: keys, Dist: "uniform", Peers: 1024, Goroutines: procs, Procs: procs, Cost: "none"}
	r := bench.Result{Spec: s, NsPerOp: ns, OpsPerSec: 1e9 / ns}
	switch workload {
	case "storm":
		r.Goroutines, r.Cost, r.Completion = 64, "sleep:1ms", time.Duration(ns)
		for _, q := range [][2]float64{{0, 30}, {50, 40}, {90, 50}, {99, ns / 20}, {99.9, ns / 2}, {99.99, ns}, {100, ns}} {
			r.CDF = append(r.CDF, bench.Quantile{Percentile: q[0], Latency: time.Duration(q[1])})
		}
	case "lease":
		r.Churn = 0.01
	case "hotset":
		r.Dist, r.Zipf, r.Peers, r.Goroutines, r.Cap, r.Cost = "zipf", 1.01, 100_000, 64, 1000, "sleep:100us"
		r.HitRatio, r.PeakLive = 0.6, int64(ns)
	case "churn":
		r.Churn = 0.05
	}
	return r
}

func suiteResults(procs ...int) []bench.Result {
	var rs []bench.Result
	for _, p := range procs {
		f := float64(p) / 2 // the figures of results/epbench at GOMAXPROCS 2
		for _, keys := range []string{"uint64", "string"} {
			for impl, ns := range map[string]float64{"epcache": 7.6, "xsync4": 6.2, "syncmap": 13, "mutex": 27, "rwmutex": 50, "array": 4} {
				if impl == "array" && keys == "string" {
					continue // array serves integer keys only
				}
				rs = append(rs, fakeRun("hit", impl, keys, p, ns*f))
			}
		}
		for impl, ms := range map[string]float64{"epcache": 22, "xsync3": 38.6, "syncmap": 25.1, "mutex": 1130, "array": 22.2} {
			r := fakeRun("storm", impl, "uint64", p, ms*1e6)
			if impl == "syncmap" {
				r.Duplicates = 84
			}
			rs = append(rs, r)
		}
		for impl, ns := range map[string]float64{"epcache": 36, "pool": 49, "xsync4rc": 61} {
			rs = append(rs, fakeRun("lease", impl, "uint64", p, ns))
		}
		for impl, peak := range map[string]float64{"epcache": 1000, "otter": 1327, "pool": 36968} {
			rs = append(rs, fakeRun("hotset", impl, "uint64", p, peak))
		}
		for impl, ns := range map[string]float64{"epcache": 90, "syncmap": 100} {
			rs = append(rs, fakeRun("churn", impl, "uint64", p, ns))
		}
	}
	slices.SortStableFunc(rs, func(a, b bench.Result) int {
		return slices.Index(bench.Workloads, a.Workload) - slices.Index(bench.Workloads, b.Workload)
	})
	return rs
}

// Each chart's text, read back from its SVG, says what the chart draws:
// the workload and its configuration in the title, what each axis
// measures and in which scale, the implementations that ran and no other;
// numbers in their units, never in e-notation.
func TestChartLabels(t *testing.T) {
	charts, err := buildCharts(suiteResults(2))
	require.NoError(t, err)
	byName := map[string]*chart{}
	for _, c := range charts {
		if c.name != "" {
			byName[c.name] = c
		}
	}
	for _, tc := range []struct {
		name  string
		want  []string // texts the chart must hold
		impls []string // the implementations drawn
		not   []string // texts it must not hold
	}{
		{"throughput", []string{"hit: ns per Get, 1,024 peers, uniform access, 2 goroutines, GOMAXPROCS 2",
			"ns per Get (log scale); shorter is faster", "implementation", "uint64 keys", "string keys",
			"not run: integer keys only", "7.6 ns", "50 ns", "4 ns"},
			[]string{"epcache", "xsync4", "syncmap", "mutex", "rwmutex", "array"},
			[]string{"GOMAXPROCS (one goroutine per P)"}},
		{"storm", []string{"storm: 64 goroutines Get 1,024 peers at once, creation sleep:1ms, GOMAXPROCS 2",
			"time until every goroutine has every peer (log scale); shorter is faster", "22 ms", "1.13 s", "25.1 ms, 84 duplicates",
			"20 ms", "100 ms", "1 s"},
			[]string{"epcache", "xsync3", "syncmap", "mutex", "array"}, nil},
		{"latency", []string{"Get latency (log scale)", "percentile (each step right: ten times rarer)", "99.9"},
			[]string{"epcache", "xsync3", "syncmap", "mutex", "array"}, nil},
		{"lease", []string{"ns per operation; shorter is faster", "36 ns", "61 ns"},
			[]string{"epcache", "pool", "xsync4rc"}, nil},
		{"hotset", []string{"peak live endpoints (log scale)", "cap 1,000", "36,968 (35,968 over the cap)", "1,000"},
			[]string{"epcache", "otter", "pool"}, nil},
		{"hotset-hits", []string{"60%, 1 µs per operation", "100%"},
			[]string{"epcache", "otter", "pool"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := byName[tc.name]
			require.NotNil(t, c, "no %s chart", tc.name)
			var svg bytes.Buffer
			require.NoError(t, c.render(&svg, "svg"))
			texts := svgTexts(t, svg.Bytes())
			joined := strings.Join(texts, "\n")
			for _, w := range tc.want {
				assert.True(t, containsLine(texts, w), "%s lacks %q; it has:\n%s", tc.name, w, joined)
			}
			for _, l := range c.labels() {
				assert.Contains(t, texts, l, "a label the report checks for")
			}
			assert.True(t, strings.HasPrefix(texts[0], c.workload+":"), "the title names the workload: %q", texts[0])
			for _, impl := range bench.ImplNames() {
				assert.Equal(t, slices.Contains(tc.impls, impl), slices.Contains(texts, impl), "%s: implementation %s", tc.name, impl)
			}
			for _, n := range tc.not {
				assert.NotContains(t, joined, n)
			}
			assert.NotRegexp(t, regexp.MustCompile(`\de[+-]\d`), joined, "no e-notation")
			assert.Contains(t, svg.String(), "font-family:'Liberation Sans',Arial", "a font every browser has, failing Liberation")
		})
	}
	// The churn group has no chart of its own: the report draws its
	// headline.
	var churn *chart
	for _, c := range charts {
		if c.workload == "churn" {
			churn = c
		}
	}
	require.NotNil(t, churn)
	assert.Empty(t, churn.name, "in the report only")
	assert.Equal(t, "churn: ns per operation, 1,024 peers, uint64 keys, 2 goroutines, 5% reported failed, GOMAXPROCS 2", churn.title)
}

func containsLine(texts []string, want string) bool {
	for _, t := range texts {
		if t == want || strings.Contains(t, want) {
			return true
		}
	}
	return false
}

// With several GOMAXPROCS values each configuration gets a scaling chart:
// ns/op against GOMAXPROCS, one line per implementation.
func TestScalingCharts(t *testing.T) {
	charts, err := buildCharts(suiteResults(1, 2, 4, 8))
	require.NoError(t, err)
	var names []string
	for _, c := range charts {
		names = append(names, c.name)
	}
	for _, want := range []string{"scaling-hit", "scaling-hit-2", "scaling-storm", "scaling-lease", "scaling-hotset", "scaling-churn"} {
		assert.Contains(t, names, want)
	}
	for _, c := range charts {
		if c.name == "" {
			t.Errorf("chart %q is drawn in the report only: every group has a chart of its own at GOMAXPROCS 1 to 8", c.title)
		}
		if c.name != "scaling-hit" {
			continue
		}
		var svg bytes.Buffer
		require.NoError(t, c.render(&svg, "svg"))
		texts := svgTexts(t, svg.Bytes())
		assert.Equal(t, "hit: ns per Get against GOMAXPROCS, 1,024 peers, uint64 keys, goroutines = GOMAXPROCS", texts[0])
		for _, w := range []string{"GOMAXPROCS (log scale)", "ns per Get (log scale); lower is faster", "1", "2", "4", "8", "epcache", "rwmutex", "array"} {
			assert.Contains(t, texts, w)
		}
	}
}

func TestAxisFormats(t *testing.T) {
	for _, tc := range []struct {
		ns   float64
		want string
	}{{7.6, "7.6 ns"}, {50, "50 ns"}, {1130e6, "1.13 s"}, {22.04e6, "22 ms"}, {999, "999 ns"}, {1500, "1.5 µs"}, {0, "0"}} {
		assert.Equal(t, tc.want, fmtNs(tc.ns))
	}
	for _, tc := range []struct {
		n    float64
		want string
	}{{36968, "36,968"}, {1000, "1,000"}, {64, "64"}, {1e6, "1,000,000"}, {-1327, "-1,327"}} {
		assert.Equal(t, tc.want, fmtCount(tc.n))
	}
	// A log axis over 4 ns to 50 ns: 1-2-5 ticks, each labelled in its unit.
	var labels []string
	for _, tk := range (logTicks{fmtNs}).Ticks(stepBelow(4), stepAbove(50)) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	assert.Equal(t, []string{"2 ns", "5 ns", "10 ns", "20 ns", "50 ns"}, labels)
	assert.Equal(t, 2.0, stepBelow(4))
	assert.Equal(t, 50.0, stepAbove(50))
	assert.False(t, math.IsNaN(stepAbove(0.3)))
	assert.Equal(t, "hit: ns per Get,\nGOMAXPROCS 2", wrapText(titleStyle(), "hit: ns per Get, GOMAXPROCS 2", titleStyle().Width("hit: ns per Get, GOMAXPR")))
	assert.Equal(t, fmt.Sprint([]string{"a; ", "b, ", "c"}), fmt.Sprint(splitAfterAny("a; b, c", ", ", "; ")))
}

// Values a log axis has no place for (a storm that took no time, a peak of
// 0) and a single implementation still draw.
func TestChartsOfOddRuns(t *testing.T) {
	rs := suiteResults(2)
	for i := range rs {
		switch {
		case rs[i].Workload == "storm" && rs[i].Impl == "epcache":
			rs[i].Completion, rs[i].NsPerOp, rs[i].CDF = 0, 0, nil
		case rs[i].Workload == "hotset" && rs[i].Impl == "epcache":
			rs[i].PeakLive = 0
		}
	}
	rs = append(rs, fakeRun("mixed", "epcache", "uint64", 2, 12))
	charts, err := buildCharts(rs)
	require.NoError(t, err)
	for _, c := range charts {
		for _, format := range []string{"svg", "png"} {
			var b bytes.Buffer
			require.NoError(t, c.render(&b, format), "%s as %s", c.title, format)
			assert.Positive(t, b.Len())
		}
	}
}
