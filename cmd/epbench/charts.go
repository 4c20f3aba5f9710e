package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/epcache/epcache/bench"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// writeCharts renders, as SVG and PNG in dir: hit throughput against
// goroutines (or GOMAXPROCS) per implementation, the storm completion time
// per implementation, and the storm's Get latency distribution. A chart
// whose workload did not run is skipped.
func writeCharts(dir string, results []bench.Result) error {
	charts := map[string]func([]bench.Result) (*plot.Plot, error){
		"throughput": throughputChart,
		"storm":      stormChart,
		"latency":    latencyChart,
	}
	for name, draw := range charts {
		p, err := draw(results)
		if err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		if p == nil {
			continue
		}
		for _, ext := range []string{".svg", ".png"} {
			if err := p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, name+ext)); err != nil {
				return fmt.Errorf("chart %s: %w", name, err)
			}
		}
	}
	return nil
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

// throughputChart plots hit ops/s of uint64 keys, uniform access, against
// the goroutine count, or GOMAXPROCS when that is what varied; with a single
// setting it shows one bar per implementation and key type.
func throughputChart(results []bench.Result) (*plot.Plot, error) {
	var hits []bench.Result
	for _, r := range results {
		if r.Workload == "hit" && r.Dist == "uniform" {
			hits = append(hits, r)
		}
	}
	if len(hits) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Y.Label.Text = "Gets per second"
	xs := map[int]bool{}
	for _, r := range hits {
		xs[r.Goroutines] = true
	}
	x := func(r bench.Result) int { return r.Goroutines }
	p.X.Label.Text = "goroutines"
	if len(xs) < 2 {
		clear(xs)
		for _, r := range hits {
			xs[r.Procs] = true
		}
		x = func(r bench.Result) int { return r.Procs }
		p.X.Label.Text = "GOMAXPROCS (one goroutine per P)"
	}
	if len(xs) < 2 {
		return hitBars(p, hits)
	}
	p.Title.Text = fmt.Sprintf("hit: throughput, %d peers, uint64 keys, uniform", hits[0].Peers)
	var lines []any
	for _, impl := range implOrder(hits) {
		var pts plotter.XYs
		for _, r := range hits {
			if r.Impl == impl && r.Keys == "uint64" && r.Peers == hits[0].Peers {
				pts = append(pts, plotter.XY{X: float64(x(r)), Y: r.OpsPerSec})
			}
		}
		slices.SortFunc(pts, func(a, b plotter.XY) int { return int(a.X - b.X) })
		if len(pts) > 0 {
			lines = append(lines, impl, pts)
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	p.Legend.Top, p.Legend.Left = true, true
	return p, nil
}

func hitBars(p *plot.Plot, hits []bench.Result) (*plot.Plot, error) {
	impls := implOrder(hits)
	p.Title.Text = fmt.Sprintf("hit: ns per Get, %d peers, GOMAXPROCS=%d (smaller is better)", hits[0].Peers, hits[0].Procs)
	p.Y.Label.Text = "ns per Get"
	w := vg.Points(14)
	for i, keys := range []string{"uint64", "string"} {
		vals := make(plotter.Values, len(impls))
		for j, impl := range impls {
			var ns []float64
			for _, r := range hits {
				if r.Impl == impl && r.Keys == keys {
					ns = append(ns, r.NsPerOp)
				}
			}
			vals[j] = median(ns)
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, err
		}
		bars.Color = plotutil.Color(i)
		bars.Offset = vg.Length(2*i-1) * w / 2
		p.Add(bars)
		p.Legend.Add("keys="+keys, bars)
	}
	p.NominalX(impls...)
	p.Legend.Top = true
	return p, nil
}

// firstStorm is the storm the charts show: every result of the first storm
// spec run, all implementations and repetitions.
func firstStorm(results []bench.Result) []bench.Result {
	var key string
	var storms []bench.Result
	for _, r := range results {
		if r.Workload != "storm" {
			continue
		}
		s := r.Spec
		s.Impl, s.Seed = "", 0
		k := fmt.Sprintf("%+v", s)
		if key == "" {
			key = k
		}
		if k == key {
			storms = append(storms, r)
		}
	}
	return storms
}

func stormChart(results []bench.Result) (*plot.Plot, error) {
	storms := firstStorm(results)
	if len(storms) == 0 {
		return nil, nil
	}
	impls := implOrder(storms)
	vals := make(plotter.Values, len(impls))
	for i, impl := range impls {
		var ms []float64
		for _, r := range storms {
			if r.Impl == impl {
				ms = append(ms, float64(r.Completion)/float64(time.Millisecond))
			}
		}
		vals[i] = median(ms)
	}
	s := storms[0]
	p := plot.New()
	p.Title.Text = fmt.Sprintf("storm: time until all ready, P=%d, G=%d, %s (smaller is better)", s.Peers, s.Goroutines, s.Cost)
	p.Y.Label.Text = "milliseconds"
	bars, err := plotter.NewBarChart(vals, vg.Points(24))
	if err != nil {
		return nil, err
	}
	bars.Color = plotutil.Color(0)
	p.Add(bars)
	// A linear axis shows the ratios as they are; the labels keep the short
	// bars readable.
	var xys plotter.XYs
	var labels []string
	for i, v := range vals {
		xys = append(xys, plotter.XY{X: float64(i), Y: v})
		labels = append(labels, fmt.Sprintf("%.3g", v))
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].XAlign = -0.5
		l.TextStyle[i].YAlign = 0.2
	}
	p.Add(l)
	p.NominalX(impls...)
	return p, nil
}

// latencyChart plots the storm's Get latency against the percentile, on a
// "nines" axis (90, 99, 99.9 equally spaced).
func latencyChart(results []bench.Result) (*plot.Plot, error) {
	storms := firstStorm(results)
	if len(storms) == 0 {
		return nil, nil
	}
	s := storms[0]
	p := plot.New()
	p.Title.Text = fmt.Sprintf("storm: Get latency distribution, P=%d, G=%d, %s", s.Peers, s.Goroutines, s.Cost)
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "latency, µs (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.X.Tick.Marker = plot.ConstantTicks([]plot.Tick{
		{Value: nines(0), Label: "0"}, {Value: nines(90), Label: "90"}, {Value: nines(99), Label: "99"},
		{Value: nines(99.9), Label: "99.9"}, {Value: nines(99.99), Label: "99.99"},
	})
	var lines []any
	for _, impl := range implOrder(storms) {
		for _, r := range storms {
			if r.Impl != impl {
				continue
			}
			var pts plotter.XYs
			for _, q := range r.CDF {
				if q.Percentile < 100 && q.Latency > 0 {
					pts = append(pts, plotter.XY{X: nines(q.Percentile), Y: float64(q.Latency) / float64(time.Microsecond)})
				}
			}
			lines = append(lines, impl, pts)
			break
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	p.Legend.Top, p.Legend.Left = true, true
	return p, nil
}

func nines(percentile float64) float64 { return -math.Log10(1 - percentile/100) }
