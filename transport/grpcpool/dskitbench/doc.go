// Package dskitbench measures grpcpool against the pool it is meant to
// replace, Grafana dskit's ring/client.Pool, the real one, over real gRPC
// servers on loopback. It is a module of its own, so that dskit's
// dependency tree (Prometheus, memberlist, go-kit…) never reaches grpcpool
// or epcache.
//
// Eight scenarios ([Scenarios]), each run against every pool in the same
// process, one after the other:
//
//  1. close under use: held calls while members leave, health flips,
//     connections idle and the cap evicts; calls the pool failed by closing
//     their connection.
//  2. cold fan-out: 64 servers, each dial waiting for Ready behind a
//     modelled 50 ms round trip, every address asked for by 32 callers at
//     once, with and without an address that never answers.
//  3. late report: a failure report about an old connection after its
//     replacement exists.
//  4. rolling restart of 32 servers, in place and to new addresses.
//  5. dead member: connection attempts per second to an address that
//     refuses, with and without ErrorTTL.
//  6. overhead: a call through the pool against a call on a held
//     connection (testing.Benchmark, GOMAXPROCS 1 and 2).
//  7. descriptor budget: MaxConns 8 over 64 servers, all in use, servers in
//     a child process so that /proc/self/fd counts the client's sockets.
//  8. stream limit: 500 callers at once on a server that allows 100 streams
//     a connection, one connection against grpcpool's MaxStreamsPerConn and
//     Dapr's algorithm (issue 43).
//
// cmd/grpcbench runs them all and writes a side-by-side table and JSON.
package dskitbench
