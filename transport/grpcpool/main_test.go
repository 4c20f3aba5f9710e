package grpcpool_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// connection, dial, drain and health checker must be gone once the test has
// closed its pool and servers.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	// hang bounds a wait that only detects a hang: a test waits this long
	// for something that must happen, however slow or busy the machine,
	// and fails only if it never does.
	hang = 2 * time.Minute
	// patience is a timeout the test does not test (a dial's, a health
	// check's): longer than any test runs.
	patience = time.Hour
)

// eventually polls cond until it holds (true) or hang passes (false).
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(hang)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// waitFor fails the test if cond does not hold within hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !eventually(cond) {
		t.Fatalf("not within %v: %s", hang, what)
	}
}

// server is a gRPC server on loopback with the standard health service
// (wrapped so that a test can hold its Checks), counting the connections it
// accepts.
type server struct {
	addr     string
	port     int
	srv      *grpc.Server
	health   *health.Server
	accepted atomic.Int64

	// While checkGate is set, each Check waits for it to close (or for
	// its context); inFlight and peak count the Checks running.
	checkGate      atomic.Pointer[chan struct{}]
	inFlight, peak atomic.Int64
	checks         atomic.Int64
	group          atomic.Pointer[gauge] // if set, counts the Checks running at every server of a group
	// While shed is set, every Check answers Unavailable from the
	// handler, as a server shedding load does, over a healthy connection.
	shed atomic.Bool

	stopOnce sync.Once
}

// gauge counts what runs now, and its high-water mark.
type gauge struct{ now, peak atomic.Int64 }

func (g *gauge) up() {
	n := g.now.Add(1)
	for {
		m := g.peak.Load()
		if n <= m || g.peak.CompareAndSwap(m, n) {
			return
		}
	}
}

// startServer starts a server, stopped when the test ends.
func startServer(t *testing.T) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{addr: ln.Addr().String(), port: ln.Addr().(*net.TCPAddr).Port, srv: grpc.NewServer(), health: health.NewServer()}
	healthpb.RegisterHealthServer(s.srv, &gatedHealth{Server: s.health, s: s})
	go func() { _ = s.srv.Serve(&countingListener{Listener: ln, n: &s.accepted}) }()
	t.Cleanup(s.stop)
	return s
}

func (s *server) stop() { s.stopOnce.Do(s.srv.Stop) }

