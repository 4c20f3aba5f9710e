package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/epcache/epcache/bench"
)

// The report: -out's index.html, one self-contained page (charts inline as
// SVG, no script, no fetch) that shows a run the way criterion.rs shows a
// benchmark: the machine and the command first, then per workload its
// charts, a table per configuration and epcache's ratios to the reference
// comparators, beside the baseline's and the limit where -compare gave one.
//
// The page says what it holds, for the browser test (report_browser_test.go)
// to check against what rendered: <main data-charts="N" data-tables="M">,
// and each chart a <figure class="chart" data-chart="NAME"
// data-labels="[…]"> holding one <svg> whose text must include the labels.

// reportInfo is what the report says besides the results.
type reportInfo struct {
	args       []string    // epbench's arguments
	comparison *comparison // with -compare; nil otherwise
	compareErr error       // why -compare found nothing to compare
	date       time.Time
}

type reportPage struct {
	Machine    [][2]string
	Command    string
	Date       string
	Runs       int
	Failures   []string
	Baseline   string
	Margin     string
	Worse      int
	Compared   int
	CompareErr string
	Sections   []reportSection
	Charts     int
	Tables     int
}

type reportSection struct {
	Workload string
	About    string
	Charts   []reportChart
	Groups   []reportGroup
	Ratios   []reportRatio
}

type reportChart struct {
	ID      string
	Name    string   // the file name, where it has files
	Files   []string // its files, beside the report
	Caption string
	Labels  string // JSON array
	SVG     template.HTML
}

type reportGroup struct {
	ID      string
	Title   string
	Notes   string
	Columns []string
	Rows    []reportRow
}

type reportRow struct {
	Cells []string
	Fail  bool
}

type reportRatio struct {
	Name     string
	Now      string
	Baseline string // empty: not compared
	Limit    string
	Verdict  string // ok, WORSE or empty
}

// workloadAbout is a sentence per workload for the report.
var workloadAbout = map[string]string{
	"hit":      "Every peer ready, every Get a hit: the cost of the lookup alone.",
	"storm":    "G goroutines released together, each Gets all P peers in rotated order: exactly-once creation under contention.",
	"churn":    "Mostly hits; a fraction of the operations report the endpoint as failed, and the next Get creates it again.",
	"flaky":    "A storm whose creations fail a few times per peer before they succeed.",
	"mixed":    "A share of the operations are Gets, the rest Invalidates.",
	"lease":    "Hold the endpoint while it is used (Acquire, use, Release); a fraction of the operations invalidate. Released in use must stay 0.",
	"hotset":   "Goroutines lease, use briefly and let go of peers drawn by Zipf from a large population, under a cap: hit ratio, peak live endpoints, releases under a use.",
	"tcpstorm": "Peers on loopback TCP, each with its own cache, all connecting to each other at once: real connections, duplicates, file descriptors.",
	"ucxstorm": "The same with UCX endpoints between workers.",
}

// writeReport writes dir/index.html.
func writeReport(dir string, results []bench.Result, charts []*chart, info reportInfo) error {
	page, err := buildReport(results, charts, info)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := reportTemplate.Execute(&buf, page); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "index.html"), buf.Bytes(), 0o644)
}

