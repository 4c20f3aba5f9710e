// Command dirscale measures how the cost of etcddir to etcd grows with the
// size of a job, on one machine, by counting rather than timing: it
// simulates a job of N processes with N directories, each with its own
// etcd client, against one etcd server in a process of its own, and
// counts what etcd sent and did (its Prometheus metrics), what the
// directories asked and received (their Counters), and the CPU time etcd's
// process used.
//
// For each mode and N it starts a fresh etcd, then runs a job's start in
// three steps, each finished by every process before the next begins:
// every process opens its directory; every process publishes its
// address; every process learns the addresses it uses. The modes:
//
//   - mirror: Mirror mode; each process waits until its mirror holds
//     every peer (what a mirror does whatever it uses).
//   - ring: OnDemand, each process resolving its two neighbours (d = 2).
//   - all: OnDemand, each process resolving every other (d = N-1).
//   - fence: OnDemand with the fence: process 0 coordinates it, every
//     process waits for it and prefetches every address at its revision,
//     page by page, then resolves every other from memory (full modex).
//
// It fits log(count) against log(N) for each mode and counter (the slope
// is the exponent of the growth), and projects the counts and etcd's CPU
// time to 10,000 and 100,000 processes from the fits: projections, not
// measurements. Results go to stdout, and with -out to results.txt and
// results.json in that directory.
//
// Run `dirscale -h` for the flags. It exits with status 1 if a run failed.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/epcache/epcache/etcd/internal/cmdmain"
	"github.com/epcache/epcache/internal/flaglist"
)

func main() {
	cmdmain.Copy("dirscale server", serverEnv, runServer)
	cmdmain.Exit("dirscale", run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// modes, in the order they run.
var modes = []string{"mirror", "ring", "all", "fence"}

type options struct {
	ns          []int
	modes       []string
	out         string
	timeout     time.Duration
	concurrency int
	coalesce    int
	command     string // as the user typed it, for the results
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("dirscale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ns := &flaglist.List[int]{Vals: []int{8, 32, 128, 512, 1024}, Parse: flaglist.IntAtLeast("-n", 3)}
	ms := &flaglist.List[string]{Vals: modes, Parse: flaglist.OneOf("-mode", modes...)}
	fs.Var(ns, "n", "job sizes, a list such as 8,32,128: every mode runs for each")
	fs.Var(ms, "mode", "modes to run: "+strings.Join(modes, ", "))
	fs.StringVar(&o.out, "out", "", "also write results.txt and results.json to this directory")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "bound on each run (one mode, one N): a run past it fails")
	fs.IntVar(&o.concurrency, "concurrency", 64, "processes opening their directory or publishing at once")
	fs.IntVar(&o.coalesce, "coalesce", 64, "peers that 2 layers × 64 goroutines of one process ask for at once, an eighth of them not yet published, counting what etcd is asked (0: skip)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dirscale [flags]\n\nSimulates jobs of N processes against one etcd and counts what each directory mode costs etcd.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := cmdmain.Parse(fs, args); err != nil {
		return o, err
	}
	o.ns, o.modes = ns.Vals, ms.Vals
	switch {
	case o.timeout <= 0:
		return o, cmdmain.Usage(fmt.Errorf("-timeout %v: want a positive duration", o.timeout))
	case o.concurrency < 1:
		return o, cmdmain.Usage(fmt.Errorf("-concurrency %d: want at least 1", o.concurrency))
	case o.coalesce < 0:
		return o, cmdmain.Usage(fmt.Errorf("-coalesce %d: want 0 (skip) or more peers", o.coalesce))
	}
	o.command = "dirscale " + strings.Join(args, " ")
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary to start etcd: %w", err)
	}
	rep := &Report{Machine: machine(), Command: o.command}
	var failed error
	for _, m := range o.modes {
		for _, n := range o.ns {
			t0 := time.Now()
			fmt.Fprintf(stderr, "dirscale: %s, N=%d ...\n", m, n)
			rctx, cancel := context.WithTimeout(ctx, o.timeout)
			r, err := simulate(rctx, self, m, n, o.concurrency)
			cancel()
			if err != nil {
				failed = fmt.Errorf("%s with N=%d: %w", m, n, err)
				fmt.Fprintf(stderr, "dirscale: %v\n", failed)
				rep.Failures = append(rep.Failures, failed.Error())
				break // larger N of this mode would fail the same way, only later
			}
			rep.Runs = append(rep.Runs, r)
			fmt.Fprintf(stderr, "dirscale: %s, N=%d: %v, %.0f events, etcd %.2fs CPU\n", m, n, time.Since(t0).Round(time.Millisecond), r.Etcd.EventsSent, r.EtcdCPU)
		}
	}
	if o.coalesce > 0 {
		fmt.Fprintf(stderr, "dirscale: coalescing, %d peers ...\n", o.coalesce)
		rctx, cancel := context.WithTimeout(ctx, o.timeout)
		c, err := coalesce(rctx, self, o.coalesce, o.coalesce-o.coalesce/8, 2, 64)
		cancel()
		if err != nil {
			failed = fmt.Errorf("coalescing: %w", err)
			rep.Failures = append(rep.Failures, failed.Error())
		} else {
			rep.Coalescing = &c
		}
	}
	rep.fit()
	if err := writeText(stdout, rep); err != nil {
		return err
	}
	if o.out != "" {
		if err := rep.write(o.out); err != nil {
			return err
		}
	}
	return failed
}
