package dskitbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// ServeEnv names the environment variable that turns a program that calls
// MaybeServe into a server process: MaybeServe starts that many servers,
// prints their addresses one a line, and serves until its standard input
// closes.
const ServeEnv = "GRPCBENCH_SERVE"

// MaybeServe serves and exits if ServeEnv is set; otherwise it returns.
// cmd/grpcbench and the package's tests call it first thing, so that
// scenario 7 can start its servers in a child process.
func MaybeServe() {
	v := os.Getenv(ServeEnv)
	if v == "" {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		fmt.Fprintf(os.Stderr, "%s=%q: want a positive count\n", ServeEnv, v)
		os.Exit(2)
	}
	servers, err := StartServers(n, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, a := range Addrs(servers) {
		fmt.Println(a)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	StopAll(servers)
	os.Exit(0)
}

// spawnServers starts n servers in a child process (this program, with
// ServeEnv set) and returns their addresses and a function that stops
// them.
func spawnServers(n int) ([]string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", ServeEnv, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	stop := func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}
	sc := bufio.NewScanner(stdout)
	var addrs []string
	for len(addrs) < n && sc.Scan() {
		addrs = append(addrs, strings.TrimSpace(sc.Text()))
	}
	if len(addrs) < n {
		stop()
		return nil, nil, fmt.Errorf("server process gave %d addresses; want %d", len(addrs), n)
	}
	return addrs, stop, nil
}

// socketFDs counts this process's descriptors that are sockets, from
// /proc/self/fd; -1 where /proc is absent. (Linux gives a new descriptor
// the lowest free number, so a connection closed and another opened while
// the directory is read are not both counted.)
func socketFDs() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range entries {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// DescriptorBudget is scenario 7: MaxConns (epcache) over more servers,
// each caller calling every server in turn with a call that holds its
// connection hold, all at once. The servers run in a child process, so
// that the socket descriptors of this process are the pool's connections:
// it counts them from /proc/self/fd (sampled, and inside every call) and
// at the dialer (exact).
func DescriptorBudget(servers, maxConns, rounds int, hold time.Duration) (*Table, error) {
	t := newTable("7", fmt.Sprintf("descriptor budget: MaxConns %d over %d servers, %d callers all in use", maxConns, servers, servers),
		"calls", "served", "failed", "peak sockets (/proc/self/fd)", "peak sockets (dialer)", "dials", "time")
	addrs, stop, err := spawnServers(servers)
	if err != nil {
		return nil, err
	}
	defer stop()
	base := socketFDs()
	for _, name := range []string{"epcache", "dskit"} {
		d := NewDialer()
		o := Options{Dialer: d, DialTimeout: 10 * time.Second, MaxConns: maxConns}
		var p Pool
		if name == "epcache" {
			p, err = NewEpcache(o)
		} else {
			p, err = NewDskit(o)
		}
		if err != nil {
			return nil, err
		}
		var peak atomic.Int64
		sample := func() {
			if n := socketFDs(); n >= 0 {
				raise(&peak, int64(n-base))
			}
		}
		done := make(chan struct{})
		var sampler sync.WaitGroup
		sampler.Go(func() {
			for {
				sample()
				select {
				case <-done:
					return
				case <-time.After(time.Millisecond):
				}
			}
		})
		var calls, served, failed atomic.Int64
		var example atomic.Pointer[string]
		start := time.Now()
		var wg sync.WaitGroup
		held := Held(hold)
		for g := range servers {
			wg.Go(func() {
				for r := range rounds {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					err := p.Do(ctx, addrs[(g+r)%servers], func(ctx context.Context, cc grpc.ClientConnInterface) error {
						sample()
						return held(ctx, cc)
					})
					cancel()
					calls.Add(1)
					if err != nil {
						failed.Add(1)
						s := err.Error()
						example.CompareAndSwap(nil, &s)
						continue
					}
					served.Add(1)
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		close(done)
		sampler.Wait()
		if err := p.Close(); err != nil {
			return nil, err
		}
		t.row(name, map[string]float64{"calls": float64(calls.Load()), "served": float64(served.Load()), "failed": float64(failed.Load()),
			"peak_sockets_proc": float64(peak.Load()), "peak_sockets_dialer": float64(d.Peak()), "dials": float64(d.Attempts.Load()), "seconds": el.Seconds()},
			itoa(calls.Load()), itoa(served.Load()), itoa(failed.Load()), itoa(peak.Load()), itoa(d.Peak()), itoa(d.Attempts.Load()), ms(el))
		if e := example.Load(); e != nil {
			t.note("%s: a failed call: %s", name, *e)
		}
	}
	t.note("%d rounds per caller, calls hold their connection %v; dskit has no bound (MaxConns does not apply to it)", rounds, hold)
	return t, nil
}
