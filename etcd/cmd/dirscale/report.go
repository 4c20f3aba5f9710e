package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/epcache/epcache/etcd/internal/etcdmetrics"
)

// Report is everything one invocation measured, fitted and projected.
type Report struct {
	Machine     Machine      `json:"machine"`
	Command     string       `json:"command"`
	Runs        []Run        `json:"runs"`
	Fits        []Fit        `json:"fits"`
	Projections []Projection `json:"projections"`
	Coalescing  *Coalescing  `json:"coalescing,omitempty"`
	Failures    []string     `json:"failures,omitempty"`
}

// Machine is where the runs ran.
type Machine struct {
	GOOS   string  `json:"goos"`
	GOARCH string  `json:"goarch"`
	CPUs   int     `json:"cpus"`
	Model  string  `json:"cpu_model"`
	MemGiB float64 `json:"mem_gib"`
	Go     string  `json:"go"`
}

func machine() Machine {
	m := Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.Model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %f kB", &kb); err == nil {
			m.MemGiB = math.Round(kb/(1<<20)*10) / 10
		}
	}
	return m
}

// metrics are the counts fitted: name, and how to read it from a run.
var metrics = []struct {
	name string
	of   func(Run) float64
}{
	{"etcd events sent", func(r Run) float64 { return r.Etcd.EventsSent }},
	{"keys delivered", func(r Run) float64 { return float64(r.Delivered) }},
	{"event bytes", func(r Run) float64 { return float64(r.Dir.EventBytes) }},
	{"etcd bytes sent", func(r Run) float64 { return r.Etcd.SentBytes }},
	{"requests", func(r Run) float64 { return float64(r.Dir.Requests()) }},
	{"range requests", func(r Run) float64 { return float64(r.Dir.Ranges) }},
	{"etcd CPU s", func(r Run) float64 { return r.EtcdCPU }},
}

// Fit is the growth of one count in one mode: count ≈ e^Intercept ·
// N^Slope, least squares on log-log.
type Fit struct {
	Mode      string    `json:"mode"`
	Metric    string    `json:"metric"`
	Slope     float64   `json:"slope"`
	Intercept float64   `json:"intercept"`
	Ns        []float64 `json:"ns"`
}

// Projection is what the fits say of larger jobs: not measured.
type Projection struct {
	Mode   string             `json:"mode"`
	N      int                `json:"n"`
	Counts map[string]float64 `json:"counts"`
}

var projectTo = []int{10_000, 100_000}

// minCPU is the least etcd CPU time, in seconds, of a run whose CPU time
// is fitted: 10 ticks of /proc's 10 ms.
const minCPU = 0.1

func (rep *Report) fit() {
	byMode := map[string][]Run{}
	var order []string
	for _, r := range rep.Runs {
		if _, ok := byMode[r.Mode]; !ok {
			order = append(order, r.Mode)
		}
		byMode[r.Mode] = append(byMode[r.Mode], r)
	}
	for _, m := range order {
		runs := byMode[m]
		projs := make([]Projection, len(projectTo))
		for i, n := range projectTo {
			projs[i] = Projection{Mode: m, N: n, Counts: map[string]float64{}}
		}
		for _, mt := range metrics {
			var xs, ys []float64
			for _, r := range runs {
				if mt.name == "etcd CPU s" && r.EtcdCPU < minCPU {
					continue // mostly the 10 ms ticks of /proc, and etcd's own idle work
				}
				xs = append(xs, float64(r.N))
				ys = append(ys, mt.of(r))
			}
			slope, icpt, ok := etcdmetrics.Fit(xs, ys)
			if !ok {
				continue
			}
			rep.Fits = append(rep.Fits, Fit{Mode: m, Metric: mt.name, Slope: slope, Intercept: icpt, Ns: xs})
			for i, n := range projectTo {
				projs[i].Counts[mt.name] = math.Exp(icpt) * math.Pow(float64(n), slope)
			}
		}
		rep.Projections = append(rep.Projections, projs...)
	}
}

func (rep *Report) slope(mode, metric string) (float64, bool) {
	for _, f := range rep.Fits {
		if f.Mode == mode && f.Metric == metric {
			return f.Slope, true
		}
	}
	return 0, false
}

