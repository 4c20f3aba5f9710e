// Command epmesh runs a mesh of separate processes on this machine, each a
// transport/tcp peer with its own endpoint cache, finding each other
// through etcd: the embedded one it starts by default (package etcdtest),
// or an existing cluster given with -etcd. It is the multi-process
// counterpart of transport/tcp's in-process mesh tests and of epbench's
// tcpstorm.
//
// The parent process starts N children (its own binary again, told by the
// environment variable EPMESH_CHILD=1 that it is one), gives each a key
// prefix in etcd unique to the run, its id and N, and drives them over
// their stdin and stdout, one JSON object per line: requests from the
// parent, replies from the children (proto.go). It runs three scenarios:
//
//   - mesh: every process sends -m messages to every other from -g
//     goroutines, all at once. Checked: every message delivered exactly
//     once; exactly one connection per pair (the sockets of every process,
//     read from /proc and matched end to end, and the caches' counters:
//     creations plus offers N(N-1), one offer per pair); every descriptor
//     given back after close. Reported: the time until the mesh is complete
//     (every process holds a connection to every other), dials,
//     duplicates, descriptors before and after.
//   - faults: the last process is killed with SIGKILL while the others
//     send to it. Checked: their sends fail, none hangs; ErrorTTL bounds
//     their dial attempts; once its lease (-ttl) expires, lookups say it is
//     withdrawn; the others go on among themselves; it is started again (a
//     new process, the same id, a new port) and republishes; the others
//     learn of it through the directory's watch and reach it without
//     waiting for ErrorTTL (where transport/tcp can forget a remembered
//     failure: see the faults table's note); every message sent after it is
//     back arrives, over one connection per pair.
//   - storm: the connection storm of epbench's tcpstorm, across processes:
//     every process gets an endpoint to every other from -g goroutines,
//     through one of bench's comparators (-impl), each endpoint a loopback
//     connection dialed after a modelled delay of -rtt. Reported: the time
//     until the mesh is complete, median of -count runs, comparators side
//     by side.
//
// With -dir, every scenario runs with each of etcddir's modes, Mirror and
// OnDemand (faults with Mirror only: it checks that lookups say a killed
// process is withdrawn, which only a mirror follows). Each child reports
// its directory's Counters; the directory table sums them, beside what
// etcd's own metrics counted, for each mesh run: the counts cmd/dirscale
// simulates, from real processes.
//
// Run `epmesh -h` for the flags. It exits with status 1 if a run broke a
// promise above, and prints what.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/epcache/epcache/etcd/etcdtest"
	"github.com/epcache/epcache/etcd/internal/cmdmain"
	"github.com/epcache/epcache/internal/flaglist"
)

