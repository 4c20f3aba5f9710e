package dskitbench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// StreamLimitConfig sizes scenario 8.
type StreamLimitConfig struct {
	Callers     int           // callers of the burst, all at once
	Streams     int           // the server's grpc.MaxConcurrentStreams, and grpcpool's MaxStreamsPerConn
	Hold        time.Duration // how long each call holds its stream
	RTT         time.Duration // the modelled round trip before a connection is Ready
	IdleTimeout time.Duration // grpcpool's: closes the connections the falling load leaves unneeded
}

// DefaultStreamLimit is issue 43's measurement: 500 callers, 100 streams
// a connection, 50 ms calls, 50 ms dials.
var DefaultStreamLimit = StreamLimitConfig{Callers: 500, Streams: 100, Hold: 50 * time.Millisecond, RTT: 50 * time.Millisecond, IdleTimeout: 200 * time.Millisecond}

// StreamLimit is scenario 8: a server that allows Streams calls at once
// per connection, behind a modelled round trip, and three pools: one
// connection per address (grpcpool without MaxStreamsPerConn, and what
// dskit's pool gives), grpcpool with MaxStreamsPerConn, and Dapr's
// algorithm. Two phases, each on a fresh pool:
//
//   - burst: Callers calls at once, cold; how many run at once at the
//     server, how many dials, how long until the last is done.
//   - growth under load: Streams callers loop over calls on a warm
//     connection, filling it; Streams/10 more callers join, which needs a
//     growth dial; how long the first callers' calls wait to start
//     meanwhile (they fit: each frees its own stream as it ends).
//
// After the burst, grpcpool's extra connections are timed until
// IdleTimeout has closed all but one. A third phase ramps looping callers
// up to Callers and down again, and counts the dials.
func StreamLimit(cfg StreamLimitConfig) (*Table, error) {
	t := newTable("8", fmt.Sprintf("stream limit: %d callers at once, MaxConcurrentStreams %d, calls hold %v, dials behind a %v round trip", cfg.Callers, cfg.Streams, cfg.Hold, cfg.RTT),
		"calls", "failed", "peak at server", "dials", "all done", "÷ (dial + call)", "left after load", "growth: fitting calls delayed ≥ RTT/2", "their p99 wait", "ramp: dials", "ramp: left")
	gauge := &streamGauge{}
	srv, err := startServerWith(cfg.RTT, grpc.MaxConcurrentStreams(uint32(cfg.Streams)), grpc.StreamInterceptor(gauge.intercept))
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	oneDial := cfg.RTT // the floor of a dial here; measured below
	if d, err := measureDial(srv.Addr); err == nil {
		oneDial = d
	}
	pools := []struct {
		name string
		make func(*Dialer) (Pool, error)
	}{
		{"one connection (grpcpool)", func(d *Dialer) (Pool, error) {
			return NewEpcache(Options{Dialer: d, DialTimeout: 10 * time.Second})
		}},
		{fmt.Sprintf("grpcpool, MaxStreamsPerConn %d", cfg.Streams), func(d *Dialer) (Pool, error) {
			return NewEpcache(Options{Dialer: d, DialTimeout: 10 * time.Second, StreamsPerConn: cfg.Streams, IdleTimeout: cfg.IdleTimeout})
		}},
		{"Dapr's algorithm (written from its description)", func(d *Dialer) (Pool, error) {
			return newDaprLike(d, cfg.Streams, 10*time.Second), nil
		}},
	}
	for _, pc := range pools {
		// Burst.
		d := NewDialer()
		p, err := pc.make(d)
		if err != nil {
			return nil, err
		}
		gauge.reset()
		var failed atomic.Int64
		var example atomic.Pointer[string]
		held := Held(cfg.Hold)
		start := time.Now()
		var wg sync.WaitGroup
		for range cfg.Callers {
			wg.Go(func() {
				if err := p.Do(context.Background(), srv.Addr, held); err != nil {
					failed.Add(1)
					s := err.Error()
					example.CompareAndSwap(nil, &s)
				}
			})
		}
		wg.Wait()
		done := time.Since(start)
		left := "n/a"
		leftAfter := -1.0
		if ep, ok := p.(*Epcache); ok && ep.ConnsTo(srv.Addr) > 1 {
			// A light load stays (one caller, one call at a time), so
			// that the first connection has a use and the others none.
			var stop atomic.Bool
			var light sync.WaitGroup
			light.Go(func() {
				for !stop.Load() {
					if err := p.Do(context.Background(), srv.Addr, Check()); err != nil {
						failed.Add(1)
						s := err.Error()
						example.CompareAndSwap(nil, &s)
					}
				}
			})
			deadline := time.Now().Add(10 * cfg.IdleTimeout)
			for ep.ConnsTo(srv.Addr) > 1 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			el := time.Since(start) - done
			stop.Store(true)
			light.Wait()
			left = fmt.Sprintf("%d after %s", ep.ConnsTo(srv.Addr), ms(el))
			leftAfter = msf(el)
		}
		dials := d.Attempts.Load()
		if err := p.Close(); err != nil {
			return nil, err
		}
		// Growth under load.
		d2 := NewDialer()
		p2, err := pc.make(d2)
		if err != nil {
			return nil, err
		}
		delayed, p99, err := growthUnderLoad(p2, srv.Addr, cfg)
		if err != nil {
			return nil, err
		}
		if err := p2.Close(); err != nil {
			return nil, err
		}
		// Ramp.
		d3 := NewDialer()
		p3, err := pc.make(d3)
		if err != nil {
			return nil, err
		}
		if err := ramp(p3, srv.Addr, cfg); err != nil {
			return nil, err
		}
		rampLeft, rampLeftCell := -1.0, "n/a"
		if ep, ok := p3.(*Epcache); ok {
			rampLeft = float64(ep.ConnsTo(srv.Addr))
			rampLeftCell = itoa(int64(rampLeft))
		}
		rampDials := d3.Attempts.Load()
		if err := p3.Close(); err != nil {
			return nil, err
		}
		ratio := float64(done) / float64(oneDial+cfg.Hold)
		t.row(pc.name, map[string]float64{"calls": float64(cfg.Callers), "failed": float64(failed.Load()), "peak_at_server": float64(gauge.peak.Load()),
			"dials": float64(dials), "all_done_ms": msf(done), "ratio_dial_plus_call": ratio, "shrunk_after_ms": leftAfter,
			"growth_fitting_delayed": float64(delayed), "growth_fitting_p99_ms": msf(p99), "ramp_dials": float64(rampDials), "ramp_left": rampLeft},
			itoa(int64(cfg.Callers)), itoa(failed.Load()), itoa(gauge.peak.Load()), itoa(dials), ms(done), fmt.Sprintf("%.2f", ratio), left,
			itoa(int64(delayed)), ms(p99), itoa(rampDials), rampLeftCell)
		if e := example.Load(); e != nil {
			t.note("%s: a failed call: %s", pc.name, *e)
		}
	}
	t.note("one dial measured alone (NewClient, Connect, wait for Ready): %s; '÷ (dial + call)' divides 'all done' by it plus one call's hold", ms(oneDial))
	t.note("peak at server: Watch streams the server ran at once (gRPC queues the calls past MaxConcurrentStreams on the client); dials: TCP connects at the dialer")
	t.note("'left after load': grpcpool's connections once the burst is over and one caller goes on with one call at a time, and how long after the burst IdleTimeout %v took to close the others", cfg.IdleTimeout)
	t.note("growth: %d callers loop over %v calls on a warm connection, then %d more join; a first caller's call 'delayed' waited ≥ %v from Do to its start; its own stream was free, so any wait is the pool's", cfg.Streams, cfg.Hold, max(1, cfg.Streams/10), cfg.RTT/2)
	t.note("ramp: callers looping over %v calls, %d → %d → %d in steps of %d every %v, then %d for 2× IdleTimeout; 'ramp: dials' against the %d connections the peak needs, 'ramp: left' is grpcpool's connections at the end", cfg.Hold, rampLow(cfg), cfg.Callers, rampLow(cfg), rampStep(cfg), cfg.Hold, rampLow(cfg), (cfg.Callers+cfg.Streams-1)/cfg.Streams)
	t.note("Dapr's algorithm is written here from the description in issue 43 (dapr pkg/api/grpc/manager/pool.go: a slice of connections per address, a reference count per connection capped at MaxConcurrentStreams, a new connection dialed under the address's write lock), not imported: dapr's module and its dependency tree are not built here")
	return t, nil
}