func writeText(w io.Writer, rep *Report) error {
	m := rep.Machine
	fmt.Fprintf(w, "dirscale: what etcddir costs etcd as the job grows, counted on one machine\n")
	fmt.Fprintf(w, "machine: %d CPUs (%s), %.1f GiB, %s/%s, %s\n", m.CPUs, m.Model, m.MemGiB, m.GOOS, m.GOARCH, m.Go)
	fmt.Fprintf(w, "command: cd etcd && GOWORK=off go run ./cmd/%s\n\n", rep.Command)
	fmt.Fprintln(w, "Each run: a fresh etcd (one member, in a process of its own); N directories, each with its own client, in this process;")
	fmt.Fprintln(w, "every process opens its directory, then every process publishes, then every process learns the peers it uses (d).")
	fmt.Fprintln(w, "Counted from the start of the opens to the last process done. etcd events sent, bytes sent, etcd CPU: the server's")
	fmt.Fprintln(w, "metrics and /proc; keys delivered (events + keys read), event bytes, requests, range requests: the directories' Counters.")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tN\td\tetcd events sent\tkeys delivered\tevent bytes\tetcd bytes sent\trequests\trange requests\twatchers\treloads\tmax events/proc\tetcd CPU s\tetcd µs/event\tclient CPU s\twall s\t")
	for _, r := range rep.Runs {
		perEvent := "-"
		if r.Etcd.EventsSent > 0 {
			perEvent = fmt.Sprintf("%.1f", r.EtcdCPU/r.Etcd.EventsSent*1e6)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%d\t%d\t%.0f\t%d\t%d\t%.0f\t%d\t%d\t%.2f\t%s\t%.2f\t%.1f\t\n",
			r.Mode, r.N, r.D, r.Etcd.EventsSent, r.Delivered, r.Dir.EventBytes, r.Etcd.SentBytes, r.Dir.Requests(), r.Dir.Ranges,
			r.Etcd.Watchers, r.Dir.Reloads, r.MaxEvents, r.EtcdCPU, perEvent, r.ClientCPU, r.Wall)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nwatchers: etcd's watchers at the end of the start (gauge). etcd µs/event: etcd's CPU time over the events it sent,")
	fmt.Fprintln(w, "which charges every other cost of the start to the events. CPU times have 10 ms resolution.")

	if err := writeSideBySide(w, rep); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nGrowth: the slope of log(count) against log(N), least squares over the N measured (2: quadratic, 1: linear);")
	fmt.Fprintf(w, "etcd CPU only over the runs where etcd used at least %.1f s.\n", minCPU)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "mode\t")
	for _, mt := range metrics {
		fmt.Fprintf(tw, "%s\t", mt.name)
	}
	fmt.Fprintln(tw)
	for _, mode := range modesIn(rep) {
		fmt.Fprintf(tw, "%s\t", mode)
		for _, mt := range metrics {
			if s, ok := rep.slope(mode, mt.name); ok {
				fmt.Fprintf(tw, "%.2f\t", s)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nPROJECTION, not measured: each count extrapolated along its fitted line to N = 10,000 and 100,000 (one etcd member; a")
	fmt.Fprintln(w, "real cluster replicates writes but serves watches and serializable reads from the member each client talks to).")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tN\tetcd events sent\tetcd bytes sent\trequests\tetcd CPU s (fit)\ts to send the events at 75k/s\t")
	for _, p := range rep.Projections {
		c := p.Counts
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", p.Mode, p.N, sci(c["etcd events sent"]), sci(c["etcd bytes sent"]), sci(c["requests"]),
			sci(c["etcd CPU s"]), sci(c["etcd events sent"]/75_000))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "s to send the events at 75k/s: the projected events alone, at the rate etcd #4686 measured delivering to 10k watchers")
	fmt.Fprintln(w, "(46k-95k/s); it leaves out the requests, which cost the OnDemand modes most.")
	fmt.Fprintln(w, "Leases: one per process, so a dead job of N processes leaves etcd over at least N/1000 s (etcd revokes at most 1,000")
	fmt.Fprintln(w, "leases a second): 10 s at 10,000, 100 s at 100,000 (also a projection).")
	fmt.Fprintln(w, "Reloads: no run lost a watch (0 above). A mirror that does reads the prefix again, N keys in N/PageSize requests:")
	fmt.Fprintln(w, "a compaction past every mirror's watch costs a job N² keys at once; not measured here.")
	if c := rep.Coalescing; c != nil {
		fmt.Fprintf(w, "\nCoalescing, OnDemand: %d goroutines in each of %d layers of one process (one calls Resolve, the other Lookup\n", c.PerLayer, c.Layers)
		fmt.Fprintf(w, "and then Resolve) ask for each of %d peers, all at once; peers that publish only while their askers wait: %d.\n", c.Peers, c.Peers-c.Published)
		fmt.Fprintf(w, "  answers %d (every one checked), Resolve calls %d, fetches %d, range requests %d, watches %d:\n", c.Asks, c.Resolves, c.Fetches, c.Ranges, c.Watches)
		fmt.Fprintf(w, "  %.2f range requests per distinct peer asked for, %.2f watches per peer not yet published (etcd counted %.0f ranges, with the publisher's)\n",
			float64(c.Ranges)/float64(c.Peers), float64(c.Watches)/float64(max(c.Peers-c.Published, 1)), c.Etcd.Ranges)
	}
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "\nFAILED: %s\n", f)
	}
	return nil
}

// writeSideBySide prints etcd's CPU time per N, the modes side by side.
func writeSideBySide(w io.Writer, rep *Report) error {
	ms := modesIn(rep)
	cpu := map[string]map[int]float64{}
	var ns []int
	for _, r := range rep.Runs {
		if cpu[r.Mode] == nil {
			cpu[r.Mode] = map[int]float64{}
		}
		cpu[r.Mode][r.N] = r.EtcdCPU
		if !slices.Contains(ns, r.N) {
			ns = append(ns, r.N)
		}
	}
	slices.Sort(ns)
	fmt.Fprintln(w, "\netcd CPU s for the start, the modes side by side:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "N\t")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t", m)
	}
	fmt.Fprintln(tw)
	for _, n := range ns {
		fmt.Fprintf(tw, "%d\t", n)
		for _, m := range ms {
			if v, ok := cpu[m][n]; ok {
				fmt.Fprintf(tw, "%.2f\t", v)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// sci prints v with three significant digits.
func sci(v float64) string {
	if v == 0 || math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.3g", v)
}

func modesIn(rep *Report) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range rep.Runs {
		if !seen[r.Mode] {
			seen[r.Mode] = true
			out = append(out, r.Mode)
		}
	}
	return out
}

// write writes results.txt and results.json into dir.
func (rep *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "results.txt"))
	if err != nil {
		return err
	}
	if err := writeText(f, rep); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644)
}