func main() {
	cmdmain.Copy("epmesh child", childEnv, runChild)
	cmdmain.Exit("epmesh", run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// Scenarios, in the order they run.
var scenarios = []string{"mesh", "faults", "storm"}

type options struct {
	ns          []int
	m, g        int
	scenarios   []string
	impls       []string
	rtts        []time.Duration
	count       int
	ttl         time.Duration
	errorTTL    time.Duration
	hammer      time.Duration
	etcd        []string
	prefix      string
	json        bool
	out         string
	timeout     time.Duration
	sendTimeout time.Duration
	stepTimeout time.Duration

	// liveTTL is the lease TTL of every process the run does not kill
	// (faults' survivors and restarted process, every process of mesh and
	// storm); 0: ttl. Tests make it outlast the run, so that no live
	// process depends on its keep-alives arriving within ttl.
	liveTTL time.Duration

	// dirModes are the etcddir modes every scenario runs in: "mirror",
	// "ondemand".
	dirModes []string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("epmesh", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ns := &flaglist.List[int]{Vals: []int{8}, Parse: flaglist.IntAtLeast("-n", 2)}
	scen := &flaglist.List[string]{Vals: scenarios, Parse: flaglist.OneOf("-scenario", scenarios...)}
	impls := &flaglist.List[string]{Vals: []string{"epcache", "mutex"}, Parse: flaglist.OneOf("-impl", bench.ImplNames()...)}
	dirModes := &flaglist.List[string]{Vals: []string{"mirror"}, Parse: flaglist.OneOf("-dir", "mirror", "ondemand")}
	rtts := &flaglist.List[time.Duration]{Vals: []time.Duration{0, 5 * time.Millisecond}, Parse: flaglist.NonNegativeDuration("-rtt")}
	var etcd string
	fs.Var(ns, "n", "processes, a list such as 8,32: every scenario runs for each")
	fs.IntVar(&o.m, "m", 100, "mesh, faults: messages per ordered pair of processes")
	fs.IntVar(&o.g, "g", 4, "goroutines per process sending (mesh, faults) or getting endpoints (storm)")
	fs.Var(scen, "scenario", "scenarios to run: "+strings.Join(scenarios, ", "))
	fs.Var(dirModes, "dir", "etcddir modes, a list such as mirror,ondemand: every scenario runs in each (faults in mirror only: it checks that lookups say withdrawn, which only a mirror follows)")
	fs.Var(impls, "impl", "storm: comparators, side by side: "+strings.Join(bench.ImplNames(), ", "))
	fs.Var(rtts, "rtt", "storm: modelled network delay, paid once per endpoint before its dial (as epbench's tcpstorm), such as 0,5ms")
	fs.IntVar(&o.count, "count", 3, "storm: runs of each comparator and rtt; tables show medians")
	fs.DurationVar(&o.ttl, "ttl", 2*time.Second, "lease TTL of each process's address in etcd: a killed process leaves the directory this long after its last keep-alive (at least 1s)")
	fs.DurationVar(&o.stepTimeout, "step-timeout", 0, "bound on each etcd request and each connection attempt of the processes (etcddir's Timeout, tcp's CreateTimeout and HandshakeTimeout); 0: those packages' defaults")
	fs.DurationVar(&o.errorTTL, "error-ttl", 30*time.Second, "tcp.Config.ErrorTTL: how long a failed connection is the answer for its peer")
	fs.DurationVar(&o.hammer, "hammer", 1500*time.Millisecond, "faults: how long the others go on sending to the killed process once their sends fail")
	fs.StringVar(&etcd, "etcd", "", "etcd client URLs, comma-separated; empty: start an embedded etcd on loopback")
	fs.StringVar(&o.prefix, "prefix", "", "etcd key prefix of this invocation, ending in /; empty: /epmesh/<random>/")
	fs.BoolVar(&o.json, "json", false, "print one JSON document instead of tables")
	fs.StringVar(&o.out, "out", "", "also write the JSON document to this file")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound on every wait: for messages, addresses, a storm")
	fs.DurationVar(&o.sendTimeout, "send-timeout", 5*time.Second, "bound on each Send: one that reaches it counts as hung")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: epmesh [flags]\n\nRuns N processes, each a transport/tcp peer finding the others through etcd, and checks the mesh they make.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := cmdmain.Parse(fs, args); err != nil {
		return o, err
	}
	o.ns, o.scenarios, o.impls, o.rtts, o.dirModes = ns.Vals, scen.Vals, impls.Vals, rtts.Vals, dirModes.Vals
	switch {
	case o.m < 1:
		return o, cmdmain.Usage(fmt.Errorf("-m %d: want at least 1", o.m))
	case o.g < 1:
		return o, cmdmain.Usage(fmt.Errorf("-g %d: want at least 1", o.g))
	case o.count < 1:
		return o, cmdmain.Usage(fmt.Errorf("-count %d: want at least 1", o.count))
	case o.ttl < time.Second:
		return o, cmdmain.Usage(fmt.Errorf("-ttl %v: want at least 1s (etcd counts leases in seconds)", o.ttl))
	case o.errorTTL <= 0:
		return o, cmdmain.Usage(fmt.Errorf("-error-ttl %v: want a positive duration", o.errorTTL))
	case o.stepTimeout < 0:
		return o, cmdmain.Usage(fmt.Errorf("-step-timeout %v: want 0 (the packages' defaults) or a positive duration", o.stepTimeout))
	case o.hammer <= 0 || o.timeout <= 0 || o.sendTimeout <= 0:
		return o, cmdmain.Usage(errors.New("-hammer, -timeout and -send-timeout must be positive"))
	case o.prefix != "" && !strings.HasSuffix(o.prefix, "/"):
		return o, cmdmain.Usage(fmt.Errorf("-prefix %q: want a prefix ending in /", o.prefix))
	}
	for u := range strings.SplitSeq(etcd, ",") {
		if u = strings.TrimSpace(u); u != "" {
			o.etcd = append(o.etcd, u)
		}
	}
	return o, nil
}

// Report is everything one invocation measured; -json prints it.
type Report struct {
	Etcd     []string       `json:"etcd"`
	Embedded bool           `json:"embedded"` // etcd was started by epmesh
	Prefix   string         `json:"prefix"`
	Machine  Machine        `json:"machine"`
	Mesh     []MeshResult   `json:"mesh,omitempty"`
	Faults   []FaultsResult `json:"faults,omitempty"`
	Storm    []StormResult  `json:"storm,omitempty"`
}

// Machine is where the processes ran.
type Machine struct {
	GOOS   string `json:"goos"`
	GOARCH string `json:"goarch"`
	CPUs   int    `json:"cpus"`
	Go     string `json:"go"`
}

// violations counts the broken promises of every run in r.
func (r *Report) violations() int {
	n := 0
	for _, m := range r.Mesh {
		n += len(m.Violations)
	}
	for _, f := range r.Faults {
		n += len(f.Violations)
	}
	for _, s := range r.Storm {
		n += len(s.Violations)
	}
	return n
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary to start the processes: %w", err)
	}
	rep, err := measure(ctx, o, self, stderr)
	if o.out != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(o.out, append(b, '\n'), 0o644)
		}
		if jerr != nil && err == nil {
			err = jerr
		}
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(rep); jerr != nil && err == nil {
			err = jerr
		}
	} else if werr := writeTables(stdout, rep); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	if n := rep.violations(); n > 0 {
		return fmt.Errorf("%d broken promises; see the tables", n)
	}
	return nil
}