func buildReport(results []bench.Result, charts []*chart, info reportInfo) (*reportPage, error) {
	page := &reportPage{Machine: machine(results), Command: command(info.args), Runs: len(results)}
	if !info.date.IsZero() {
		page.Date = info.date.UTC().Format("2006-01-02 15:04 UTC")
	}
	for _, r := range results {
		if r.Failure != "" {
			page.Failures = append(page.Failures, r.Name()+": "+r.Failure)
		}
	}
	if info.compareErr != nil {
		page.CompareErr = info.compareErr.Error()
	}
	c := info.comparison
	if c != nil {
		page.Baseline, page.Margin, page.Compared = c.baseline, strconv.FormatFloat(c.margin, 'g', -1, 64), len(c.rows)
		for _, r := range c.rows {
			if c.worse(r) {
				page.Worse++
			}
		}
	}
	gs := groups(results)
	rs := ratios(results)
	ids := map[string]int{}
	id := func(s string) string {
		s = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
				return r
			}
			if r >= 'A' && r <= 'Z' {
				return r + 'a' - 'A'
			}
			return '-'
		}, s)
		ids[s]++
		if ids[s] > 1 {
			s += "-" + strconv.Itoa(ids[s])
		}
		return s
	}
	for _, w := range workloads(results) {
		sec := reportSection{Workload: w, About: workloadAbout[w]}
		for _, ch := range charts {
			if ch.workload != w {
				continue
			}
			svg, err := ch.inlineSVG()
			if err != nil {
				return nil, err
			}
			labels, _ := json.Marshal(ch.labels())
			name := ch.name
			if name == "" {
				name = "chart-" + w
			}
			rc := reportChart{ID: id(name), Name: ch.name, Caption: ch.caption, Labels: string(labels), SVG: template.HTML(svg)}
			if ch.name != "" {
				for _, f := range chartFormats {
					rc.Files = append(rc.Files, ch.name+"."+f)
				}
			}
			sec.Charts = append(sec.Charts, rc)
		}
		for _, g := range gs {
			if g.spec.Workload == w {
				rg := groupTable(g)
				rg.ID = id(groupTitle(g.spec) + "-procs-" + strconv.Itoa(g.spec.Procs))
				sec.Groups = append(sec.Groups, rg)
			}
		}
		for _, r := range rs {
			if r.workload != w {
				continue
			}
			rr := reportRatio{Name: r.name, Now: fmt.Sprintf("%.3f", r.current)}
			if c != nil {
				if b, ok := c.find(r.name); ok {
					rr.Baseline, rr.Limit, rr.Verdict = fmt.Sprintf("%.3f", b.baseline), fmt.Sprintf("%.3f", c.limit(b)), "ok"
					if c.worse(b) {
						rr.Verdict = "WORSE"
					}
				}
			}
			sec.Ratios = append(sec.Ratios, rr)
		}
		page.Charts += len(sec.Charts)
		page.Tables += len(sec.Groups)
		if len(sec.Ratios) > 0 {
			page.Tables++
		}
		page.Sections = append(page.Sections, sec)
	}
	return page, nil
}

// workloads lists the workloads the results hold, in bench.Workloads order.
func workloads(results []bench.Result) []string {
	var out []string
	for _, w := range append(slices.Clone(bench.Workloads), distinct(results, func(r bench.Result) string { return r.Workload })...) {
		if !slices.Contains(out, w) && slices.ContainsFunc(results, func(r bench.Result) bool { return r.Workload == w }) {
			out = append(out, w)
		}
	}
	return out
}

// groupTable is a configuration's table: one row per implementation, the
// run with the median headline where -count repeated it.
func groupTable(g group) reportGroup {
	s := g.spec
	rg := reportGroup{Title: groupTitle(s), Notes: fmt.Sprintf("GOMAXPROCS %d", s.Procs)}
	switch {
	case s.IsMesh():
		rg.Notes += ", real connections"
	case s.MeasuresCreation():
		rg.Notes += ", creation cost " + s.Cost
	default:
		rg.Notes += ", creates nothing while measured"
	}
	by := medianRun(g.results)
	counts := map[string]int{}
	spread := map[string][2]float64{}
	repeated := false
	for _, r := range g.results {
		counts[r.Impl]++
		h := headline(r)
		sp, ok := spread[r.Impl]
		if !ok {
			sp = [2]float64{h, h}
		}
		spread[r.Impl] = [2]float64{min(sp[0], h), max(sp[1], h)}
		repeated = repeated || counts[r.Impl] > 1
	}
	ref := by["epcache"]
	hot := s.Workload == "hotset"
	first := "ns/op"
	if s.IsStorm() {
		first = "until all ready"
	}
	if hot {
		rg.Columns = []string{"impl", "ops/s", "ns/op", "×epcache", "hit ratio", "creates", "peak live", "overshoot", "released in use", "p50", "p99", "p99.9", "leaked", "create", "status"}
	} else {
		rg.Columns = []string{"impl", "ops/s", first, "×epcache", "p50", "p99", "p99.9", "max", "allocs/op", "creates", "duplicates", "leaked", "overlap", "create", "status"}
	}
	if repeated {
		rg.Columns = slices.Insert(rg.Columns, 1, "runs", "min – max")
	}
	for _, impl := range implOrder(g.results) {
		r := by[impl]
		ratio := "-"
		if h := headline(ref); h > 0 {
			ratio = sig(headline(r) / h)
		}
		create := "-"
		if s.MeasuresCreation() {
			create = fmtNs(float64(r.MeanCreate))
		}
		status := "ok"
		if r.Failure != "" {
			status = "FAIL: " + r.Failure
		}
		if r.FDsBefore > 0 {
			status += fmt.Sprintf(" (fds %d→%d)", r.FDsBefore, r.FDsAfter)
		}
		var cells []string
		if hot {
			cells = []string{impl, si(r.OpsPerSec), fmtNs(r.NsPerOp), ratio, fmt.Sprintf("%.1f%%", 100*r.HitRatio), fmtCount(float64(r.Creates)),
				fmtCount(float64(r.PeakLive)), fmt.Sprintf("%+d", r.Overshoot()), fmtCount(float64(r.ReleasedInUse)),
				fmtDur(r.P50), fmtDur(r.P99), fmtDur(r.P999), fmt.Sprint(r.Leaked), create, status}
		} else {
			main := fmtNs(r.NsPerOp)
			if s.IsStorm() {
				main = fmtNs(float64(r.Completion))
			}
			cells = []string{impl, si(r.OpsPerSec), main, ratio, fmtDur(r.P50), fmtDur(r.P99), fmtDur(r.P999), fmtDur(r.Max),
				fmt.Sprintf("%.2f", r.AllocsPerOp), fmtCount(float64(r.Creates)), fmtCount(float64(r.Duplicates)), fmt.Sprint(r.Leaked),
				strconv.Itoa(r.Overlap), create, status}
		}
		if repeated {
			sp := spread[impl]
			cells = slices.Insert(cells, 1, strconv.Itoa(counts[impl]), fmtNs(sp[0])+" – "+fmtNs(sp[1]))
		}
		rg.Rows = append(rg.Rows, reportRow{Cells: cells, Fail: r.Failure != ""})
	}
	return rg
}

