// Command grpcbench runs the eight scenarios of package dskitbench, each
// against grpcpool (epcache) and Grafana dskit's ring/client.Pool in the
// same process, prints a side-by-side table per scenario and writes it,
// with the machine it ran on, to results.txt and results.json.
//
// Run it from the dskitbench module's directory:
//
//	cd transport/grpcpool/dskitbench && GOWORK=off go run ./cmd/grpcbench -out ../../../results/grpcpool
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool/dskitbench"
)

func main() {
	dskitbench.MaybeServe() // scenario 7's server process
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grpcbench:", err)
		os.Exit(1)
	}
}

// Machine is what the results ran on.
type Machine struct {
	CPUs        int    `json:"nproc"`
	CPU         string `json:"cpu"`
	Go          string `json:"go"`
	Kernel      string `json:"kernel"`
	Date        string `json:"date"`
	LoadBefore  string `json:"load_before"`
	LoadAfter   string `json:"load_after"`
	Command     string `json:"command"`
	Elapsed     string `json:"elapsed"`
	DskitModule string `json:"dskit"`
}

func run() error {
	testing.Init() // testing.Benchmark reads -test.benchtime
	out := flag.String("out", "", "directory to write results.txt and results.json into (created); none: print only")
	only := flag.String("only", "", "comma-separated scenarios to run (1-8); all if empty")
	quick := flag.Bool("quick", false, "smaller sizes and shorter runs, for a smoke test")
	benchtime := flag.Duration("benchtime", 500*time.Millisecond, "benchtime of each overhead benchmark run (scenario 6)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: grpcbench [flags]\n\nRuns the eight gRPC pool scenarios against grpcpool and dskit's ring/client.Pool.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := flag.Set("test.benchtime", benchtime.String()); err != nil {
		return err
	}
	cfg := dskitbench.Default
	if *quick {
		cfg = dskitbench.Quick
	}
	var want []string
	if *only != "" {
		want = strings.Split(*only, ",")
	}
	m := machine()
	m.Command = "GOWORK=off go run ./cmd/grpcbench " + strings.Join(os.Args[1:], " ")
	start := time.Now()
	var tables []*dskitbench.Table
	var text strings.Builder
	w := io.MultiWriter(os.Stdout, &text)
	header(w, m)
	for _, s := range dskitbench.Scenarios {
		if want != nil && !slices.Contains(want, s.ID) {
			continue
		}
		fmt.Fprintf(os.Stderr, "scenario %s…\n", s.ID)
		t, err := s.Measure(cfg)
		if err != nil {
			return err
		}
		t.Write(w)
		tables = append(tables, t)
	}
	m.Elapsed = time.Since(start).Round(time.Second).String()
	m.LoadAfter = loadavg()
	fmt.Fprintf(w, "elapsed %s; load average after: %s\n", m.Elapsed, m.LoadAfter)
	if *out == "" {
		return nil
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "results.txt"), []byte(text.String()), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(struct {
		Machine   Machine             `json:"machine"`
		Scenarios []*dskitbench.Table `json:"scenarios"`
	}{m, tables}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "results.json"), append(js, '\n'), 0o644)
}

func header(w io.Writer, m Machine) {
	fmt.Fprintf(w, "grpcpool (epcache) vs dskit ring/client.Pool (%s)\n", m.DskitModule)
	fmt.Fprintf(w, "machine: nproc %d, %s, %s, kernel %s\n", m.CPUs, m.CPU, m.Go, m.Kernel)
	fmt.Fprintf(w, "date: %s; load average before: %s (a shared machine: others' work runs beside this)\n", m.Date, m.LoadBefore)
	fmt.Fprintf(w, "command (in transport/grpcpool/dskitbench): %s\n\n", m.Command)
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), LoadBefore: loadavg(),
		DskitModule: "github.com/grafana/dskit v0.0.0-20260703122047-de1ec7541c44"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.Go = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("uname", "-srm").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	return m
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
