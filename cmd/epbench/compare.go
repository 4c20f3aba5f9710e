package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/epcache/epcache/bench"
)

// references are the comparators epcache is measured against, per workload,
// in -compare. Only ratios taken within one run are compared across runs:
// absolute times of two machines say nothing about each other.
var references = map[string][]string{
	"hit":   {"syncmap", "xsync4"},
	"storm": {"mutex", "xsync"},
	"churn": {"syncmap"},
	"flaky": {"mutex"},
	"mixed": {"syncmap"},
	"lease": {"pool"},
	// tcpstorm is compared only with a modelled round trip (see
	// compared): on bare loopback its times swing with the scheduler, and
	// its fd and leak checks are what those runs are for.
	"tcpstorm": {"array", "mutex"},
}

// compared reports whether -compare holds a spec's ratios to the
// baseline's.
func compared(s bench.Spec) bool { return !s.IsMesh() || s.RTT > 0 }

type ratio struct {
	name     string
	baseline float64
	current  float64
}

// compare prints, for every spec present in both runs, epcache's headline
// measure divided by each reference comparator's, in the baseline and now,
// and fails if a current ratio is worse than margin times the baseline's.
func compare(w io.Writer, baselinePath string, current []bench.Result, margin float64) error {
	data, err := os.ReadFile(baselinePath)
	if err != nil {
		return fmt.Errorf("-compare: %w", err)
	}
	var baseline []bench.Result
	if err := json.Unmarshal(data, &baseline); err != nil {
		return fmt.Errorf("-compare: %s: %w", baselinePath, err)
	}
	base := ratios(baseline)
	var rows []ratio
	for name, cur := range ratios(current) {
		if b, ok := base[name]; ok {
			rows = append(rows, ratio{name, b, cur})
		}
	}
	if len(rows) == 0 {
		return fmt.Errorf("-compare: no run of epcache and a reference comparator is in both %s and this run", baselinePath)
	}
	slices.SortFunc(rows, func(a, b ratio) int { return strings.Compare(a.name, b.name) })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\nepcache ÷ reference (smaller is better)\tbaseline\tnow\tlimit (×%g)\t\n", margin)
	var worse []string
	for _, r := range rows {
		verdict := "ok"
		if r.current > r.baseline*margin {
			verdict = "WORSE"
			worse = append(worse, fmt.Sprintf("%s: %.3f, baseline %.3f", r.name, r.current, r.baseline))
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%s\n", r.name, r.baseline, r.current, r.baseline*margin, verdict)
	}
	tw.Flush()
	if len(worse) > 0 {
		return fmt.Errorf("ratios more than %g× worse than the baseline: %s", margin, strings.Join(worse, "; "))
	}
	return nil
}

// ratios returns epcache's headline over each reference's, by spec name,
// from the medians of repeated runs.
func ratios(results []bench.Result) map[string]float64 {
	out := map[string]float64{}
	for _, g := range groups(results) {
		byImpl := map[string][]float64{}
		for _, r := range g.results {
			byImpl[r.Impl] = append(byImpl[r.Impl], headline(r))
		}
		ep := median(byImpl["epcache"])
		if ep == 0 || !compared(g.spec) {
			continue
		}
		for _, ref := range references[g.spec.Workload] {
			if v := median(byImpl[ref]); v > 0 {
				s := g.spec
				s.Impl = "epcache÷" + ref
				out[fmt.Sprintf("%s procs=%d", s.Name(), s.Procs)] = ep / v
			}
		}
	}
	return out
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	return vs[len(vs)/2]
}