func (s *server) setServing(ok bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if !ok {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus("", st)
}

// gatedHealth is the standard health server whose Check a test can hold.
type gatedHealth struct {
	*health.Server
	s *server
}

func (g *gatedHealth) Check(ctx context.Context, in *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	g.s.checks.Add(1)
	if grp := g.s.group.Load(); grp != nil {
		grp.up()
		defer grp.now.Add(-1)
	}
	if g.s.shed.Load() {
		return nil, status.Error(codes.Unavailable, "test: shedding load")
	}
	n := g.s.inFlight.Add(1)
	defer g.s.inFlight.Add(-1)
	for {
		m := g.s.peak.Load()
		if n <= m || g.s.peak.CompareAndSwap(m, n) {
			break
		}
	}
	if gate := g.s.checkGate.Load(); gate != nil {
		select {
		case <-*gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Server.Check(ctx, in)
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// newPool returns a pool dialing without TLS (unless cfg has a Dial of its
// own), with patience for every timeout cfg leaves zero, closed when the
// test ends.
func newPool(t *testing.T, cfg grpcpool.Config) *grpcpool.Pool {
	t.Helper()
	return newPoolWith(t, cfg, grpcpool.New)
}

func newPoolWith(t *testing.T, cfg grpcpool.Config, mk func(grpcpool.Config) (*grpcpool.Pool, error)) *grpcpool.Pool {
	t.Helper()
	if cfg.Dial == nil && cfg.DialOptions == nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = patience
	}
	if cfg.HealthCheckTimeout == 0 {
		cfg.HealthCheckTimeout = patience
	}
	p, err := mk(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		if st := p.Stats(); st.Open != 0 || st.Draining != 0 {
			t.Errorf("after Close: %d connections open, %d draining", st.Open, st.Draining)
		}
	})
	return p
}

// check is a call: one grpc.health.v1 Check, an error unless SERVING.
func check(ctx context.Context, cc grpc.ClientConnInterface) error {
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return errors.New("not serving")
	}
	return nil
}

// held is a call that stays open until its gate opens: a Watch stream
// (which the server holds as long as the client wants), then, once the
// gate is open, a Check on the same connection. If the pool closed the
// connection meanwhile, the Check fails with Canceled ("the client
// connection is closing").
type held struct {
	started chan struct{}                   // closed once the stream is open
	gate    chan struct{}                   // closed by the test to end the call
	cc      atomic.Pointer[grpc.ClientConn] // the connection the call ran on
	result  error                           // the call's error, once done is closed
	done    chan struct{}
}

func newHeld() *held {
	return &held{started: make(chan struct{}), gate: make(chan struct{}), done: make(chan struct{})}
}

func (h *held) call(ctx context.Context, cci grpc.ClientConnInterface) error {
	if cc, ok := cci.(*grpc.ClientConn); ok {
		h.cc.Store(cc)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := healthpb.NewHealthClient(cci).Watch(sctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if _, err := stream.Recv(); err != nil {
		return err
	}
	close(h.started)
	<-h.gate
	cancel()
	return check(ctx, cci)
}

// run runs h's call through p.Do on addr, on a goroutine, and waits until
// the call holds its connection.
func (h *held) run(t *testing.T, p *grpcpool.Pool, addr string) {
	t.Helper()
	go func() {
		defer close(h.done)
		h.result = p.Do(context.Background(), addr, h.call)
	}()
	select {
	case <-h.started:
	case <-h.done:
		t.Fatalf("held call on %s returned before holding its connection: %v", addr, h.result)
	case <-time.After(hang):
		t.Fatalf("held call on %s did not start within %v", addr, hang)
	}
}

// finish opens h's gate and returns the call's error.
func (h *held) finish(t *testing.T) error {
	t.Helper()
	close(h.gate)
	select {
	case <-h.done:
	case <-time.After(hang):
		t.Fatalf("held call did not return within %v of its gate opening", hang)
	}
	return h.result
}

// openFDs returns the number of this process's open file descriptors, or
// -1 where /proc is absent.
func openFDs(t *testing.T) int {
	t.Helper()
	warmUp.Do(func() {
		// The runtime's network poller keeps a few descriptors (epoll, an
		// eventfd) from its first use on: open it before the baseline.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_ = ln.Close()
	})
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(entries)
}

var warmUp sync.Once

// checkFDs fails the test unless the process gets back to baseline open
// descriptors.
func checkFDs(t *testing.T, baseline int) {
	t.Helper()
	if baseline < 0 {
		t.Log("no /proc/self/fd: descriptors not counted")
		return
	}
	var now int
	if !eventually(func() bool { now = openFDs(t); return now <= baseline }) {
		t.Errorf("%d descriptors open; %d before the test", now, baseline)
	}
}

// sockets counts the TCP connections a pool's dials make, at the level of
// the descriptors: up just before the connect (the socket exists from
// there), down when Close returns. It is independent of the pool's own
// counting, and exact at every instant. (/proc/net/tcp is not: it is read
// a few entries at a time while connections close and open, so one read
// can list a connection closed during the read beside its successor.)
type sockets struct {
	g gauge

	mu     sync.Mutex
	byAddr map[string]int // open now, per address
}

// to returns the sockets open to addr now.
func (s *sockets) to(addr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byAddr[addr]
}

func (s *sockets) add(addr string, n int) {
	s.mu.Lock()
	if s.byAddr == nil {
		s.byAddr = map[string]int{}
	}
	s.byAddr[addr] += n
	s.mu.Unlock()
}

// dialOption makes gRPC dial through s.
func (s *sockets) dialOption() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		s.g.up()
		s.add(addr, 1)
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			s.g.now.Add(-1)
			s.add(addr, -1)
			return nil, err
		}
		return &countedConn{Conn: c, s: s, addr: addr}, nil
	})
}

type countedConn struct {
	net.Conn
	s    *sockets
	addr string
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.s.g.now.Add(-1); c.s.add(c.addr, -1) })
	return err
}

// options is the pool's dial options: no TLS, dialing through s.
func (s *sockets) options() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), s.dialOption()}
}
