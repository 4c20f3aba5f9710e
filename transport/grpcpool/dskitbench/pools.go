package dskitbench

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"github.com/go-kit/log"
	"github.com/grafana/dskit/ring/client"
	"github.com/grafana/dskit/services"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Call is what a caller runs on a pool's connection.
type Call func(ctx context.Context, cc grpc.ClientConnInterface) error

// Pool is the small interface every comparator implements.
type Pool interface {
	// Do runs call on addr's connection. A connection error reported by
	// call is handled as the pool's users handle it.
	Do(ctx context.Context, addr string, call Call) error
	// SetMembers makes addrs the members (dskit: what its discovery
	// returns at its next check).
	SetMembers(addrs []string)
	// Close closes the pool and every connection it made.
	Close() error
}

// Options are the settings both pools get, in their own terms.
type Options struct {
	Dialer        *Dialer
	CheckInterval time.Duration // health checks and (dskit) stale-member removal; 0: none
	Grace         time.Duration // health check grace period
	HealthTimeout time.Duration
	DialTimeout   time.Duration // epcache's DialTimeout; dskit's factory's wait for Ready when WaitReady
	IdleTimeout   time.Duration // epcache only: dskit has none
	MaxConns      int           // epcache only: dskit has none
	ErrorTTL      time.Duration // epcache only: 0 remembers no failure
	DialRetry     func(int, error) (time.Duration, bool)
	DrainDelay    time.Duration // epcache only
	// StreamsPerConn is grpcpool's MaxStreamsPerConn (epcache only: 0,
	// one connection per address).
	StreamsPerConn int
	IsConnError    func(error) bool // epcache only: grpcpool's Config.IsConnError (nil: its default)
	// OnConnError is what a dskit user does about a call's connection
	// error: nothing, RemoveClientFor(addr) (the pattern of mimir #13123),
	// or RemoveClient(client, addr) (remove-by-value, dskit #439).
	OnConnError Report
	// WaitReady makes dskit's factory wait for Ready, as grpcpool's dial
	// does: dskit then holds its write lock through the wait.
	WaitReady bool
}

// Report is how a dskit user reports a bad connection.
type Report int

const (
	ReportNothing Report = iota
	ReportByAddr         // RemoveClientFor(addr)
	ReportByValue        // RemoveClient(client, addr)
)

// Dialer dials TCP for the pools and counts what the sockets do: connect
// attempts and sockets open (exact at every instant: up just before the
// connect, down when Close returns), per address and in all.
type Dialer struct {
	mu       sync.Mutex
	attempts map[string]int
	closedAt map[string]time.Time // last close of a socket to the address

	Attempts atomic.Int64
	open     atomic.Int64
	peak     atomic.Int64
}

// NewDialer returns a Dialer.
func NewDialer() *Dialer {
	return &Dialer{attempts: map[string]int{}, closedAt: map[string]time.Time{}}
}

// Option is the grpc.DialOption that dials through d.
func (d *Dialer) Option() grpc.DialOption {
	return grpc.WithContextDialer(d.dial)
}

func (d *Dialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.attempts[addr]++
	d.mu.Unlock()
	d.Attempts.Add(1)
	raise(&d.peak, d.open.Add(1))
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		d.open.Add(-1)
		return nil, err
	}
	return &countedConn{Conn: c, d: d, addr: addr}, nil
}

// AttemptsTo returns the connect attempts to addr.
func (d *Dialer) AttemptsTo(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.attempts[addr]
}

// ClosedAt returns when the last socket to addr was closed.
func (d *Dialer) ClosedAt(addr string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.closedAt[addr]
	return t, ok
}

// Open and Peak are the sockets open now and at most.
func (d *Dialer) Open() int64 { return d.open.Load() }
func (d *Dialer) Peak() int64 { return d.peak.Load() }

type countedConn struct {
	net.Conn
	d    *Dialer
	addr string
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.d.open.Add(-1)
		c.d.mu.Lock()
		c.d.closedAt[c.addr] = time.Now()
		c.d.mu.Unlock()
	})
	return err
}

func raise(peak *atomic.Int64, n int64) {
	for {
		m := peak.Load()
		if n <= m || peak.CompareAndSwap(m, n) {
			return
		}
	}
}

func dialOptions(d *Dialer) []grpc.DialOption {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if d != nil {
		opts = append(opts, d.Option())
	}
	return opts
}

// Epcache is grpcpool.
type Epcache struct{ *grpcpool.Pool }

// NewEpcache returns a grpcpool.Pool with o's settings.
func NewEpcache(o Options) (*Epcache, error) {
	p, err := grpcpool.New(grpcpool.Config{
		DialOptions:            dialOptions(o.Dialer),
		MaxConns:               o.MaxConns,
		IdleTimeout:            o.IdleTimeout,
		DialTimeout:            o.DialTimeout,
		DialRetry:              o.DialRetry,
		ErrorTTL:               o.ErrorTTL,
		HealthCheckInterval:    o.CheckInterval,
		HealthCheckTimeout:     o.HealthTimeout,
		HealthCheckGracePeriod: o.Grace,
		DrainDelay:             o.DrainDelay,
		IsConnError:            o.IsConnError,
		MaxStreamsPerConn:      o.StreamsPerConn,
	})
	if err != nil {
		return nil, err
	}
	return &Epcache{p}, nil
}