// measure runs every scenario for every N, starting an embedded etcd first
// unless o.etcd names a cluster. Progress goes to stderr.
func measure(ctx context.Context, o options, self string, stderr io.Writer) (*Report, error) {
	if _, ok := stderr.(*os.File); !ok {
		// The children's stderr is copied to it by a goroutine each.
		stderr = &syncWriter{w: stderr}
	}
	rep := &Report{Etcd: o.etcd, Machine: Machine{runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version()}}
	if len(o.etcd) == 0 {
		srv, err := etcdtest.Start("")
		if err != nil {
			return rep, err
		}
		defer srv.Close()
		o.etcd, rep.Etcd, rep.Embedded = []string{srv.URL()}, []string{srv.URL()}, true
	}
	if o.prefix == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		o.prefix = "/epmesh/" + hex.EncodeToString(b[:]) + "/"
	}
	rep.Prefix = o.prefix
	e := &env{o: o, self: self, endpoints: o.etcd, stderr: stderr}
	for _, n := range o.ns {
		for _, mode := range o.dirModes {
			e.dirMode = mode
			if err := measureScenarios(ctx, e, rep, n); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

// measureScenarios runs every scenario for n processes, in e.dirMode:
// faults only in mirror, whose lookups follow a withdrawal.
func measureScenarios(ctx context.Context, e *env, rep *Report, n int) error {
	for _, sc := range scenarios {
		if !slices.Contains(e.o.scenarios, sc) || sc == "faults" && e.dirMode == "ondemand" {
			continue
		}
		t0 := time.Now()
		var err error
		switch sc {
		case "mesh":
			var r MeshResult
			r, err = runMesh(ctx, e, n)
			rep.Mesh = append(rep.Mesh, r)
		case "faults":
			var r FaultsResult
			r, err = runFaults(ctx, e, n)
			rep.Faults = append(rep.Faults, r)
		case "storm":
			var rs []StormResult
			rs, err = runStorm(ctx, e, n)
			rep.Storm = append(rep.Storm, rs...)
		}
		if err != nil {
			return fmt.Errorf("%s with %d processes (directory %s): %w", sc, n, e.dirMode, err)
		}
		fmt.Fprintf(e.stderr, "epmesh: %s with %d processes (directory %s): %v\n", sc, n, e.dirMode, time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// syncWriter serialises the writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
