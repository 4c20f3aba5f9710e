package dskitbench

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// CloseUnderUseConfig sizes scenario 1.
type CloseUnderUseConfig struct {
	Servers, Workers int
	Duration         time.Duration // of the perturbed run
	HoldMin, HoldMax time.Duration // each call holds its connection this long
	Every            time.Duration // a member leaves, or its health flips, this often
}

// DefaultCloseUnderUse is scenario 1 as cmd/grpcbench runs it.
var DefaultCloseUnderUse = CloseUnderUseConfig{Servers: 16, Workers: 16, Duration: 3 * time.Second, HoldMin: 20 * time.Millisecond, HoldMax: 50 * time.Millisecond, Every: 60 * time.Millisecond}

// CloseUnderUse is scenario 1: workers make calls that hold their
// connection 20–50 ms, to random members, while members leave and come
// back, servers' health flips to NOT_SERVING and back, connections go idle
// (workers pause) and the cap evicts (epcache: MaxConns 3/4 of the
// servers). It counts the calls that fail because the pool closed their
// connection. dskit has no idle timeout and no cap: it meets the departures
// and the health flips.
func CloseUnderUse(cfg CloseUnderUseConfig) (*Table, error) {
	t := newTable("1", "close under use: calls failed because the pool closed their connection",
		"calls", "ok", "closed by pool", "other errors", "dials", "drops: members/health/idle/evicted")
	const check = 25 * time.Millisecond
	for _, name := range []string{"epcache", "dskit"} {
		servers, err := StartServers(cfg.Servers, 0)
		if err != nil {
			return nil, err
		}
		d := NewDialer()
		o := Options{Dialer: d, CheckInterval: check, HealthTimeout: time.Second, DialTimeout: 5 * time.Second}
		var p Pool
		if name == "epcache" {
			o.IdleTimeout = 40 * time.Millisecond
			o.MaxConns = cfg.Servers * 3 / 4
			p, err = NewEpcache(o)
		} else {
			p, err = NewDskit(o)
		}
		if err != nil {
			StopAll(servers)
			return nil, err
		}
		r := runCloseUnderUse(cfg, p, servers)
		if err := p.Close(); err != nil {
			return nil, err
		}
		StopAll(servers)
		drops := "n/a"
		fig := map[string]float64{"calls": float64(r.calls), "ok": float64(r.ok), "closed_by_pool": float64(r.closed), "other_errors": float64(r.other), "dials": float64(d.Attempts.Load())}
		if e, ok := p.(*Epcache); ok {
			st := e.Stats()
			drops = itoa(st.DropsMembership) + "/" + itoa(st.DropsHealth) + "/" + itoa(st.DropsIdle) + "/" + itoa(st.DropsEvicted)
			fig["drops_membership"], fig["drops_health"], fig["drops_idle"], fig["drops_evicted"] = float64(st.DropsMembership), float64(st.DropsHealth), float64(st.DropsIdle), float64(st.DropsEvicted)
		}
		t.row(name, fig, itoa(r.calls), itoa(r.ok), itoa(r.closed), itoa(r.other), itoa(d.Attempts.Load()), drops)
		if r.otherExample != "" {
			t.note("%s, an error that is not the pool's: %s", name, r.otherExample)
		}
	}
	t.note("%d servers, %d workers, %v; calls hold %v–%v; every %v a member leaves for 150ms or a server is NOT_SERVING for 100ms; checks every %v, grace 0; epcache IdleTimeout 40ms, MaxConns %d (dskit has neither)",
		cfg.Servers, cfg.Workers, cfg.Duration, cfg.HoldMin, cfg.HoldMax, cfg.Every, check, cfg.Servers*3/4)
	return t, nil
}

type closeUnderUseResult struct {
	calls, ok, closed, other int64
	otherExample             string
}

func runCloseUnderUse(cfg CloseUnderUseConfig, p Pool, servers []*Server) closeUnderUseResult {
	addrs := Addrs(servers)
	var members atomic.Pointer[[]string]
	var setMu sync.Mutex
	set := func(m []string) {
		setMu.Lock()
		defer setMu.Unlock()
		members.Store(&m)
		p.SetMembers(m)
	}
	set(addrs)
	var r closeUnderUseResult
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range cfg.Workers {
		rng := rand.New(rand.NewPCG(uint64(w), 1))
		wg.Go(func() {
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
				err := p.Do(ctx, addr, Held(hold))
				cancel()
				atomic.AddInt64(&r.calls, 1)
				switch {
				case err == nil:
					atomic.AddInt64(&r.ok, 1)
				case ClosedByPool(err):
					atomic.AddInt64(&r.closed, 1)
				default:
					atomic.AddInt64(&r.other, 1)
					mu.Lock()
					if r.otherExample == "" {
						r.otherExample = err.Error()
					}
					mu.Unlock()
				}
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.Int64N(int64(60 * time.Millisecond)))) // idle a while
				}
			}
		})
	}
	// The perturbations, from one seed for every pool.
	rng := rand.New(rand.NewPCG(42, 42))
	var pert sync.WaitGroup
	deadline := time.Now().Add(cfg.Duration)
	for time.Now().Before(deadline) {
		time.Sleep(cfg.Every)
		i := rng.IntN(len(servers))
		if rng.IntN(2) == 0 {
			var m []string
			for j, a := range addrs {
				if j != i {
					m = append(m, a)
				}
			}
			set(m)
			pert.Go(func() {
				time.Sleep(150 * time.Millisecond)
				set(addrs)
			})
		} else {
			servers[i].SetServing(false)
			pert.Go(func() {
				time.Sleep(100 * time.Millisecond)
				servers[i].SetServing(true)
			})
		}
	}
	pert.Wait()
	close(stop)
	wg.Wait()
	return r
}
