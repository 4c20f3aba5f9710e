package dskitbench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// FanOutConfig sizes scenario 2.
type FanOutConfig struct {
	Servers, Callers int
	RTT              time.Duration // the modelled round trip before a connection is Ready
	DialTimeout      time.Duration // bounds a dial (epcache) or a factory's wait (dskit, waiting for Ready)
	CallTimeout      time.Duration // bounds each call
}

// DefaultFanOut is scenario 2 as cmd/grpcbench runs it.
var DefaultFanOut = FanOutConfig{Servers: 64, Callers: 32, RTT: 50 * time.Millisecond, DialTimeout: 500 * time.Millisecond, CallTimeout: 5 * time.Second}

// MeasureDial returns the median of n dials, one at a time, to a server
// with the modelled round trip: grpc.NewClient, Connect, wait for Ready,
// Close. It is what "one dial" costs here.
func MeasureDial(rtt time.Duration, n int) (time.Duration, error) {
	s, err := StartServer(rtt)
	if err != nil {
		return 0, err
	}
	defer s.Stop()
	var ds []time.Duration
	for range n {
		start := time.Now()
		cc, err := grpc.NewClient(s.Addr, dialOptions(nil)...)
		if err != nil {
			return 0, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = waitReady(ctx, cc)
		cancel()
		ds = append(ds, time.Since(start))
		_ = cc.Close()
		if err != nil {
			return 0, err
		}
	}
	return quantile(ds, 0.5), nil
}

// FanOut is scenario 2: a cold pool, and Callers requests that each fan
// out to every address at once (a querier asking every ingester), each
// dial waiting for Ready behind the modelled round trip; with and without
// one more address that never answers (a listener that never accepts). It
// reports when the slowest good address served its first call, against one
// dial measured alone, and the dials per address.
func FanOut(cfg FanOutConfig) (*Table, error) {
	t := newTable("2", fmt.Sprintf("cold fan-out: %d servers × %d callers, dials waiting for Ready behind a %v round trip", cfg.Servers, cfg.Callers, cfg.RTT),
		"silent addr", "good served", "slowest good", "÷ one dial", "median good", "dials/addr (min–max)", "silent addr's callers")
	one, err := MeasureDial(cfg.RTT, 5)
	if err != nil {
		return nil, err
	}
	t.note("one dial measured alone (NewClient, Connect, wait for Ready; median of 5): %v for a modelled %v round trip", ms(one), cfg.RTT)
	if servers, err := StartServers(cfg.Servers, cfg.RTT); err == nil {
		all, err := ConcurrentDials(Addrs(servers))
		StopAll(servers)
		if err == nil {
			t.note("%d dials at once, no pool, no calls: the last Ready after %v (%.2f× one dial)", cfg.Servers, ms(all), float64(all)/float64(one))
			t.Data["dials alone"] = map[string]float64{"all_ready_ms": msf(all)}
		}
	}
	if warm, err := warmAll(cfg); err == nil {
		t.note("epcache's dial phase alone: Warm of the %d addresses at once returned after %v (%.2f× one dial)", cfg.Servers, ms(warm), float64(warm)/float64(one))
		t.Data["epcache warm"] = map[string]float64{"warm_ms": msf(warm)}
	}
	type variant struct {
		name        string
		ready, warm bool
	}
	for _, withSilent := range []bool{false, true} {
		variants := []variant{{"no pool (a lazy ClientConn per address)", false, false}, {"epcache", true, false}, {"dskit (lazy client)", false, false}, {"dskit (factory waits Ready)", true, false}}
		if !withSilent {
			variants = append(variants, variant{warmedName, true, true})
		}
		for _, v := range variants {
			r, err := runFanOut(cfg, v.name, v.ready, v.warm, withSilent)
			if err != nil {
				return nil, err
			}
			silent := "no"
			silentCallers := "-"
			if withSilent {
				silent = "yes"
				silentCallers = fmt.Sprintf("%s after %s", r.silentErr, ms(r.silentDone))
			}
			fig := map[string]float64{"served": float64(r.served), "good": float64(cfg.Servers), "slowest_good_ms": msf(r.slowest), "median_good_ms": msf(r.median), "one_dial_ms": msf(one), "ratio": float64(r.slowest) / float64(one), "dials_min": float64(r.dialsMin), "dials_max": float64(r.dialsMax)}
			if withSilent {
				fig["silent_callers_ms"] = msf(r.silentDone)
			}
			slowest, ratio := ms(r.slowest), fmt.Sprintf("%.2f", float64(r.slowest)/float64(one))
			if r.served < cfg.Servers {
				slowest, ratio = "never (of "+ms(r.elapsed)+")", "-"
				fig["slowest_good_ms"], fig["ratio"] = -1, -1
			}
			t.row(v.name, fig, silent, fmt.Sprintf("%d/%d", r.served, cfg.Servers), slowest, ratio, ms(r.median), fmt.Sprintf("%d–%d", r.dialsMin, r.dialsMax), silentCallers)
		}
	}
	t.note("each call is bounded by %v from the start of its fan-out (dskit's GetClientFor takes no context: a caller waits for its lock, then calls with what is left); a good address never served had every call to it time out", cfg.CallTimeout)
	t.note("'%s': the same fan-out after Warm made every connection Ready, clock started then: the calls alone, the floor this machine puts under the cold fan-out's calls", warmedName)
	t.note("dials/addr counts TCP connects per good address; 'dskit (lazy client)' is dskit as Mimir uses it (grpc.NewClient, the first call connects); 'factory waits Ready' gives dskit grpcpool's dial policy, under dskit's write lock")
	return t, nil
}

type fanOutResult struct {
	slowest, median, silentDone, elapsed time.Duration
	served, dialsMin, dialsMax           int
	silentErr                            string
}

// warmedName is the fan-out on connections epcache's Warm made first.
const warmedName = "epcache, warmed first (calls alone)"

// runFanOut runs one fan-out. With warm, the pool (epcache's) makes every
// good address's connection Ready before the clock starts.
func runFanOut(cfg FanOutConfig, name string, ready, warm, withSilent bool) (r fanOutResult, err error) {
	servers, err := StartServers(cfg.Servers, cfg.RTT)
	if err != nil {
		return r, err
	}
	defer StopAll(servers)
	addrs := Addrs(servers)
	silentAddr := ""
	if withSilent {
		ln, err := SilentAddr()
		if err != nil {
			return r, err
		}
		defer ln.Close()
		silentAddr = ln.Addr().String()
	}
	d := NewDialer()
	o := Options{Dialer: d, DialTimeout: cfg.DialTimeout, WaitReady: ready}
	targets := addrs
	if withSilent {
		targets = append(append([]string(nil), addrs...), silentAddr)
	}
	var p Pool
	switch {
	case strings.HasPrefix(name, "epcache"):
		p, err = NewEpcache(o)
	case strings.HasPrefix(name, "no pool"):
		p, err = newNoPool(targets, d)
	default:
		p, err = NewDskit(o)
	}
	if err != nil {
		return r, err
	}
	if warm {
		w, ok := p.(interface {
			Warm(context.Context, ...string) error
		})
		if !ok {
			return r, fmt.Errorf("%s: the pool cannot be warmed", name)
		}
		if err := w.Warm(context.Background(), addrs...); err != nil {
			return r, fmt.Errorf("%s: %w", name, err)
		}
	}
	first := make([]time.Duration, len(addrs))
	var mu sync.Mutex
	var silentErrs []error
	var silentDone time.Duration
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.Callers {
		for i, addr := range targets {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), cfg.CallTimeout)
				defer cancel()
				err := p.Do(ctx, addr, Check())
				at := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if addr == silentAddr {
					silentErrs = append(silentErrs, err)
					silentDone = max(silentDone, at)
					return
				}
				if err == nil && (first[i] == 0 || at < first[i]) {
					first[i] = at
				}
			})
		}
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	if err := p.Close(); err != nil {
		return r, err
	}
	var served []time.Duration
	r.dialsMin = 1 << 30
	for i, a := range addrs {
		if first[i] != 0 {
			served = append(served, first[i])
		}
		n := d.AttemptsTo(a)
		r.dialsMin, r.dialsMax = min(r.dialsMin, n), max(r.dialsMax, n)
	}
	r.served = len(served)
	r.slowest = quantile(served, 1)
	r.median = quantile(served, 0.5)
	if withSilent {
		r.silentDone = silentDone
		r.silentErr = "ok"
		for _, e := range silentErrs {
			if e != nil {
				r.silentErr = classify(e)
				break
			}
		}
	}
	return r, nil
}

