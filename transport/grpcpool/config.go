package grpcpool

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults for the zero fields of [Config].
const (
	// DefaultDialTimeout is the DialTimeout of a zero Config.DialTimeout:
	// gRPC's own minimum connect timeout.
	DefaultDialTimeout = 20 * time.Second
	// DefaultHealthCheckTimeout is the HealthCheckTimeout of a zero
	// Config.HealthCheckTimeout.
	DefaultHealthCheckTimeout = time.Second
	// DefaultMaxConcurrentHealthChecks is the MaxConcurrentHealthChecks of
	// a zero Config.MaxConcurrentHealthChecks, as in dskit.
	DefaultMaxConcurrentHealthChecks = 16
)

// Config configures a [Pool]. Every field is optional; a zero value means
// the default: no health checking, no idle timeout, no bound, no drain
// delay, failed dials not remembered.
type Config struct {
	// Dial makes addr's connection. Default: grpc.NewClient(addr, DialOptions...).
	//
	// It is called at most once at a time per connection: per address
	// without MaxStreamsPerConn; with it, the dials of one address's
	// connections run at once (one per MaxStreamsPerConn calls waiting, up
	// to MaxConnsPerAddr), each connection dialed once. Each runs on a
	// goroutine of its own, with a ctx that ends at DialTimeout or Close. The pool then
	// waits for the connection to be Ready (see the package doc), and owns
	// it: it closes it exactly once, and closes it too if the dial fails
	// afterwards, or returns too late. A Dial that panics or calls
	// runtime.Goexit (t.FailNow in a test) fails the dial with an error
	// that says so, and leaves nothing behind. A Dial that ignores ctx
	// keeps its callers waiting no longer than DialTimeout, but delays
	// Close until it returns.
	Dial        func(ctx context.Context, addr string) (*grpc.ClientConn, error)
	DialOptions []grpc.DialOption

	// IsConnError, if set, reports whether a call's error means its
	// connection is bad and must be dropped. Default: the error has status
	// code Unavailable and the connection is not Ready when the call
	// returns (gRPC's connectivity state of the ClientConn: IDLE,
	// CONNECTING, TRANSIENT_FAILURE or SHUTDOWN, because gRPC saw its
	// transport fail). So an Unavailable that a server's handler answers
	// over a Ready connection (a server shedding load) keeps the
	// connection, as every other application error does. A call that
	// fails in the moment between its transport's failure and gRPC's
	// notice of it keeps the connection too, which gRPC reconnects; the
	// next call that fails on it drops it. [IsUnavailable] is the rule
	// for a user who wants every Unavailable to drop the connection.
	IsConnError func(error) bool

	// MaxConns, if positive, bounds the connections open at every instant:
	// dials in progress, connections in the pool, and dropped connections
	// whose calls or drain delay still run, all together, each holding one
	// slot: one unit of epcache's [epcache.Config.MaxEntries], the only
	// count (a draining connection holds its unit through a lease of the
	// pool's). When the pool is full, a Do for an address without a
	// connection evicts an unleased connection (one no call is using) that
	// has not been used since the clock hand last passed it, choosing among
	// those the one asked for least often (a CLOCK weighed by a frequency
	// sketch): an address called often outlives one called once, even if
	// that one was called more recently. The policy is epcache's
	// [epcache.Config.MaxEntries]. When every connection is in use or
	// draining, the Do waits for a slot, until its context ends, with an
	// error that says it waited for a slot under MaxConns. That wait comes
	// before any dial: it is no failure of the address's, and ErrorTTL
	// never remembers it.
	MaxConns int

	// IdleTimeout, if positive, closes a connection no call has used for
	// about this long (between IdleTimeout and 5/4 IdleTimeout: epcache
	// IdleTimeout). A connection a call is using is never idle; health
	// checks do not count as use.
	IdleTimeout time.Duration

	// DialTimeout bounds one dial: Dial, the wait for Ready and DialRetry's
	// retries together (epcache CreateTimeout). DefaultDialTimeout if 0.
	DialTimeout time.Duration

	// DialRetry, if set, decides whether and when a failed dial is tried
	// again within DialTimeout (epcache Retry), for example
	// epcache.Backoff(50*time.Millisecond, time.Second, 0, nil): capped
	// exponential backoff with jitter. The callers waiting for the dial see
	// only its final outcome. Nil: one attempt.
	DialRetry func(attempt int, err error) (wait time.Duration, retry bool)

	// ErrorTTL, if positive, makes a failed dial the answer for that
	// address, without dialing again, for ErrorTTL: a dead member is not
	// hammered. It is [epcache.Config.ErrorTTL], with its conventions: 0
	// remembers nothing, so that every Do for a dead address dials it
	// (thousands of connects a second from a busy caller: set it, to about
	// a second, as often as gRPC's own reconnect backoff starts), and a
	// negative ErrorTTL is an error. SetMembers forgets the failure of an
	// address it adds to the members, so that a member that comes back is
	// dialed at once; so does Forget.
	ErrorTTL time.Duration

	// HealthCheckInterval, if positive, health-checks every connection of
	// the pool this often with the grpc.health.v1 protocol. 0: no health
	// checks.
	HealthCheckInterval time.Duration
	// HealthCheckTimeout bounds one check. DefaultHealthCheckTimeout if 0.
	HealthCheckTimeout time.Duration
	// HealthCheckGracePeriod is how long a connection's checks may fail
	// (from the first failure, reset by a success) before it is dropped. 0:
	// dropped at its first failed check.
	HealthCheckGracePeriod time.Duration
	// MaxConcurrentHealthChecks bounds the checks in flight.
	// DefaultMaxConcurrentHealthChecks if 0.
	MaxConcurrentHealthChecks int
	// HealthService is the service name the checks ask about; "" is the
	// server as a whole.
	HealthService string

	// MaxStreamsPerConn, if positive, is how many calls one connection
	// carries at once before the pool opens another to the same address
	// (an HTTP/2 server's SETTINGS_MAX_CONCURRENT_STREAMS, 100 for many,
	// past which gRPC queues calls on the client). 0: no limit, one
	// connection per address. A call goes to the least loaded of the ready
	// connections its address's calls need (the lowest-numbered
	// ⌈(calls + 1) ÷ MaxStreamsPerConn⌉), so that the connections a falling
	// load leaves unneeded go unused together and IdleTimeout closes them
	// in one step. When
	// every connection of the address carries MaxStreamsPerConn calls, the
	// calls that wait are counted onto connections being dialed, each
	// dialed once: ⌈waiting ÷ MaxStreamsPerConn⌉ dials at once, not one
	// per caller, not one at a time. A call whose growth dial fails (or
	// whose failure ErrorTTL remembers) runs over the limit on the least
	// loaded ready connection of its address, if there is one, rather
	// than fail. Every connection holds a slot under
	// MaxConns, and a connection error drops the one it happened on. Calls
	// to a non-member all share its one connection (see the package doc).
	MaxStreamsPerConn int
	// MaxConnsPerAddr, with MaxStreamsPerConn, bounds the connections to
	// one address (0: no bound but MaxConns). A call that finds every
	// stream of the bound's connections taken runs on the least loaded of
	// them, over MaxStreamsPerConn, where gRPC queues it.
	MaxConnsPerAddr int

	// DrainDelay, if positive, keeps a connection dropped because its member
	// left (SetMembers) or failed its health checks open for this long after
	// the drop, whatever its calls do (they keep it open longer if they
	// run longer). A draining connection holds its slot under MaxConns,
	// as a connection in use does: a call that needs a slot evicts an
	// idle connection rather than wait for a drain. A non-member's
	// connection never drains (see the package doc). Close cuts drain
	// delays short.
	DrainDelay time.Duration
}