func fmtDur(d time.Duration) string { return fmtNs(float64(d)) }

// command is the command line the report was made by.
func command(args []string) string {
	parts := []string{"epbench"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// machine describes where the results were measured, as far as this
// process can tell.
func machine(results []bench.Result) [][2]string {
	cpu := runtime.GOARCH
	if m := procField("/proc/cpuinfo", "model name"); m != "" {
		cpu = m
	}
	out := [][2]string{
		{"CPU", fmt.Sprintf("%d × %s", runtime.NumCPU(), cpu)},
	}
	if mem := procField("/proc/meminfo", "MemTotal"); mem != "" {
		if kb, err := strconv.ParseFloat(strings.TrimSuffix(mem, " kB"), 64); err == nil {
			out = append(out, [2]string{"memory", fmt.Sprintf("%.0f GiB", kb/(1<<20))})
		}
	}
	osName := runtime.GOOS + "/" + runtime.GOARCH
	if k, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		osName += ", kernel " + strings.TrimSpace(string(k))
	}
	out = append(out, [2]string{"OS", osName}, [2]string{"Go", runtime.Version()})
	var procs []string
	for _, p := range distinct(results, func(r bench.Result) int { return r.Procs }) {
		procs = append(procs, strconv.Itoa(p))
	}
	if len(procs) > 0 {
		out = append(out, [2]string{"GOMAXPROCS", strings.Join(procs, ", ")})
	}
	return out
}

// procField returns the first value of a "name : value" line of a /proc
// file, or "".
func procField(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>epbench results</title>
<style>
body { font: 15px/1.45 "Liberation Sans", Arial, Helvetica, sans-serif; color: #222; margin: 0; background: #fafafa; }
main { max-width: 84rem; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
h1 { font-size: 1.7rem; margin: 0.5rem 0; }
h2 { font-size: 1.35rem; margin: 2.5rem 0 0.3rem; border-bottom: 2px solid #4e79a7; padding-bottom: 0.2rem; }
h3 { font-size: 1.05rem; margin: 1.5rem 0 0.3rem; font-family: "Liberation Mono", Menlo, monospace; word-break: break-all; }
pre, code { font-family: "Liberation Mono", Menlo, monospace; font-size: 0.85rem; }
pre { background: #f0f0f0; padding: 0.5rem 0.75rem; white-space: pre-wrap; overflow-wrap: anywhere; }
dl.machine { display: grid; grid-template-columns: max-content auto; gap: 0.1rem 1rem; margin: 0.5rem 0; }
dl.machine dt { font-weight: bold; }
dl.machine dd { margin: 0; }
nav ul { padding-left: 1.2rem; columns: 2; }
figure.chart { margin: 1rem 0; background: #fff; border: 1px solid #ddd; padding: 0.5rem; }
figure.chart svg { display: block; width: 100%; height: auto; max-width: 60rem; margin: 0 auto; }
figcaption { font-size: 0.9rem; color: #555; margin-top: 0.3rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85rem; background: #fff; margin: 0.3rem 0 1rem; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: right; white-space: nowrap; }
th { background: #eef2f7; }
td:first-child, th:first-child { text-align: left; }
tr.fail td, td.worse { background: #fde2e2; color: #8b0000; font-weight: bold; }
td.ok { color: #1b6e1b; }
.failures { border: 2px solid #c00; background: #fde2e2; padding: 0.5rem 1rem; }
.note { color: #555; font-size: 0.9rem; }
</style>
</head>
<body>
<main data-charts="{{.Charts}}" data-tables="{{.Tables}}">
<h1>epbench results</h1>
<dl class="machine">
{{range .Machine}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>
{{end}}{{if .Date}}<dt>date</dt><dd>{{.Date}}</dd>
{{end}}<dt>runs</dt><dd>{{.Runs}}</dd>
</dl>
<pre class="command">{{.Command}}</pre>
{{if .Failures}}<div class="failures"><strong>{{len .Failures}} runs failed:</strong>
<ul>{{range .Failures}}<li><code>{{.}}</code></li>{{end}}</ul></div>
{{end}}{{if .Baseline}}<p class="{{if .Worse}}failures{{else}}note{{end}}">Compared with the baseline <code>{{.Baseline}}</code>: {{.Compared}} ratios, {{.Worse}} more than {{.Margin}}× worse than the baseline's.</p>
{{end}}{{if .CompareErr}}<p class="failures">{{.CompareErr}}</p>
{{end}}<p class="note">Times are medians of the runs of each configuration; ×epcache is an implementation's time over epcache's (above 1: slower than epcache). Ratios are epcache's time over a reference comparator's, measured in one run (below 1: epcache is faster).</p>
<nav><ul>{{range .Sections}}<li><a href="#{{.Workload}}">{{.Workload}}</a></li>{{end}}</ul></nav>
{{range .Sections}}<section id="{{.Workload}}">
<h2>{{.Workload}}</h2>
<p>{{.About}}</p>
{{range .Charts}}<figure class="chart" id="{{.ID}}" data-chart="{{.ID}}" data-labels="{{.Labels}}">
{{.SVG}}<figcaption>{{.Caption}}{{with .Files}} Files:{{range $i, $f := .}}{{if $i}},{{end}} <a href="{{$f}}">{{$f}}</a>{{end}}.{{end}}</figcaption>
</figure>
{{end}}{{range .Groups}}<h3 id="{{.ID}}">{{.Title}}</h3>
<p class="note">{{.Notes}}</p>
<div class="scroll"><table class="results">
<thead><tr>{{range .Columns}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>{{range .Rows}}<tr{{if .Fail}} class="fail"{{end}}>{{range .Cells}}<td>{{.}}</td>{{end}}</tr>
{{end}}</tbody>
</table></div>
{{end}}{{if .Ratios}}<h3>epcache ÷ reference</h3>
<div class="scroll"><table class="ratios">
<thead><tr><th>ratio</th><th>now</th>{{if $.Baseline}}<th>baseline</th><th>limit (×{{$.Margin}})</th><th>verdict</th>{{end}}</tr></thead>
<tbody>{{range .Ratios}}<tr><td><code>{{.Name}}</code></td><td>{{.Now}}</td>{{if $.Baseline}}<td>{{if .Baseline}}{{.Baseline}}{{else}}-{{end}}</td><td>{{if .Limit}}{{.Limit}}{{else}}-{{end}}</td><td class="{{if eq .Verdict "WORSE"}}worse{{else if .Verdict}}ok{{end}}">{{if .Verdict}}{{.Verdict}}{{else}}not in the baseline{{end}}</td>{{end}}</tr>
{{end}}</tbody>
</table></div>
{{end}}</section>
{{end}}</main>
</body>
</html>
`))
