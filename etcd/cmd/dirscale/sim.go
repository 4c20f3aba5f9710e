package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/etcd/internal/etcdmetrics"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Run is one simulated job start: one mode, N processes.
type Run struct {
	Mode string `json:"mode"`
	N    int    `json:"n"`
	// D is the peers each process uses (asks for): N-1 where it learns
	// every address (mirror, all, fence), 2 for the ring.
	D int `json:"d"`

	// Dir is the directories' Counters, summed over the processes.
	Dir etcddir.Counters `json:"dir"`
	// MaxEvents is the most events one process received.
	MaxEvents int64 `json:"max_events_per_process"`
	// Delivered is Dir.Events + Dir.KeysLoaded: the keys etcd handed the
	// processes, by watch or by read.
	Delivered int64 `json:"delivered"`
	// Etcd is what the server's metrics counted during the start (gauges
	// as they were at its end).
	Etcd etcdmetrics.Snapshot `json:"etcd"`
	// EtcdCPU is the CPU time, in seconds, etcd's process used during the
	// start (from /proc, 10 ms resolution); ClientCPU this process's:
	// the N directories and their clients.
	EtcdCPU   float64 `json:"etcd_cpu_s"`
	ClientCPU float64 `json:"client_cpu_s"`
	// Wall is how long the start took, in seconds: reported, not fitted
	// (it depends on the machine and what else runs on it).
	Wall float64 `json:"wall_s"`
}

// simulate starts an etcd and runs a job start of n processes in mode.
func simulate(ctx context.Context, self, mode string, n, concurrency int) (Run, error) {
	r := Run{Mode: mode, N: n, D: n - 1}
	if mode == "ring" {
		r.D = 2
	}
	srv, err := startServer(ctx, self)
	if err != nil {
		return r, err
	}
	defer srv.stop()

	// Clients first, outside the measurement: each process has one,
	// whatever the mode.
	clients := make([]*clientv3.Client, n)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := each(n, concurrency, func(i int) error {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.url}, DialTimeout: time.Minute, Logger: zap.NewNop()})
		clients[i] = c
		return err
	}); err != nil {
		return r, err
	}
	dmode := etcddir.OnDemand
	if mode == "mirror" {
		dmode = etcddir.Mirror
	}
	prefix := fmt.Sprintf("/dirscale/%s-%d/", mode, n)
	dirs := make([]*etcddir.Directory, n)
	defer func() {
		_ = each(n, concurrency, func(i int) error {
			if dirs[i] != nil {
				dirs[i].Close()
			}
			return nil
		})
	}()

	before, err := etcdmetrics.Scrape(ctx, srv.url)
	if err != nil {
		return r, err
	}
	cpu0, err := etcdmetrics.ProcCPU(srv.pid)
	if err != nil {
		return r, err
	}
	self0, t0 := etcdmetrics.SelfCPU(), time.Now()

	// Every process opens its directory; then every process publishes.
	if err := each(n, concurrency, func(i int) error {
		d, err := etcddir.Open(ctx, etcddir.Options{
			Client: clients[i], Prefix: prefix, Size: n, Mode: dmode,
			// Leases outlast the run: no keep-alive falls in it.
			TTL: time.Hour, Timeout: time.Minute,
		})
		dirs[i] = d
		return err
	}); err != nil {
		return r, err
	}
	var coord sync.WaitGroup
	var coordErr error
	if mode == "fence" {
		// The coordinator follows the publications as they come.
		coord.Go(func() { _, coordErr = dirs[0].CoordinateFence(ctx) })
	}
	if err := each(n, concurrency, func(i int) error {
		return dirs[i].Publish(i, addrOf(i))
	}); err != nil {
		return r, err
	}
	// Every process learns what it uses, all at once.
	if err := each(n, n, func(i int) error { return use(ctx, mode, dirs[i], i, n) }); err != nil {
		return r, err
	}
	coord.Wait()
	if coordErr != nil {
		return r, coordErr
	}

	r.Wall = time.Since(t0).Seconds()
	self1 := etcdmetrics.SelfCPU()
	cpu1, err := etcdmetrics.ProcCPU(srv.pid)
	if err != nil {
		return r, err
	}
	// What the start set in motion may still be on its way: a watch
	// from a past revision is served by etcd's loop for unsynced
	// watchers, every 100 ms. Wait until etcd has sent nothing more for
	// a while, so that the counts are whole. The CPU time is read before:
	// the wait is mostly etcd's own idle work (raft's ticks), and what is
	// delivered meanwhile is little (a few own-watch events).
	after, err := settle(ctx, srv.url)
	if err != nil {
		return r, err
	}
	r.Etcd = after.Sub(before)
	r.EtcdCPU = (cpu1 - cpu0).Seconds()
	r.ClientCPU = (self1 - self0).Seconds()
	for _, d := range dirs {
		c := d.Counters()
		r.Dir = r.Dir.Add(c)
		r.MaxEvents = max(r.MaxEvents, c.Events)
	}
	r.Delivered = r.Dir.Events + r.Dir.KeysLoaded
	return r, nil
}

// settle scrapes etcd's metrics until the bytes it sent and the events
// stay the same over four readings 150 ms apart (more than etcd's 100 ms
// loop of unsynced watchers), and returns the last.
func settle(ctx context.Context, url string) (etcdmetrics.Snapshot, error) {
	var last etcdmetrics.Snapshot
	for still := 0; still < 4; {
		if err := pause(ctx, 150*time.Millisecond); err != nil {
			return last, err
		}
		s, err := etcdmetrics.Scrape(ctx, url)
		if err != nil {
			return last, err
		}
		// The scrape's own response is not gRPC: SentBytes counts gRPC.
		if s.SentBytes == last.SentBytes && s.EventsSent == last.EventsSent {
			still++
		} else {
			still = 0
		}
		last = s
	}
	return last, nil
}

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// use has process i learn the addresses it uses, and checks them.
func use(ctx context.Context, mode string, d *etcddir.Directory, i, n int) error {
	var peers []int
	switch mode {
	case "ring":
		peers = []int{(i + 1) % n, (i + n - 1) % n}
	default:
		// Rotated, as MPI ranks visit their peers: (i + j) % n.
		for j := 1; j < n; j++ {
			peers = append(peers, (i+j)%n)
		}
	}
	if mode == "fence" {
		rev, err := d.Fence(ctx)
		if err != nil {
			return err
		}
		if err := d.Prefetch(ctx, rev); err != nil {
			return err
		}
	}
	for _, p := range peers {
		addr, err := d.Resolve(ctx, p)
		if err != nil {
			return fmt.Errorf("process %d: %w", i, err)
		}
		if want := addrOf(p); addr != want {
			return fmt.Errorf("process %d: peer %d's address %q; want %q", i, p, addr, want)
		}
	}
	if mode == "fence" {
		if f := d.Counters().Fetches; f != 0 {
			return fmt.Errorf("process %d fetched %d peers after Prefetch; want none", i, f)
		}
	}
	return nil
}

// each runs f(0) to f(n-1), at most concurrency at once, and returns
// their errors joined.
func each(n, concurrency int, f func(i int) error) error {
	sem := make(chan struct{}, concurrency)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
