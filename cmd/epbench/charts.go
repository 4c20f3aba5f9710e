package main

import (
	"bytes"
	"cmp"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/epcache/epcache/bench"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// A chart is one figure of a run. Each chart lays itself out rather than
// leave it to plot.Plot.Draw, so that nothing sits on the data and nothing
// reaches an edge: a margin on every side, the title above the plot
// (wrapped to the width), the legend in a column right of the plot. Axes
// whose values span more than 10× are logarithmic, and every number is
// printed in its unit (7.6 ns, 22 ms, 1.13 s, 36,968), never in e-notation.
//
// The named charts are written as SVG and PNG by -out; the report shows
// them all, the unnamed ones too, inline in their workload's section.
type chart struct {
	name     string   // file name without extension; empty: in the report only
	workload string   // the report's section
	groups   []string // groupKey of every spec drawn
	title    string
	caption  string // a sentence under the chart in the report
	plot     *plot.Plot
	xLabel   string      // the x axis's label, drawn by the chart (see finish)
	yLabel   string      // the y axis's label, likewise
	legend   plot.Legend // drawn beside the plot, never on it
	drawn    []string    // the lines of the title and axis labels, as last drawn
	entries  int         // entries in legend
	height   vg.Length   // 0: 5 inches
}

func (c *chart) size() (w, h vg.Length) {
	if c.height == 0 {
		return chartWidth, 5 * vg.Inch
	}
	return chartWidth, c.height
}

const (
	chartWidth  = 8 * vg.Inch
	chartMargin = vg.Length(12)
	chartDPI    = 144
)

// The charts' text is sans-serif: Liberation Sans has Arial's metrics, so
// that an SVG shown where Liberation is missing (see svgFontFallback) keeps
// the widths the layout was made for.
func init() {
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
}

var svgFontFallback = strings.NewReplacer("font-family:Liberation Sans;", "font-family:'Liberation Sans',Arial,Helvetica,sans-serif;")

// chartFormats are the files writeCharts writes of each named chart. The
// browser test, which reads the report alone, leaves out the PNGs: under
// the race detector they take seconds each.
var chartFormats = []string{"svg", "png"}

// writeCharts writes every named chart of the results into dir, as SVG and
// PNG, and returns all the charts, the report's too.
func writeCharts(dir string, results []bench.Result) ([]*chart, error) {
	charts, err := buildCharts(results)
	if err != nil {
		return nil, err
	}
	for _, c := range charts {
		if c.name == "" {
			continue
		}
		for _, format := range chartFormats {
			var buf bytes.Buffer
			if err := c.render(&buf, format); err != nil {
				return nil, fmt.Errorf("chart %s: %w", c.name, err)
			}
			if err := os.WriteFile(filepath.Join(dir, c.name+"."+format), buf.Bytes(), 0o644); err != nil {
				return nil, err
			}
		}
	}
	return charts, nil
}

// render draws c as an SVG document or a PNG image.
func (c *chart) render(w io.Writer, format string) error {
	width, h := c.size()
	switch format {
	case "svg":
		cv := vgsvg.New(width, h)
		c.draw(draw.New(cv))
		var buf bytes.Buffer
		if _, err := cv.WriteTo(&buf); err != nil {
			return err
		}
		_, err := svgFontFallback.WriteString(w, buf.String())
		return err
	case "png":
		cv := vgimg.NewWith(vgimg.UseWH(width, h), vgimg.UseDPI(chartDPI))
		c.draw(draw.New(cv))
		_, err := vgimg.PngCanvas{Canvas: cv}.WriteTo(w)
		return err
	}
	return fmt.Errorf("unknown chart format %q", format)
}

// inlineSVG is the chart as an <svg> element for an HTML page: no XML
// prolog, and sized by the page (the viewBox keeps the proportions).
func (c *chart) inlineSVG() (string, error) {
	var buf bytes.Buffer
	if err := c.render(&buf, "svg"); err != nil {
		return "", err
	}
	s := buf.String()
	i := strings.Index(s, "<svg")
	if i < 0 {
		return "", fmt.Errorf("chart %s: no <svg> element", c.name)
	}
	return s[i:], nil
}

// finish takes the axis labels from the plot, to draw them itself: gonum
// reserves room for an axis label around the linear midpoint of the axis's
// range, which on a log axis sits far from the middle, and the plot then
// shrinks away from it.
func (c *chart) finish() {
	c.xLabel, c.plot.X.Label.Text = c.xLabel+c.plot.X.Label.Text, ""
	c.yLabel, c.plot.Y.Label.Text = c.yLabel+c.plot.Y.Label.Text, ""
	c.legend.Padding = vg.Points(4)
}

func (c *chart) draw(dc draw.Canvas) {
	c.finish()
	c.drawn = []string{}
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	in := draw.Crop(dc, chartMargin, -chartMargin, chartMargin, -chartMargin)
	if c.title != "" {
		sty := titleStyle()
		t := wrapText(sty, c.title, in.Size().X)
		c.drawn = append(c.drawn, strings.Split(t, "\n")...)
		in.FillText(sty, vg.Point{X: in.Center().X, Y: in.Max.Y}, t)
		in.Max.Y -= sty.Height(t) + 10
	}
	if c.entries > 0 {
		c.legend.Top, c.legend.Left = true, true
		lw := c.legend.Rectangle(in).Size().X + 12
		c.legend.Draw(draw.Crop(in, in.Size().X-lw+12, 0, 0, -4))
		in = draw.Crop(in, 0, -lw, 0, 0)
	}
	xs, ys := c.plot.X.Label.TextStyle, c.plot.Y.Label.TextStyle
	xl, yl := wrapText(xs, c.xLabel, in.Size().X), wrapText(ys, c.yLabel, in.Size().Y)
	for _, l := range []string{xl, yl} {
		if l != "" {
			c.drawn = append(c.drawn, strings.Split(l, "\n")...)
		}
	}
	pc := in
	if xl != "" {
		pc = draw.Crop(pc, 0, 0, xs.Height(xl)+4, 0)
	}
	if yl != "" {
		pc = draw.Crop(pc, ys.Height(yl)+4, 0, 0, 0)
	}
	c.plot.Draw(pc)
	da := c.plot.DataCanvas(pc)
	if xl != "" {
		// Centred under the data, as far as the label fits.
		w := xs.Width(xl)
		x := min(max(da.Center().X, in.Min.X+w/2), in.Max.X-w/2)
		xs.XAlign, xs.YAlign = draw.XCenter, draw.YBottom
		in.FillText(xs, vg.Point{X: x, Y: in.Min.Y + xs.FontExtents().Descent}, xl)
	}
	if yl != "" {
		h := ys.Width(yl)
		y := min(max(da.Center().Y, in.Min.Y+h/2), in.Max.Y-h/2)
		ys.Rotation += math.Pi / 2
		ys.XAlign, ys.YAlign = draw.XCenter, draw.YBottom
		in.FillText(ys, vg.Point{X: in.Min.X + ys.Height(yl) - ys.FontExtents().Descent, Y: y}, yl)
	}
}

func titleStyle() text.Style {
	sty := plot.New().Title.TextStyle
	sty.Font.Size = vg.Points(13)
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
	return sty
}

// wrapText breaks s after its commas and semicolons so that no line is
// wider than width.
func wrapText(sty text.Style, s string, width vg.Length) string {
	var lines []string
	line := ""
	for _, word := range splitAfterAny(s, ", ", "; ") {
		if line != "" && sty.Width(line+strings.TrimRight(word, " ")) > width {
			lines = append(lines, strings.TrimRight(line, " "))
			line = ""
		}
		line += word
	}
	return strings.Join(append(lines, line), "\n")
}

func splitAfterAny(s string, seps ...string) []string {
	var out []string
	for s != "" {
		cut := len(s)
		for _, sep := range seps {
			if i := strings.Index(s, sep); i >= 0 && i+len(sep) < cut {
				cut = i + len(sep)
			}
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return out
}

// labels are the texts a reader looks for in c, as drawn: its title's lines
// and its axes' labels. The tests and the report's browser check look for
// them.
func (c *chart) labels() []string {
	if c.drawn == nil {
		c.draw(draw.New(vgsvg.New(c.size())))
	}
	return c.drawn
}

// groupKey names a spec without its implementation and seed: the results
// of one group are the implementations' runs of one configuration.
func groupKey(s bench.Spec) string {
	s.Impl, s.Seed = "", 0
	return fmt.Sprintf("%+v", s)
}

// groupTitle is a group's benchmark name without the implementation.
func groupTitle(s bench.Spec) string {
	s.Impl = "*"
	return strings.Replace(s.Name(), "/impl=*", "", 1)
}

// buildCharts draws every chart the results call for, in the report's
// order: hit throughput, the GOMAXPROCS sweeps, storm completion and
// latency, lease, hotset; then one headline chart for each group no chart
// above draws.
func buildCharts(results []bench.Result) ([]*chart, error) {
	var charts []*chart
	for _, draw := range []func([]bench.Result) ([]*chart, error){
		one(throughputChart), scalingCharts, one(stormChart), one(latencyChart), one(leaseChart), one(hotsetChart), one(hotsetHitsChart),
	} {
		cs, err := draw(results)
		if err != nil {
			return nil, err
		}
		charts = append(charts, cs...)
	}
	covered := map[string]bool{}
	for _, c := range charts {
		for _, g := range c.groups {
			covered[g] = true
		}
	}
	for _, g := range groups(results) {
		if !covered[groupKey(g.spec)] {
			c, err := headlineChart(g)
			if err != nil {
				return nil, err
			}
			charts = append(charts, c)
		}
	}
	slices.SortStableFunc(charts, func(a, b *chart) int {
		return cmp.Compare(slices.Index(bench.Workloads, a.workload), slices.Index(bench.Workloads, b.workload))
	})
	return charts, nil
}

func one(f func([]bench.Result) (*chart, error)) func([]bench.Result) ([]*chart, error) {
	return func(rs []bench.Result) ([]*chart, error) {
		c, err := f(rs)
		if c == nil || err != nil {
			return nil, err
		}
		return []*chart{c}, nil
	}
}

func implOrder(results []bench.Result) []string {
	var names []string
	for _, name := range bench.ImplNames() {
		if slices.ContainsFunc(results, func(r bench.Result) bool { return r.Impl == name }) {
			names = append(names, name)
		}
	}
	return names
}

// implColor gives each implementation the same colour in every chart.
func implColor(impl string) color.Color {
	i := max(slices.Index(bench.ImplNames(), impl), 0)
	return palette[i%len(palette)]
}

// palette: Tableau 10, then three more, distinct on white.
var palette = []color.Color{
	rgb(0x4e79a7), rgb(0xf28e2b), rgb(0xe15759), rgb(0x76b7b2), rgb(0x59a14f), rgb(0xedc948),
	rgb(0xb07aa1), rgb(0xff9da7), rgb(0x9c755f), rgb(0xbab0ac), rgb(0x1b9e77), rgb(0x7570b3), rgb(0x6b6ecf),
}

func rgb(v uint32) color.Color { return color.RGBA{uint8(v >> 16), uint8(v >> 8), uint8(v), 0xff} }

// medianRun returns, per implementation, the run with the median headline
// among rs.
func medianRun(rs []bench.Result) map[string]bench.Result {
	by := map[string][]bench.Result{}
	for _, r := range rs {
		by[r.Impl] = append(by[r.Impl], r)
	}
	out := map[string]bench.Result{}
	for impl, runs := range by {
		runs = slices.Clone(runs)
		slices.SortStableFunc(runs, func(a, b bench.Result) int { return cmp.Compare(headline(a), headline(b)) })
		out[impl] = runs[len(runs)/2]
	}
	return out
}

// headlineLabel says what headline measures, for an axis.
func headlineLabel(s bench.Spec) string {
	switch {
	case s.IsStorm():
		return "time until every goroutine has every peer"
	case s.Workload == "hit":
		return "ns per Get"
	case s.Workload == "lease":
		return "ns per operation (Acquire, use, Release)"
	}
	return "ns per operation"
}

// about describes a group's configuration for a title: "1,024 peers, 64
// goroutines, creation sleep:1ms, GOMAXPROCS 2".
func about(s bench.Spec) string {
	parts := config(s)
	parts = slices.Insert(parts, 1, fmtCount(float64(s.Goroutines))+" goroutines")
	if s.Procs > 0 {
		parts = append(parts, fmt.Sprintf("GOMAXPROCS %d", s.Procs))
	}
	return strings.Join(parts, ", ")
}

// config is about's description less the goroutines and GOMAXPROCS.
func config(s bench.Spec) []string {
	parts := []string{fmtCount(float64(s.Peers)) + " peers"}
	if s.Workload != "storm" && s.Workload != "flaky" && !s.IsMesh() && s.Keys != "" {
		parts[0] += ", " + s.Keys + " keys"
	}
	if s.Dist == "zipf" && s.Workload != "hotset" {
		parts = append(parts, "Zipf access")
	}
	switch {
	case s.IsMesh():
		parts = append(parts, "real connections")
		if s.RTT > 0 {
			parts = append(parts, "modelled round trip "+s.RTT.String())
		}
	case s.Workload == "hit":
	case s.Cost != "" && s.Cost != "none":
		parts = append(parts, "creation "+s.Cost)
	}
	switch s.Workload {
	case "churn":
		parts = append(parts, fmt.Sprintf("%g%% reported failed", 100*s.Churn))
	case "lease":
		parts = append(parts, fmt.Sprintf("%g%% invalidated", 100*s.Churn))
	case "mixed":
		parts = append(parts, fmt.Sprintf("%g%% reads", 100*s.Reads))
	case "flaky":
		parts = append(parts, fmt.Sprintf("%d failures per peer first", s.Failures))
	case "hotset":
		parts = append(parts, fmt.Sprintf("cap %s", fmtCount(float64(s.Cap))))
	}
	if s.Ctx == "cancel" {
		parts = append(parts, "cancellable context")
	}
	return parts
}

// throughputChart draws the hit workload (uniform access, the first peer
// count): ns per Get per implementation and key type at the largest
// GOMAXPROCS run, or against the goroutine count where that varied.
func throughputChart(results []bench.Result) (*chart, error) {
	var hits []bench.Result
	for _, r := range results {
		if r.Workload == "hit" && r.Dist == "uniform" {
			hits = append(hits, r)
		}
	}
	if len(hits) == 0 {
		return nil, nil
	}
	peers := hits[0].Peers
	procs := 0
	for _, r := range hits {
		if r.Peers == peers {
			procs = max(procs, r.Procs)
		}
	}
	hits = slices.DeleteFunc(hits, func(r bench.Result) bool { return r.Peers != peers || r.Procs != procs })
	gs := distinct(hits, func(r bench.Result) int { return r.Goroutines })
	c := &chart{name: "throughput", workload: "hit"}
	for _, r := range hits {
		if !slices.Contains(c.groups, groupKey(r.Spec)) {
			c.groups = append(c.groups, groupKey(r.Spec))
		}
	}
	if len(gs) > 1 {
		keys := hits[0].Keys
		hits = slices.DeleteFunc(hits, func(r bench.Result) bool { return r.Keys != keys })
		c.groups = nil
		for _, r := range hits {
			if !slices.Contains(c.groups, groupKey(r.Spec)) {
				c.groups = append(c.groups, groupKey(r.Spec))
			}
		}
		c.title = fmt.Sprintf("hit: ns per Get against goroutines, %s peers, %s keys, GOMAXPROCS %d", fmtCount(float64(peers)), keys, procs)
		c.caption = "Every peer ready, every Get a hit; one line per implementation. Lower is faster."
		return c, lineChart(c, hits, "goroutines", func(r bench.Result) float64 { return float64(r.Goroutines) }, "ns per Get")
	}
	s := hits[0].Spec
	c.title = fmt.Sprintf("hit: ns per Get, %s peers, uniform access, %d goroutines, GOMAXPROCS %d", fmtCount(float64(peers)), s.Goroutines, procs)
	c.caption = "Every peer ready, every Get a hit, both key types; medians of the runs. Shorter is faster."
	impls := implOrder(hits)
	var series []barSeries
	for _, keys := range []string{"uint64", "string"} {
		if !slices.ContainsFunc(hits, func(r bench.Result) bool { return r.Keys == keys }) {
			continue
		}
		bs := barSeries{name: keys + " keys", color: keyColor(keys)}
		for _, impl := range impls {
			var ns []float64
			for _, r := range hits {
				if r.Impl == impl && r.Keys == keys {
					ns = append(ns, r.NsPerOp)
				}
			}
			if len(ns) == 0 {
				bs.vals = append(bs.vals, math.NaN())
				why := "not run"
				if im, _ := bench.ImplNamed(impl); im.Dense {
					why = "not run: integer keys only"
				}
				bs.labels = append(bs.labels, why)
				continue
			}
			v := median(ns)
			bs.vals = append(bs.vals, v)
			bs.labels = append(bs.labels, fmtNs(v))
		}
		series = append(series, bs)
	}
	barChart(c, impls, "ns per Get", fmtNs, series)
	return c, nil
}

func keyColor(keys string) color.Color {
	if keys == "string" {
		return rgb(0xf28e2b)
	}
	return rgb(0x4e79a7)
}

func distinct[T comparable](rs []bench.Result, f func(bench.Result) T) []T {
	var out []T
	for _, r := range rs {
		if v := f(r); !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// scalingCharts draws, for every configuration run under several GOMAXPROCS
// values (-procs 1,2,4,8), the headline against GOMAXPROCS, one line per
// implementation. Goroutine counts that follow GOMAXPROCS (the steady
// workloads' default) count as one configuration.
func scalingCharts(results []bench.Result) ([]*chart, error) {
	type family struct {
		spec    bench.Spec
		results []bench.Result
	}
	// A family is a configuration less its GOMAXPROCS and goroutines, split
	// by goroutines only where one GOMAXPROCS value ran several.
	var fams []*family
	index := map[string]*family{}
	for _, r := range results {
		s := r.Spec
		s.Impl, s.Seed, s.Procs, s.Goroutines = "", 0, 0, 0
		k := fmt.Sprintf("%+v", s)
		f := index[k]
		if f == nil {
			f = &family{spec: r.Spec}
			index[k] = f
			fams = append(fams, f)
		}
		f.results = append(f.results, r)
	}
	for i := 0; i < len(fams); i++ {
		f := fams[i]
		perProcs := map[int][]int{}
		split := false
		for _, r := range f.results {
			if gs := perProcs[r.Procs]; !slices.Contains(gs, r.Goroutines) {
				perProcs[r.Procs] = append(gs, r.Goroutines)
				split = split || len(gs) > 0
			}
		}
		if !split {
			continue
		}
		var parts []*family
		for _, g := range distinct(f.results, func(r bench.Result) int { return r.Goroutines }) {
			p := &family{}
			for _, r := range f.results {
				if r.Goroutines == g {
					p.results = append(p.results, r)
				}
			}
			p.spec = p.results[0].Spec
			parts = append(parts, p)
		}
		fams = slices.Replace(fams, i, i+1, parts...)
		i += len(parts) - 1
	}
	var charts []*chart
	n := map[string]int{}
	for _, f := range fams {
		procs := distinct(f.results, func(r bench.Result) int { return r.Procs })
		if len(procs) < 2 {
			continue
		}
		s := f.spec
		n[s.Workload]++
		name := "scaling-" + s.Workload
		if n[s.Workload] > 1 {
			name += "-" + strconv.Itoa(n[s.Workload])
		}
		c := &chart{name: name, workload: s.Workload}
		for _, r := range f.results {
			if !slices.Contains(c.groups, groupKey(r.Spec)) {
				c.groups = append(c.groups, groupKey(r.Spec))
			}
		}
		goroutines := "goroutines = GOMAXPROCS"
		if slices.ContainsFunc(f.results, func(r bench.Result) bool { return r.Goroutines != r.Procs }) {
			goroutines = fmt.Sprintf("%d goroutines", s.Goroutines)
			if gs := distinct(f.results, func(r bench.Result) int { return r.Goroutines }); len(gs) > 1 {
				goroutines = "goroutines as run"
			}
		}
		c.title = fmt.Sprintf("%s: %s against GOMAXPROCS, %s, %s", s.Workload, shortHeadline(s), strings.Join(config(s), ", "), goroutines)
		c.caption = fmt.Sprintf("%s under each GOMAXPROCS value run; one line per implementation, medians of the runs. Lower is faster.", groupTitle(f.spec))
		if err := lineChart(c, f.results, "GOMAXPROCS", func(r bench.Result) float64 { return float64(r.Procs) }, headlineLabel(s)); err != nil {
			return nil, err
		}
		charts = append(charts, c)
	}
	return charts, nil
}

func shortHeadline(s bench.Spec) string {
	switch {
	case s.IsStorm():
		return "time until all ready"
	case s.Workload == "hit":
		return "ns per Get"
	}
	return "ns per operation"
}

// lineChart fills c with one line per implementation of headline against
// x, medians of the runs at each x.
func lineChart(c *chart, rs []bench.Result, xLabel string, x func(bench.Result) float64, yLabel string) error {
	p := plot.New()
	c.plot = p
	c.legend = plot.NewLegend()
	var ys, xs []float64
	for i, impl := range implOrder(rs) {
		byX := map[float64][]float64{}
		for _, r := range rs {
			if r.Impl == impl && headline(r) > 0 {
				byX[x(r)] = append(byX[x(r)], headline(r))
			}
		}
		var pts plotter.XYs
		for xv, v := range byX {
			pts = append(pts, plotter.XY{X: xv, Y: median(v)})
			ys, xs = append(ys, median(v)), append(xs, xv)
		}
		if len(pts) == 0 {
			continue
		}
		slices.SortFunc(pts, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		if err := addLine(c, impl, i, pts); err != nil {
			return err
		}
	}
	if len(ys) == 0 {
		return fmt.Errorf("chart %s: nothing to draw", c.name)
	}
	p.Y.Label.Text = yLabel
	if valueAxis(&p.Y, ys, fmtNs, false) {
		p.Y.Label.Text += " (log scale)"
	}
	p.Y.Label.Text += "; lower is faster"
	slices.Sort(xs)
	xs = slices.Compact(xs)
	var ticks []plot.Tick
	for _, v := range xs {
		ticks = append(ticks, plot.Tick{Value: v, Label: fmtCount(v)})
	}
	p.X.Label.Text = xLabel
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = xs[0], xs[len(xs)-1]
	if xs[0] > 0 && xs[len(xs)-1]/xs[0] >= 4 {
		p.X.Scale = plot.LogScale{}
		p.X.Label.Text += " (log scale)"
	}
	if p.X.Min == p.X.Max {
		p.X.Min, p.X.Max = p.X.Min*0.9, p.X.Max*1.1
	}
	p.X.Padding, p.Y.Padding = 8, 8
	grid(p, false)
	c.height = 5 * vg.Inch
	return nil
}

// addLine adds impl's line and its legend entry to c.
func addLine(c *chart, impl string, i int, pts plotter.XYs) error {
	l, s, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	l.Color, s.Color = implColor(impl), implColor(impl)
	l.Width = vg.Points(1.5)
	l.Dashes = plotutil.Dashes(i)
	s.Shape = plotutil.Shape(i)
	s.Radius = vg.Points(3)
	c.plot.Add(l, s)
	c.legend.Add(impl, l, s)
	c.entries++
	return nil
}

// grid adds light grid lines at the major ticks of the value axis.
func grid(p *plot.Plot, vertical bool) {
	g := plotter.NewGrid()
	line := draw.LineStyle{Color: color.Gray{0xdd}, Width: vg.Points(0.5)}
	g.Vertical, g.Horizontal = draw.LineStyle{}, line
	if vertical {
		g.Vertical, g.Horizontal = line, draw.LineStyle{}
	}
	p.Add(g)
}

// firstGroup returns the results of the workload's first configuration
// run under the largest GOMAXPROCS (a sweep has its scaling charts).
func firstGroup(results []bench.Result, workload string) []bench.Result {
	var gs []group
	procs := 0
	for _, g := range groups(results) {
		if g.spec.Workload == workload {
			gs = append(gs, g)
			procs = max(procs, g.spec.Procs)
		}
	}
	for _, g := range gs {
		if g.spec.Procs == procs {
			return g.results
		}
	}
	return nil
}

// plural is "1 duplicate", "3 duplicates".
func plural(n uint64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmtCount(float64(n)) + " " + what + "s"
}

// stormChart draws the first storm: the time until every goroutine had
// every peer, per implementation.
func stormChart(results []bench.Result) (*chart, error) {
	storms := firstGroup(results, "storm")
	if len(storms) == 0 {
		return nil, nil
	}
	s := storms[0].Spec
	c := &chart{name: "storm", workload: "storm", groups: []string{groupKey(s)}}
	c.title = fmt.Sprintf("storm: %d goroutines Get %s peers at once, creation %s, GOMAXPROCS %d", s.Goroutines, fmtCount(float64(s.Peers)), s.Cost, s.Procs)
	c.caption = "Until every goroutine has every peer; an implementation that is not exactly-once shows its duplicate creations. Shorter is faster."
	bs := perImpl(storms, func(r bench.Result) (float64, string) {
		v := float64(r.Completion)
		l := fmtNs(v)
		if r.Duplicates > 0 {
			l += ", " + plural(r.Duplicates, "duplicate")
		}
		return v, l
	})
	barChart(c, implOrder(storms), "time until every goroutine has every peer", fmtNs, []barSeries{bs})
	return c, nil
}

// perImpl is one bar per implementation, coloured by implementation, from
// the median run of each.
func perImpl(rs []bench.Result, value func(bench.Result) (float64, string)) barSeries {
	by := medianRun(rs)
	var bs barSeries
	for _, impl := range implOrder(rs) {
		v, l := value(by[impl])
		bs.vals, bs.labels, bs.colors = append(bs.vals, v), append(bs.labels, l), append(bs.colors, implColor(impl))
	}
	return bs
}

// latencyChart draws the first storm's Get latency against the percentile,
// on a "nines" axis (90, 99, 99.9 equally spaced).
func latencyChart(results []bench.Result) (*chart, error) {
	storms := firstGroup(results, "storm")
	if len(storms) == 0 {
		return nil, nil
	}
	s := storms[0].Spec
	c := &chart{name: "latency", workload: "storm", groups: []string{groupKey(s)}}
	c.title = fmt.Sprintf("storm: Get latency distribution, %d goroutines, %s peers, creation %s, GOMAXPROCS %d", s.Goroutines, fmtCount(float64(s.Peers)), s.Cost, s.Procs)
	c.caption = "Every Get of the storm timed; each step right is ten times rarer. Lower is faster."
	p := plot.New()
	c.plot, c.legend = p, plot.NewLegend()
	by := medianRun(storms)
	var ys []float64
	for i, impl := range implOrder(storms) {
		var pts plotter.XYs
		for _, q := range by[impl].CDF {
			if q.Percentile < 100 && q.Latency > 0 {
				pts = append(pts, plotter.XY{X: nines(q.Percentile), Y: float64(q.Latency)})
				ys = append(ys, float64(q.Latency))
			}
		}
		if len(pts) == 0 {
			continue
		}
		if err := addLine(c, impl, i, pts); err != nil {
			return nil, err
		}
	}
	if len(ys) == 0 {
		return nil, nil
	}
	p.X.Label.Text = "percentile (each step right: ten times rarer)"
	p.X.Min, p.X.Max = 0, nines(99.99)
	p.X.Tick.Marker = plot.ConstantTicks([]plot.Tick{
		{Value: nines(0), Label: "0"}, {Value: nines(50), Label: "50"}, {Value: nines(90), Label: "90"}, {Value: nines(99), Label: "99"},
		{Value: nines(99.9), Label: "99.9"}, {Value: nines(99.99), Label: "99.99"},
	})
	p.Y.Label.Text = "Get latency"
	if valueAxis(&p.Y, ys, fmtNs, false) {
		p.Y.Label.Text += " (log scale)"
	}
	p.X.Padding, p.Y.Padding = 8, 8
	grid(p, false)
	return c, nil
}

func nines(percentile float64) float64 { return -math.Log10(1 - percentile/100) }

// leaseChart draws the first lease run: time per operation, and the
// releases that came under a use, which must be none.
func leaseChart(results []bench.Result) (*chart, error) {
	rs := firstGroup(results, "lease")
	if len(rs) == 0 {
		return nil, nil
	}
	s := rs[0].Spec
	c := &chart{name: "lease", workload: "lease", groups: []string{groupKey(s)}}
	c.title = fmt.Sprintf("lease: ns per Acquire, use and Release, %s", about(s))
	c.caption = "Each operation leases a ready endpoint, uses it and lets go, or invalidates it; a release while a lease uses the endpoint is the bug leases prevent, and is named. Shorter is faster."
	bs := perImpl(rs, func(r bench.Result) (float64, string) {
		l := fmtNs(r.NsPerOp)
		if r.ReleasedInUse > 0 {
			l += fmt.Sprintf(", %s released in use", fmtCount(float64(r.ReleasedInUse)))
		}
		return r.NsPerOp, l
	})
	barChart(c, implOrder(rs), "ns per operation", fmtNs, []barSeries{bs})
	return c, nil
}

// hotsetChart draws the first hotset run's peak of live endpoints, per
// implementation, against its cap.
func hotsetChart(results []bench.Result) (*chart, error) {
	rs := firstGroup(results, "hotset")
	if len(rs) == 0 {
		return nil, nil
	}
	s := rs[0].Spec
	c := &chart{name: "hotset", workload: "hotset", groups: []string{groupKey(s)}}
	c.title = fmt.Sprintf("hotset: peak live endpoints against the cap of %s, %s", fmtCount(float64(s.Cap)), hotsetAbout(s))
	c.caption = "The most endpoints live at once, creations included; the dashed line is the cap. A comparator without a bound shows how far past it a hot set takes it."
	bs := perImpl(rs, func(r bench.Result) (float64, string) {
		l := fmtCount(float64(r.PeakLive))
		if o := r.Overshoot(); o > 0 {
			l += fmt.Sprintf(" (%s over the cap)", fmtCount(float64(o)))
		}
		return float64(r.PeakLive), l
	})
	impls := implOrder(rs)
	barChart(c, impls, "peak live endpoints", fmtCount, []barSeries{bs}, float64(s.Cap))
	// The cap: a dashed line across the bars.
	capLine, err := plotter.NewLine(plotter.XYs{{X: float64(s.Cap), Y: -0.5}, {X: float64(s.Cap), Y: float64(len(impls)) - 0.5}})
	if err != nil {
		return nil, err
	}
	capLine.Color = color.Black
	capLine.Width = vg.Points(1.5)
	capLine.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	c.plot.Add(capLine)
	c.legend.Add("cap "+fmtCount(float64(s.Cap)), capLine)
	c.entries++
	return c, nil
}

func hotsetAbout(s bench.Spec) string {
	dist := "uniform access"
	if s.Dist == "zipf" {
		dist = fmt.Sprintf("Zipf s=%g", s.Zipf)
	}
	return fmt.Sprintf("%s over %s peers, %d goroutines, GOMAXPROCS %d", dist, fmtCount(float64(s.Peers)), s.Goroutines, s.Procs)
}

// hotsetHitsChart draws the first hotset run's hit ratio per
// implementation, with its speed.
func hotsetHitsChart(results []bench.Result) (*chart, error) {
	rs := firstGroup(results, "hotset")
	if len(rs) == 0 {
		return nil, nil
	}
	s := rs[0].Spec
	c := &chart{name: "hotset-hits", workload: "hotset", groups: []string{groupKey(s)}}
	c.title = fmt.Sprintf("hotset: hit ratio under a cap of %s, %s", fmtCount(float64(s.Cap)), hotsetAbout(s))
	c.caption = "The share of operations that created nothing, beside each implementation's time per operation."
	bs := perImpl(rs, func(r bench.Result) (float64, string) {
		return 100 * r.HitRatio, fmt.Sprintf("%s%%, %s per operation", sig(100*r.HitRatio), fmtNs(r.NsPerOp))
	})
	barChart(c, implOrder(rs), "hit ratio, % of operations", func(v float64) string { return sig(v) + "%" }, []barSeries{bs})
	c.plot.X.Min, c.plot.X.Max = 0, 100
	c.plot.X.Label.Text = "hit ratio, % of operations that created nothing; longer is better"
	return c, nil
}

// headlineChart draws one group's headline per implementation: the chart of
// a configuration no other chart draws.
func headlineChart(g group) (*chart, error) {
	s := g.spec
	c := &chart{workload: s.Workload, groups: []string{groupKey(s)}}
	c.title = fmt.Sprintf("%s: %s, %s", s.Workload, shortHeadline(s), about(s))
	c.caption = groupTitle(s) + ": medians of the runs. Shorter is faster."
	bs := perImpl(g.results, func(r bench.Result) (float64, string) {
		l := fmtNs(headline(r))
		if r.Duplicates > 0 {
			l += ", " + plural(r.Duplicates, "duplicate")
		}
		return headline(r), l
	})
	barChart(c, implOrder(g.results), headlineLabel(s), fmtNs, []barSeries{bs})
	return c, nil
}

// barSeries is one series of a bar chart: a value per category (NaN: not
// measured, and labelled so), a label beside each bar, and one colour or a
// colour per bar.
type barSeries struct {
	name   string // the legend entry; none for a single series
	vals   []float64
	labels []string
	color  color.Color
	colors []color.Color
}

// barChart fills c with horizontal bars: categories top to bottom in the
// order given, each series a bar in each category, labels right of the
// bars. The value axis is logarithmic when the values (and extra, such as
// a cap) span more than 10×.
func barChart(c *chart, cats []string, valueLabel string, format func(float64) string, series []barSeries, extra ...float64) {
	p := plot.New()
	c.plot, c.legend = p, plot.NewLegend()
	b := &hbars{cats: len(cats), series: series, text: p.X.Tick.Label}
	b.text.XAlign, b.text.YAlign = draw.XLeft, draw.YCenter
	var vals []float64
	for _, s := range series {
		for _, v := range s.vals {
			if !math.IsNaN(v) {
				vals = append(vals, v)
			}
		}
	}
	if len(vals) == 0 {
		vals = []float64{1}
	}
	p.X.Label.Text = valueLabel
	log := valueAxis(&p.X, append(vals, extra...), format, true)
	if log {
		p.X.Label.Text += " (log scale)"
	}
	if !strings.Contains(valueLabel, "hit ratio") && !strings.Contains(valueLabel, "peak") {
		p.X.Label.Text += "; shorter is faster"
	}
	grid(p, true)
	p.Add(b)
	names := slices.Clone(cats)
	slices.Reverse(names) // the first category on top
	p.NominalY(names...)
	p.Y.Min, p.Y.Max = -0.5, float64(len(cats))-0.5
	p.Y.Padding = 0
	p.Y.Label.Text = "implementation"
	for _, s := range series {
		if s.name != "" {
			c.legend.Add(s.name, swatch{s.color})
			c.entries++
		}
	}
	rows := len(cats) * max(len(series), 1)
	c.height = max(3*vg.Inch, vg.Length(rows)*vg.Points(15)+vg.Length(len(cats))*vg.Points(8)+1.6*vg.Inch)
}

// hbars draws the series of a bar chart (see barChart): the bars of one
// category stacked top to bottom within its band, each from the value
// axis's minimum (a log axis has no zero) to its value.
type hbars struct {
	cats   int
	series []barSeries
	text   text.Style
}

func (b *hbars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	band := trY(1) - trY(0)
	if b.cats < 2 {
		band = c.Size().Y
	}
	thick := band * 0.7 / vg.Length(len(b.series))
	_, log := p.X.Scale.(plot.LogScale)
	base := trX(math.Max(p.X.Min, 0))
	if log {
		base = trX(p.X.Min)
	}
	for j, s := range b.series {
		off := (vg.Length(len(b.series)-1)/2 - vg.Length(j)) * thick
		for i, v := range s.vals {
			y := trY(float64(b.cats-1-i)) + off
			if math.IsNaN(v) || log && v <= 0 { // a log axis has no place for 0: the label alone, at the base
				sty := b.text
				sty.Color = color.Gray{0x70}
				c.FillText(sty, vg.Point{X: base + 4, Y: y}, s.labels[i])
				continue
			}
			x := trX(v)
			col := s.color
			if s.colors != nil {
				col = s.colors[i]
			}
			rect := []vg.Point{{X: base, Y: y - thick/2}, {X: base, Y: y + thick/2}, {X: x, Y: y + thick/2}, {X: x, Y: y - thick/2}}
			c.FillPolygon(col, c.ClipPolygonX(rect))
			c.StrokeLines(draw.LineStyle{Color: color.Gray{0x40}, Width: vg.Points(0.5)}, c.ClipLinesX(append(rect, rect[0]))...)
			if i < len(s.labels) {
				c.FillText(b.text, vg.Point{X: x + 4, Y: y}, s.labels[i])
			}
		}
	}
}

// GlyphBoxes reserves room right of the longest bars for their labels.
func (b *hbars) GlyphBoxes(p *plot.Plot) []plot.GlyphBox {
	_, log := p.X.Scale.(plot.LogScale)
	var boxes []plot.GlyphBox
	for _, s := range b.series {
		for i, v := range s.vals {
			if math.IsNaN(v) || log && v <= 0 || i >= len(s.labels) {
				continue
			}
			r := b.text.Rectangle(s.labels[i])
			boxes = append(boxes, plot.GlyphBox{
				X: p.X.Norm(v), Y: p.Y.Norm(float64(b.cats - 1 - i)),
				Rectangle: vg.Rectangle{Min: vg.Point{X: 4, Y: r.Min.Y}, Max: vg.Point{X: 4 + r.Size().X, Y: r.Max.Y}},
			})
		}
	}
	return boxes
}

// swatch is a legend thumbnail: a filled square.
type swatch struct{ color color.Color }

func (s swatch) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(s.color, []vg.Point{c.Min, {X: c.Min.X, Y: c.Max.Y}, c.Max, {X: c.Max.X, Y: c.Min.Y}})
}

// valueAxis sets a's range, scale and ticks for vals: logarithmic when they
// span more than 10×, linear from zero otherwise (or from a little below
// the smallest value, where zero need not show). It reports whether it
// chose a log scale.
func valueAxis(a *plot.Axis, vals []float64, format func(float64) string, fromZero bool) bool {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vals {
		if v > 0 {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 10
	}
	if hi/lo > 10 {
		a.Scale = plot.LogScale{}
		a.Min, a.Max = stepBelow(lo), stepAbove(hi)
		if a.Min > lo*0.95 {
			// The shortest bar must show: 1,000 against a cap of 1,000.
			a.Min = stepBelow(a.Min * 0.99)
		}
		if a.Max/a.Min > 100 {
			// Whole decades, every one labelled (see logTicks).
			a.Min, a.Max = math.Pow10(int(math.Floor(math.Log10(lo)))), math.Pow10(int(math.Ceil(math.Log10(hi))))
		}
		a.Tick.Marker = logTicks{format}
		return true
	}
	// A round maximum, so that the last tick is labelled.
	step := stepAbove(hi / 5)
	a.Min, a.Max = 0, math.Ceil(hi*1.02/step)*step
	if !fromZero {
		a.Min = math.Floor(lo*0.9/step) * step
	}
	a.Tick.Marker = linearTicks{format}
	return false
}

// stepBelow and stepAbove round to the 1-2-5 sequence: 7.6 to 5 and 10.
func stepBelow(v float64) float64 {
	d := math.Pow10(int(math.Floor(math.Log10(v))))
	for _, m := range []float64{5, 2, 1} {
		if m*d <= v {
			return m * d
		}
	}
	return d
}

func stepAbove(v float64) float64 {
	d := math.Pow10(int(math.Floor(math.Log10(v))))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*d >= v {
			return m * d
		}
	}
	return 10 * d
}

// logTicks marks 1, 2 and 5 of each decade where the axis spans two decades
// or less, and each decade (with unlabelled minor ticks) otherwise.
type logTicks struct{ format func(float64) string }

func (t logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	fine := hi/lo <= 100
	for d := math.Pow10(int(math.Floor(math.Log10(lo)))); d <= hi; d *= 10 {
		for m := 1.0; m < 10; m++ {
			v := m * d
			if v < lo*0.999 || v > hi*1.001 {
				continue
			}
			label := ""
			if m == 1 || fine && (m == 2 || m == 5) {
				label = t.format(v)
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: label})
		}
	}
	return ticks
}

// linearTicks are gonum's, labelled in the chart's unit.
type linearTicks struct{ format func(float64) string }

func (t linearTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = t.format(ticks[i].Value)
		}
	}
	return ticks
}

// fmtNs prints a duration given in nanoseconds in its unit, to three
// significant digits: 7.6 ns, 22 ms, 1.13 s.
func fmtNs(ns float64) string {
	switch a := math.Abs(ns); {
	case a == 0:
		return "0"
	case a < 1e3:
		return sig(ns) + " ns"
	case a < 1e6:
		return sig(ns/1e3) + " µs"
	case a < 1e9:
		return sig(ns/1e6) + " ms"
	}
	return sig(ns/1e9) + " s"
}

// sig prints v to three significant digits, in plain decimal.
func sig(v float64) string {
	if v == 0 {
		return "0"
	}
	d := max(2-int(math.Floor(math.Log10(math.Abs(v)))), 0)
	s := strconv.FormatFloat(v, 'f', d, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// fmtCount prints a count with thousands separators: 36,968.
func fmtCount(v float64) string {
	if v != math.Trunc(v) || math.Abs(v) >= 1e15 {
		return sig(v)
	}
	s := strconv.FormatInt(int64(math.Abs(v)), 10)
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}