// growthUnderLoad runs the growth phase on p: it returns how many of the
// first callers' measured calls waited ≥ RTT/2 to start, and their p99 wait.
func growthUnderLoad(p Pool, addr string, cfg StreamLimitConfig) (delayed int, p99 time.Duration, err error) {
	held := Held(cfg.Hold)
	if err := p.Do(context.Background(), addr, held); err != nil { // warm: the first connection is Ready
		return 0, 0, err
	}
	var measuring, stop atomic.Bool
	var mu sync.Mutex
	var waits []time.Duration
	var failure atomic.Pointer[error]
	loop := func(record bool) {
		for !stop.Load() {
			t0 := time.Now()
			err := p.Do(context.Background(), addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
				if w := time.Since(t0); record && measuring.Load() {
					mu.Lock()
					waits = append(waits, w)
					mu.Unlock()
				}
				return held(ctx, cc)
			})
			if err != nil {
				failure.CompareAndSwap(nil, &err)
				return
			}
		}
	}
	var wg sync.WaitGroup
	for range cfg.Streams {
		wg.Go(func() { loop(true) })
	}
	time.Sleep(4 * cfg.Hold) // the first connection full, the callers in their loops
	measuring.Store(true)
	for range max(1, cfg.Streams/10) {
		wg.Go(func() { loop(false) })
	}
	time.Sleep(4*cfg.Hold + 2*cfg.RTT)
	measuring.Store(false)
	stop.Store(true)
	wg.Wait()
	if e := failure.Load(); e != nil {
		return 0, 0, *e
	}
	for _, w := range waits {
		if w >= cfg.RTT/2 {
			delayed++
		}
	}
	return delayed, quantile(waits, 0.99), nil
}

