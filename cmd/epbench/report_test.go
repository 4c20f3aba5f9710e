package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The report is one self-contained page: every chart inline, no script, no
// address outside the page but the chart files beside it; the machine and
// the command at the top; per workload its charts, tables and ratios, and
// with -compare each ratio beside its baseline and its limit, failures
// marked.
func TestReport(t *testing.T) {
	results := suiteResults(2)
	results[0].Failure = "leaked 3 endpoints"
	charts, err := buildCharts(results)
	require.NoError(t, err)
	var hit ratio
	for _, r := range ratios(results) {
		if r.workload == "hit" {
			hit = r
			break
		}
	}
	require.NotEmpty(t, hit.name)
	c := &comparison{baseline: "results/baseline.json", margin: 2, rows: []ratio{
		{name: hit.name, workload: "hit", baseline: hit.current / 3, current: hit.current}, // 3× worse: fails
	}}
	dir := t.TempDir()
	require.NoError(t, writeReport(dir, results, charts, reportInfo{args: []string{"-count", "5", "-out", "results/epbench", "-cost", "sleep:1ms"}, comparison: c}))
	data, err := os.ReadFile(filepath.Join(dir, "index.html"))
	require.NoError(t, err)
	page := string(data)

	assert.NotContains(t, page, "<script", "no JavaScript")
	assert.NotRegexp(t, regexp.MustCompile(`(src|href)="(https?:)?//`), page, "nothing from the network")
	assert.NotContains(t, page, "<?xml", "SVG inline, without its prolog")
	assert.Contains(t, page, "epbench -count 5 -out results/epbench -cost sleep:1ms")
	assert.Contains(t, page, "<dt>Go</dt>")
	assert.Contains(t, page, "leaked 3 endpoints")

	figures := regexp.MustCompile(`<figure class="chart"[^>]*data-chart="([^"]+)"`).FindAllStringSubmatch(page, -1)
	svgs := strings.Count(page, "<svg ")
	assert.Equal(t, len(charts), len(figures))
	assert.Equal(t, len(charts), svgs, "one <svg> per chart")
	assert.Contains(t, page, `data-charts="`+strconv.Itoa(len(charts))+`"`)
	tables := strings.Count(page, "<table")
	assert.Contains(t, page, `data-tables="`+strconv.Itoa(tables)+`"`)
	assert.Contains(t, page, `<a href="throughput.svg">`, "named charts link their files")

	// Sections in the suite's order, each with its charts before its tables.
	last := -1
	for _, w := range []string{"hit", "storm", "churn", "lease", "hotset"} {
		i := strings.Index(page, `<section id="`+w+`">`)
		assert.Greater(t, i, last, "section %s in order", w)
		last = i
	}
	// The ratios: now, baseline, limit, verdict.
	row := regexp.MustCompile(`<tr><td><code>` + regexp.QuoteMeta(hit.name) + `</code></td><td>([0-9.]+)</td><td>([0-9.]+)</td><td>([0-9.]+)</td><td class="worse">WORSE</td></tr>`)
	m := row.FindStringSubmatch(page)
	require.NotNil(t, m, "the failing ratio's row, marked")
	assert.Contains(t, page, "1 more than 2× worse")
	// A ratio the baseline lacks says so.
	assert.Contains(t, page, "not in the baseline")
	// A workload that creates nothing while measured shows no creation cost.
	assert.Contains(t, page, "GOMAXPROCS 2, creates nothing while measured")
	assert.Contains(t, page, "GOMAXPROCS 2, creation cost sleep:1ms")
}

// A run without -compare shows its ratios alone.
func TestReportWithoutBaseline(t *testing.T) {
	results := []bench.Result{fakeRun("hit", "epcache", "uint64", 2, 7.6), fakeRun("hit", "syncmap", "uint64", 2, 13)}
	page, err := buildReport(results, nil, reportInfo{})
	require.NoError(t, err)
	require.Len(t, page.Sections, 1)
	require.Len(t, page.Sections[0].Ratios, 1)
	r := page.Sections[0].Ratios[0]
	assert.Equal(t, "0.585", r.Now)
	assert.Empty(t, r.Baseline+r.Limit+r.Verdict)
	assert.Equal(t, 2, page.Tables, "the hit table and the ratios")
}