// classify names an error briefly for a table cell.
func classify(err error) string {
	switch s := err.Error(); {
	case err == nil:
		return "ok"
	case strings.Contains(s, "DialTimeout"):
		return "DialTimeout"
	case strings.Contains(s, "deadline exceeded"), strings.Contains(s, "DeadlineExceeded"):
		return "deadline"
	case ClosedByPool(err):
		return "closed by pool"
	case strings.Contains(s, "Unavailable"):
		return "Unavailable"
	default:
		return "error"
	}
}

// ConcurrentDials dials every address at once, each waiting for Ready,
// without a pool, and returns when the last was Ready: the floor of a cold
// fan-out on this machine.
func ConcurrentDials(addrs []string) (time.Duration, error) {
	start := time.Now()
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			cc, err := grpc.NewClient(a, dialOptions(nil)...)
			if err != nil {
				errs[i] = err
				return
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs[i] = waitReady(ctx, cc)
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// noPool is the floor of a cold fan-out: one lazy ClientConn per address,
// made beforehand, and nothing else.
type noPool map[string]*grpc.ClientConn

func newNoPool(addrs []string, d *Dialer) (noPool, error) {
	p := noPool{}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, dialOptions(d)...)
		if err != nil {
			_ = p.Close()
			return nil, err
		}
		p[a] = cc
	}
	return p, nil
}

func (p noPool) Do(ctx context.Context, addr string, call Call) error { return call(ctx, p[addr]) }
func (p noPool) SetMembers([]string)                                  {}
func (p noPool) Close() error {
	for _, cc := range p {
		_ = cc.Close()
	}
	return nil
}

// warmAll times grpcpool's Warm of every address of a cold pool: its dial
// phase, without the calls.
func warmAll(cfg FanOutConfig) (time.Duration, error) {
	servers, err := StartServers(cfg.Servers, cfg.RTT)
	if err != nil {
		return 0, err
	}
	defer StopAll(servers)
	p, err := NewEpcache(Options{DialTimeout: cfg.DialTimeout})
	if err != nil {
		return 0, err
	}
	defer p.Close()
	start := time.Now()
	err = p.Warm(context.Background(), Addrs(servers)...)
	return time.Since(start), err
}