func rampLow(cfg StreamLimitConfig) int  { return max(1, cfg.Callers/50) }
func rampStep(cfg StreamLimitConfig) int { return max(1, (cfg.Callers-rampLow(cfg))/7) }

// ramp runs the ramp phase on p: callers that loop over calls, their
// number raised from rampLow to Callers and back, one step every Hold,
// then held at rampLow for twice IdleTimeout.
func ramp(p Pool, addr string, cfg StreamLimitConfig) error {
	held := Held(cfg.Hold)
	var failure atomic.Pointer[error]
	var wg sync.WaitGroup
	var stops []*atomic.Bool
	start := func(n int) {
		for range n {
			stop := new(atomic.Bool)
			stops = append(stops, stop)
			wg.Go(func() {
				for !stop.Load() {
					if err := p.Do(context.Background(), addr, held); err != nil {
						failure.CompareAndSwap(nil, &err)
						return
					}
				}
			})
		}
	}
	stopLast := func(n int) {
		for range min(n, len(stops)) {
			stops[len(stops)-1].Store(true)
			stops = stops[:len(stops)-1]
		}
	}
	start(rampLow(cfg))
	for len(stops) < cfg.Callers {
		time.Sleep(cfg.Hold)
		start(min(rampStep(cfg), cfg.Callers-len(stops)))
	}
	time.Sleep(4 * cfg.Hold)
	for len(stops) > rampLow(cfg) {
		time.Sleep(cfg.Hold)
		stopLast(min(rampStep(cfg), len(stops)-rampLow(cfg)))
	}
	time.Sleep(2*cfg.IdleTimeout + cfg.IdleTimeout/4)
	stopLast(len(stops))
	wg.Wait()
	if e := failure.Load(); e != nil {
		return *e
	}
	return nil
}

// measureDial times one dial alone: NewClient, Connect, wait for Ready.
func measureDial(addr string) (time.Duration, error) {
	start := time.Now()
	cc, err := grpc.NewClient(addr, dialOptions(nil)...)
	if err != nil {
		return 0, err
	}
	defer func() { _ = cc.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitReady(ctx, cc); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// streamGauge counts the streams a server runs at once.
type streamGauge struct{ now, peak atomic.Int64 }

func (g *streamGauge) reset() { g.now.Store(0); g.peak.Store(0) }

func (g *streamGauge) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	raise(&g.peak, g.now.Add(1))
	defer g.now.Add(-1)
	return handler(srv, ss)
}

// daprLike is Dapr's connection pool's algorithm, as issue 43 describes
// it: per address a slice of connections, each with a count of the calls
// on it capped at max; a call takes the first connection under the cap,
// under the address's read lock; when every one is at the cap, it takes
// the write lock and dials a new connection under it, so that every call
// to the address waits for that dial, those that would fit included.
type daprLike struct {
	d       *Dialer
	max     int32
	timeout time.Duration

	mu    sync.Mutex
	addrs map[string]*daprAddr
}

type daprAddr struct {
	mu    sync.RWMutex
	conns []*daprConn
}

type daprConn struct {
	cc   *grpc.ClientConn
	refs atomic.Int32
}

func newDaprLike(d *Dialer, max int, timeout time.Duration) *daprLike {
	return &daprLike{d: d, max: int32(max), timeout: timeout, addrs: map[string]*daprAddr{}}
}

func (p *daprLike) addr(addr string) *daprAddr {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.addrs[addr]
	if !ok {
		a = &daprAddr{}
		p.addrs[addr] = a
	}
	return a
}

// take returns a connection under the cap with its count taken, or nil.
func (a *daprAddr) take(max int32) *daprConn {
	for _, c := range a.conns {
		if n := c.refs.Add(1); n <= max {
			return c
		}
		c.refs.Add(-1)
	}
	return nil
}

func (p *daprLike) Do(ctx context.Context, addr string, call Call) error {
	a := p.addr(addr)
	a.mu.RLock()
	c := a.take(p.max)
	a.mu.RUnlock()
	if c == nil {
		a.mu.Lock()
		if c = a.take(p.max); c == nil {
			cc, err := grpc.NewClient(addr, dialOptions(p.d)...)
			if err != nil {
				a.mu.Unlock()
				return err
			}
			dctx, cancel := context.WithTimeout(ctx, p.timeout)
			err = waitReady(dctx, cc)
			cancel()
			if err != nil {
				_ = cc.Close()
				a.mu.Unlock()
				return err
			}
			c = &daprConn{cc: cc}
			c.refs.Store(1)
			a.conns = append(a.conns, c)
		}
		a.mu.Unlock()
	}
	defer c.refs.Add(-1)
	return call(ctx, c.cc)
}

func (p *daprLike) SetMembers([]string) {}

func (p *daprLike) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.addrs {
		a.mu.Lock()
		for _, c := range a.conns {
			_ = c.cc.Close()
		}
		a.conns = nil
		a.mu.Unlock()
	}
	return nil
}

var _ Pool = (*daprLike)(nil)