// Do is grpcpool's Do.
func (p *Epcache) Do(ctx context.Context, addr string, call Call) error {
	return p.Pool.Do(ctx, addr, call)
}

// Dskit is dskit's ring/client.Pool, started, with a factory of gRPC
// clients and a discovery that returns the members SetMembers set.
type Dskit struct {
	*client.Pool
	o       Options
	members atomic.Pointer[[]string]

	Factories atomic.Int64 // factory calls (dskit's "dials")
	closes    sync.WaitGroup
}

// dskitClient is the PoolClient dskit keeps: a health client and its
// connection.
type dskitClient struct {
	healthpb.HealthClient
	cc     *grpc.ClientConn
	closed func()
}

func (c *dskitClient) Close() error {
	defer c.closed()
	return c.cc.Close()
}

// NewDskit starts a dskit pool with o's settings.
func NewDskit(o Options) (*Dskit, error) {
	d := &Dskit{o: o}
	cfg := client.PoolConfig{
		CheckInterval:          o.CheckInterval,
		HealthCheckEnabled:     o.CheckInterval > 0,
		HealthCheckTimeout:     o.HealthTimeout,
		HealthCheckGracePeriod: o.Grace,
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = time.Hour // the timer service needs one
	}
	var discovery client.PoolServiceDiscovery
	if o.CheckInterval > 0 {
		discovery = func() ([]string, error) {
			if m := d.members.Load(); m != nil {
				return *m, nil
			}
			return d.RegisteredAddresses(), nil // no members set: keep all
		}
	}
	d.Pool = client.NewPool("bench", cfg, discovery, client.PoolAddrFunc(d.factory), nil, log.NewNopLogger())
	if err := services.StartAndAwaitRunning(context.Background(), d.Pool); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Dskit) factory(addr string) (client.PoolClient, error) {
	d.Factories.Add(1)
	cc, err := grpc.NewClient(addr, dialOptions(d.o.Dialer)...)
	if err != nil {
		return nil, err
	}
	if d.o.WaitReady {
		ctx, cancel := context.WithTimeout(context.Background(), d.o.DialTimeout)
		defer cancel()
		if err := waitReady(ctx, cc); err != nil {
			_ = cc.Close() // cortex #7759: dskit would leak it
			return nil, err
		}
	}
	d.closes.Add(1)
	return &dskitClient{HealthClient: healthpb.NewHealthClient(cc), cc: cc, closed: d.closes.Done}, nil
}

// Do gets addr's client and runs call on its connection; a connection
// error is reported as o.OnConnError says.
func (d *Dskit) Do(ctx context.Context, addr string, call Call) error {
	c, err := d.GetClientFor(addr)
	if err != nil {
		return err
	}
	dc := c.(*dskitClient)
	err = call(ctx, dc.cc)
	if err != nil && status.Code(err) == codes.Unavailable {
		switch d.o.OnConnError {
		case ReportByAddr:
			d.RemoveClientFor(addr)
		case ReportByValue:
			d.RemoveClient(c, addr)
		}
	}
	return err
}

// SetMembers sets what discovery returns: dskit removes the others at its
// next check.
func (d *Dskit) SetMembers(addrs []string) {
	m := append([]string(nil), addrs...)
	d.members.Store(&m)
}

// Close stops the pool's service and closes every client (dskit's Pool
// does not: its users remove them), waiting for the closes.
func (d *Dskit) Close() error {
	err := services.StopAndAwaitTerminated(context.Background(), d.Pool)
	for _, a := range d.RegisteredAddresses() {
		d.RemoveClientFor(a)
	}
	d.closes.Wait()
	return err
}

// waitReady is grpcpool's policy, for dskit's factory: connect and wait
// for Ready, failing at TRANSIENT_FAILURE or ctx's end.
func waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	cc.Connect()
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return errors.New("connection failed")
		case connectivity.Idle:
			cc.Connect()
		}
		if !cc.WaitForStateChange(ctx, s) {
			return ctx.Err()
		}
	}
}

// ClosedByPool reports whether a call failed because its connection was
// closed under it: gRPC's Canceled "the client connection is closing".
func ClosedByPool(err error) bool {
	return status.Code(err) == codes.Canceled && strings.Contains(err.Error(), "client connection is closing")
}

// Held returns a call that holds its connection for d: a Watch stream,
// opened, read for d, then cancelled. Its error is nil if the stream
// lasted d; a stream that ends before (a connection closed under it, a
// server stopped hard) returns its error. The hold is timed here, not by a
// deadline on the stream, whose end the server may report first, in its
// own words.
func Held(d time.Duration, opts ...grpc.CallOption) Call {
	return func(ctx context.Context, cc grpc.ClientConnInterface) error {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := healthpb.NewHealthClient(cc).Watch(sctx, &healthpb.HealthCheckRequest{}, opts...)
		if err != nil {
			return err
		}
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					ended <- err
					return
				}
			}
		}()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
			<-ended
			return nil
		case err := <-ended:
			return err
		}
	}
}

// Check is a unary call: one health Check.
func Check(opts ...grpc.CallOption) Call {
	return func(ctx context.Context, cc grpc.ClientConnInterface) error {
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, opts...)
		return err
	}
}
