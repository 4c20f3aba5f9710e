// Package grpcpool keeps one *grpc.ClientConn per address, on an
// [github.com/epcache/epcache/epcache] cache: the connection pool of a
// service that calls the members of a ring (Mimir's ingesters, Loki's
// queriers) by address.
//
// [Pool.Do] runs a call on addr's connection. The first Do for an address
// dials it, exactly once however many goroutines ask at once; the others
// wait for that dial, each able to leave on its own context. Do holds the
// connection for the call (an epcache lease): nothing the pool does closes
// a connection while a call on it runs. A dropped connection leaves the pool
// at once, so that the next Do dials a new one, but it is closed only when
// its last call returns.
//
// # Why
//
// The pools in use close connections under their callers. Grafana dskit's
// ring/client.Pool, for one, has no reference count: removing a departed
// member, a failed health check or a caller's error report closes the
// client at once, and calls in flight on it fail with Canceled ("grpc: the
// client connection is closing": dskit #788, mimir #13123, #13521). Its
// factory runs under the pool's write lock, so a slow dial holds up every
// other address's first call, and a late report about an old client could
// remove its replacement until remove-by-value was added (dskit #439).
// Pool avoids those by construction: epcache's leases keep a connection in
// use open, and [Pool.Do] reports a bad connection with
// CompareAndInvalidate, which drops exactly that connection and never its
// replacement.
//
// # Dialing
//
// A dial waits for the connection to be Ready. grpc.NewClient does not
// connect; the pool calls Connect and waits (WaitForStateChange) until the
// connection is Ready, fails, or Config.DialTimeout ends. A connection that
// enters TRANSIENT_FAILURE (the address does not resolve, nothing listens,
// the server is not gRPC) fails the dial at once with the reason gRPC gives,
// and one that never answers fails it at DialTimeout. So a dead address
// costs its callers one failed dial, remembered for Config.ErrorTTL (set
// it: by default nothing is remembered) so that it is not hammered,
// instead of hanging every call until its own deadline; and a call that
// Do runs starts on a connection that was Ready a moment ago. Config.DialRetry
// retries a failed dial within DialTimeout (with [epcache.Backoff]: capped
// exponential backoff with jitter), so that a member restarting in place is
// waited for.
//
// # Dropping a connection
//
// A connection leaves the pool when:
//
//   - a call on it fails with a connection error (Config.IsConnError; by
//     default, status code Unavailable on a connection gRPC has seen fail:
//     a server's own Unavailable, like every application error, never
//     drops a connection);
//   - its address is no longer a member ([Pool.SetMembers]);
//   - its health checks (the standard grpc.health.v1 protocol, every
//     Config.HealthCheckInterval) have failed for Config.HealthCheckGracePeriod;
//   - no call has used it for Config.IdleTimeout;
//   - the pool needs its room for another address (Config.MaxConns): only a
//     connection no call is using is evicted;
//   - its address is not a member and its last call ended (see below);
//   - the pool is closed.
//
// A member's connection dropped because the member left or failed its
// health checks stays open for Config.DrainDelay after the drop, and in
// every case until its last call returns; it holds its unit of MaxConns
// meanwhile. A non-member's connection never drains, even when its health
// checks fail (see below). Connections that failed, idle connections and
// evicted connections (no call uses them) close as soon as their last call
// returns.
//
// # Addresses that are not members
//
// Once SetMembers has been called, Do still serves an address that is not
// a member (a ring client calls a member it learnt of before the pool's
// next SetMembers), on a connection that lives only as long as the calls on
// it. The calls to such an address that overlap in time share one
// connection: the first dials it, once, and every call that begins while
// another runs on it or waits for it uses it. It is closed when the last of
// them ends, before that call's Do returns; if every call that waited for
// it left first (its context ended), when its dial ends. It never drains
// (DrainDelay), whatever dropped it (its health checks included), and holds
// no unit of MaxConns after that. Calls that do not overlap dial a
// connection each.
//
// A member that departs ([Pool.SetMembers]) has its connection dropped at
// once, to drain, even when calls that began while its address was not a
// member still run on it: the departure is a member's.
//
// The rule covers a dial in flight when SetMembers removes its address: its
// connection is the non-member's. Every call waiting for that dial, one
// that asked while the address was a member as well, runs on the one
// connection it makes, and the last of them closes it; if none waits, it
// is closed when the dial ends (counted in Stats.Abandoned). A dial whose
// address leaves and comes back before it ends makes a member's
// connection, which stays. [Pool.Warm] skips an address that is not a member: its
// connection would close as Warm returned.
//
// # Several connections per address
//
// An HTTP/2 connection carries at most the server's
// SETTINGS_MAX_CONCURRENT_STREAMS calls at once (100 is common); past it,
// gRPC queues calls on the client. With Config.MaxStreamsPerConn, a
// member's calls beyond that many on each of its connections open another
// connection to the address, up to Config.MaxConnsPerAddr:
//
//	pool, err := grpcpool.New(grpcpool.Config{
//		MaxStreamsPerConn: 100, // the servers' grpc.MaxConcurrentStreams
//		MaxConnsPerAddr:   8,
//		IdleTimeout:       time.Minute, // closes the connections a falling load leaves unneeded
//	})
//
// Each connection of an address is dialed once, however many callers need
// it: the calls that find every stream taken are counted onto the
// connections being dialed, MaxStreamsPerConn to each, so that 400 waiting
// callers wait for 4 dials made at once. A call that fits on an open
// connection never waits for those dials, and a waiting call takes a
// stream freed meanwhile, under a full MaxConns too. Known limits: when
// MaxConns is full and an address's calls take its one connection's
// streams in turn without pause, a growth dial waiting for room may still
// evict that connection between two calls, and it is dialed again; the
// calls still running on a connection that a connection error dropped
// count against its replacement until they end, so that a call may wait
// for a growth dial it did not need; and a call waiting for one growth
// dial does not move to a connection dialed at the same time that is
// published with a stream free because its own caller left (a Dial that
// ignores its context). An address
// is warm (Pool.Warm) when any of its connections is ready; an address
// keeps no memory in the pool once its connections, dials, remembered
// failures and calls are gone, whether it left the members or SetMembers
// was never called. Every connection is one slot of MaxConns, is
// health-checked, drained, dropped by its own connection errors and
// closed by IdleTimeout like an address's only one; SetMembers and Close
// reach all of them. Calls to a non-member share its one connection.
//
// # Health checks
//
// Every HealthCheckInterval, the pool sends a grpc.health.v1 Check
// (service Config.HealthService) on each of its connections, at most
// Config.MaxConcurrentHealthChecks at a time, each bounded by
// Config.HealthCheckTimeout. A check answered SERVING clears a failure; any
// other answer or error starts (or continues) one, and a connection still
// failing HealthCheckGracePeriod after its first failed check is dropped. A
// health check is not a use: it does not keep a connection from going idle,
// and it does not hold the connection (a connection the pool drops
// meanwhile fails its check, and that failure is ignored).
//
// # Limits
//
// A call must be done with its connection when it returns: a stream it
// opened must be finished or cancelled by then. A call that calls Do for
// another address while the pool is full (MaxConns) may wait for room that
// only its own return would free.
//
// A call that finds no connection ready in the instant a dial of its
// address ends, abandoned (no call waited for it), dials again: it had
// not yet counted itself among the dial's callers, which is what spares
// the hit path a lock.
//
// A dial whose connection stops having a use in the instant between the
// dial's last look at the members and the cache's publication of the
// connection (SetMembers removes the address, or the last call waiting for
// a non-member's dial leaves) leaves that connection in the pool, unused,
// until the next SetMembers, health round or call to the address drops it,
// or IdleTimeout or MaxConns removes it: the cache tells the pool nothing
// when it publishes a value.
package grpcpool
