package dskitbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/epcache"
	"google.golang.org/grpc"
)

// RollingRestartConfig sizes scenario 4.
type RollingRestartConfig struct {
	Servers, Workers int
	HoldMin, HoldMax time.Duration
	Settle           time.Duration // between two restarts; a departed server stops this long after it left the members
}

// DefaultRollingRestart is scenario 4 as cmd/grpcbench runs it.
var DefaultRollingRestart = RollingRestartConfig{Servers: 32, Workers: 32, HoldMin: 20 * time.Millisecond, HoldMax: 50 * time.Millisecond, Settle: 60 * time.Millisecond}

// RollingRestart is scenario 4: workers make held calls (WaitForReady, so
// that a call to a member restarting in place waits for it) to random
// members while every server restarts in turn, either in place (graceful
// stop, listen again on the same address) or to a new address (start the
// new server, SetMembers, stop the old one Settle later). It counts the
// calls that failed, the dials to departed addresses, sockets and
// goroutines over time, and how long a departed member's connection stays
// open after it left the members.
func RollingRestart(cfg RollingRestartConfig) (*Table, error) {
	t := newTable("4", fmt.Sprintf("rolling restart of %d servers under %d workers", cfg.Servers, cfg.Workers),
		"restart", "calls", "failed (closed by pool)", "dials to departed", "sockets min–max (end)", "goroutines start/max/end", "departed conn closes after (p50/max)")
	const check = 25 * time.Millisecond
	for _, mode := range []string{"same address", "new address"} {
		for _, name := range []string{"epcache", "dskit"} {
			d := NewDialer()
			o := Options{Dialer: d, CheckInterval: check, HealthTimeout: time.Second, DialTimeout: 5 * time.Second,
				DialRetry: epcache.Backoff(5*time.Millisecond, 100*time.Millisecond, 0, nil), OnConnError: ReportByValue}
			r, err := runRollingRestart(cfg, mode, name, o)
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", name, mode, err)
			}
			fig := map[string]float64{"calls": float64(r.calls), "failed": float64(r.failed), "closed_by_pool": float64(r.closed), "dials_to_departed": float64(r.departedDials),
				"sockets_min": float64(r.sockMin), "sockets_max": float64(r.sockMax), "sockets_end": float64(r.sockEnd),
				"goroutines_start": float64(r.gStart), "goroutines_max": float64(r.gMax), "goroutines_end": float64(r.gEnd)}
			closes := "-"
			if mode == "new address" {
				closes = ms(quantile(r.closeAfter, 0.5)) + "/" + ms(quantile(r.closeAfter, 1))
				fig["departed_close_p50_ms"], fig["departed_close_max_ms"] = msf(quantile(r.closeAfter, 0.5)), msf(quantile(r.closeAfter, 1))
			}
			t.row(name, fig, mode, itoa(r.calls), fmt.Sprintf("%d (%d)", r.failed, r.closed), itoa(r.departedDials),
				fmt.Sprintf("%d–%d (%d)", r.sockMin, r.sockMax, r.sockEnd), fmt.Sprintf("%d/%d/%d", r.gStart, r.gMax, r.gEnd), closes)
			if r.example != "" {
				t.note("%s, %s: a failed call: %s", name, mode, r.example)
			}
		}
	}
	t.note("calls hold %v–%v with WaitForReady; health checks and dskit's stale-member removal every %v, grace 0; epcache DialRetry backoff 5ms–100ms with jitter within DialTimeout; dskit reports Unavailable with RemoveClient(client, addr)", cfg.HoldMin, cfg.HoldMax, check)
	t.note("goroutines are the whole process's (servers included), sampled every 10ms; sockets are the pool's client sockets (exact count at the dialer)")
	return t, nil
}

type rollingResult struct {
	calls, failed, closed     int64
	departedDials             int
	sockMin, sockMax, sockEnd int64
	gStart, gMax, gEnd        int
	closeAfter                []time.Duration
	example                   string
}

func runRollingRestart(cfg RollingRestartConfig, mode, name string, o Options) (r rollingResult, err error) {
	servers, err := StartServers(cfg.Servers, 0)
	if err != nil {
		return r, err
	}
	defer func() { StopAll(servers) }()
	var p Pool
	if name == "epcache" {
		p, err = NewEpcache(o)
	} else {
		p, err = NewDskit(o)
	}
	if err != nil {
		return r, err
	}
	d := o.Dialer
	var members atomic.Pointer[[]string]
	setMembers := func(m []string) {
		members.Store(&m)
		p.SetMembers(m)
	}
	setMembers(Addrs(servers))
	// Warm every connection first: the restart, not the cold start, is
	// measured.
	var warm sync.WaitGroup
	for _, a := range Addrs(servers) {
		warm.Go(func() { _ = p.Do(context.Background(), a, Check()) })
	}
	warm.Wait()

	r.gStart = runtime.NumGoroutine()
	r.sockMin = 1 << 30
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Go(func() { // the sampler
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			n := d.Open()
			g := runtime.NumGoroutine()
			mu.Lock()
			r.sockMin, r.sockMax, r.gMax = min(r.sockMin, n), max(r.sockMax, n), max(r.gMax, g)
			mu.Unlock()
		}
	})
	var workers sync.WaitGroup
	for w := range cfg.Workers {
		rng := rand.New(rand.NewPCG(uint64(w), 4))
		workers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				m := *members.Load()
				addr := m[rng.IntN(len(m))]
				hold := cfg.HoldMin + time.Duration(rng.Int64N(int64(cfg.HoldMax-cfg.HoldMin)+1))
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := p.Do(ctx, addr, Held(hold, grpc.WaitForReady(true)))
				cancel()
				atomic.AddInt64(&r.calls, 1)
				if err != nil {
					atomic.AddInt64(&r.failed, 1)
					if ClosedByPool(err) {
						atomic.AddInt64(&r.closed, 1)
					}
					mu.Lock()
					if r.example == "" {
						r.example = err.Error()
					}
					mu.Unlock()
				}
			}
		})
	}
	type departure struct {
		addr     string
		at       time.Time
		attempts int
	}
	var departed []departure
	var stops sync.WaitGroup
	for i := range servers {
		if mode == "same address" {
			if err := servers[i].Restart(); err != nil {
				return r, err
			}
		} else {
			ns, err := StartServer(0)
			if err != nil {
				return r, err
			}
			old := servers[i]
			servers[i] = ns
			setMembers(Addrs(servers))
			departed = append(departed, departure{old.Addr, time.Now(), d.AttemptsTo(old.Addr)})
			stops.Go(func() {
				time.Sleep(cfg.Settle) // the departed instance terminates after it left the ring
				old.GracefulStop()
			})
		}
		time.Sleep(cfg.Settle)
	}
	stops.Wait()
	time.Sleep(cfg.Settle) // the last departures' connections close
	close(stop)
	workers.Wait()
	wg.Wait()
	r.sockEnd = d.Open()
	for _, dep := range departed {
		r.departedDials += d.AttemptsTo(dep.addr) - dep.attempts
		if at, ok := d.ClosedAt(dep.addr); ok && at.After(dep.at) {
			r.closeAfter = append(r.closeAfter, at.Sub(dep.at))
		}
	}
	if err := p.Close(); err != nil {
		return r, err
	}
	StopAll(servers)
	time.Sleep(50 * time.Millisecond)
	r.gEnd = runtime.NumGoroutine()
	return r, nil
}