func (cfg *Config) validate() error {
	switch {
	case cfg.ErrorTTL < 0:
		return fmt.Errorf("grpcpool: Config.ErrorTTL is %v; want 0 (failures not remembered) or a positive duration", cfg.ErrorTTL)
	case cfg.MaxConns < 0:
		return fmt.Errorf("grpcpool: Config.MaxConns is %d; want 0 (no bound) or a positive count", cfg.MaxConns)
	case cfg.IdleTimeout < 0:
		return fmt.Errorf("grpcpool: Config.IdleTimeout is %v; want 0 (never) or a positive duration", cfg.IdleTimeout)
	case cfg.DialTimeout < 0:
		return fmt.Errorf("grpcpool: Config.DialTimeout is %v; want 0 (default %v) or a positive duration", cfg.DialTimeout, DefaultDialTimeout)
	case cfg.HealthCheckInterval < 0:
		return fmt.Errorf("grpcpool: Config.HealthCheckInterval is %v; want 0 (no health checks) or a positive duration", cfg.HealthCheckInterval)
	case cfg.HealthCheckTimeout < 0:
		return fmt.Errorf("grpcpool: Config.HealthCheckTimeout is %v; want 0 (default %v) or a positive duration", cfg.HealthCheckTimeout, DefaultHealthCheckTimeout)
	case cfg.HealthCheckGracePeriod < 0:
		return fmt.Errorf("grpcpool: Config.HealthCheckGracePeriod is %v; want 0 or a positive duration", cfg.HealthCheckGracePeriod)
	case cfg.MaxConcurrentHealthChecks < 0:
		return fmt.Errorf("grpcpool: Config.MaxConcurrentHealthChecks is %d; want 0 (default %d) or a positive count", cfg.MaxConcurrentHealthChecks, DefaultMaxConcurrentHealthChecks)
	case cfg.MaxStreamsPerConn < 0:
		return fmt.Errorf("grpcpool: Config.MaxStreamsPerConn is %d; want 0 (no limit, one connection per address) or a positive count", cfg.MaxStreamsPerConn)
	case cfg.MaxConnsPerAddr < 0:
		return fmt.Errorf("grpcpool: Config.MaxConnsPerAddr is %d; want 0 (no bound but MaxConns) or a positive count", cfg.MaxConnsPerAddr)
	case cfg.DrainDelay < 0:
		return fmt.Errorf("grpcpool: Config.DrainDelay is %v; want 0 (none) or a positive duration", cfg.DrainDelay)
	}
	return nil
}

// withDefaults returns cfg with its zero fields set to the defaults.
func (cfg Config) withDefaults() Config {
	if cfg.Dial == nil {
		opts := cfg.DialOptions
		cfg.Dial = func(_ context.Context, addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, opts...)
		}
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.HealthCheckTimeout == 0 {
		cfg.HealthCheckTimeout = DefaultHealthCheckTimeout
	}
	if cfg.MaxConcurrentHealthChecks == 0 {
		cfg.MaxConcurrentHealthChecks = DefaultMaxConcurrentHealthChecks
	}
	return cfg
}

// IsUnavailable reports whether err carries gRPC status code Unavailable,
// which gRPC gives a call whose connection failed or could not be made,
// and a server may answer itself. As Config.IsConnError, it drops a
// connection on every Unavailable, a server's own included; the default
// also asks the connection's state (see Config.IsConnError).
func IsUnavailable(err error) bool {
	return status.Code(err) == codes.Unavailable
}
