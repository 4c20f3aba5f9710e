package dskitbench

import (
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Server is a gRPC server on loopback with the standard health service.
// Its Watch stream holds a call open as long as the client likes.
type Server struct {
	Addr   string
	Health *health.Server

	mu   sync.Mutex
	srv  *grpc.Server
	rtt  time.Duration
	opts []grpc.ServerOption
}

// StartServer starts a server on a free loopback port. With rtt > 0, every
// connection it accepts sees its first byte read and written only rtt after
// the accept: a modelled round trip before the HTTP/2 handshake completes,
// so that a client's dial waits at least rtt for Ready.
func StartServer(rtt time.Duration) (*Server, error) {
	return startServerAt("127.0.0.1:0", rtt)
}

func startServerAt(addr string, rtt time.Duration) (*Server, error) {
	return startServerWithAt(addr, rtt)
}

// startServerWith is StartServer with options for the gRPC server.
func startServerWith(rtt time.Duration, opts ...grpc.ServerOption) (*Server, error) {
	return startServerWithAt("127.0.0.1:0", rtt, opts...)
}

func startServerWithAt(addr string, rtt time.Duration, opts ...grpc.ServerOption) (*Server, error) {
	ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: ln.Addr().String(), Health: health.NewServer(), rtt: rtt, opts: opts}
	s.serve(ln)
	return s, nil
}

// listen listens on addr, retrying a port still held for a moment by the
// server that just left it.
func listen(addr string) (net.Listener, error) {
	var err error
	for range 200 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil, fmt.Errorf("listen %s: %w", addr, err)
}

func (s *Server) serve(ln net.Listener) {
	srv := grpc.NewServer(s.opts...)
	healthpb.RegisterHealthServer(srv, s.Health)
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	var l net.Listener = ln
	if s.rtt > 0 {
		l = &delayListener{Listener: ln, rtt: s.rtt}
	}
	go func() { _ = srv.Serve(l) }()
}

// SetServing sets the server's overall health.
func (s *Server) SetServing(ok bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if !ok {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.Health.SetServingStatus("", st)
}

// Restart stops the server gracefully (calls in flight finish) and starts
// it again on the same address, with a fresh health service.
func (s *Server) Restart() error {
	s.GracefulStop()
	ln, err := listen(s.Addr)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.Health = health.NewServer()
	s.mu.Unlock()
	s.serve(ln)
	return nil
}

// GracefulStop stops the server once its calls in flight have finished.
func (s *Server) GracefulStop() {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	srv.GracefulStop()
}

// Stop stops the server at once.
func (s *Server) Stop() {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	srv.Stop()
}

// StartServers starts n servers.
func StartServers(n int, rtt time.Duration) ([]*Server, error) {
	var out []*Server
	for range n {
		s, err := StartServer(rtt)
		if err != nil {
			StopAll(out)
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// StopAll stops servers at once.
func StopAll(servers []*Server) {
	for _, s := range servers {
		s.Stop()
	}
}

// Addrs returns the servers' addresses.
func Addrs(servers []*Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Addr
	}
	return out
}

// delayListener delays the first read and write of every accepted
// connection until rtt after its accept.
type delayListener struct {
	net.Listener
	rtt time.Duration
}

func (l *delayListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &delayConn{Conn: c, ready: time.Now().Add(l.rtt)}, nil
}

type delayConn struct {
	net.Conn
	ready time.Time
	once  sync.Once
}

func (c *delayConn) wait() {
	c.once.Do(func() { time.Sleep(time.Until(c.ready)) })
}

func (c *delayConn) Read(b []byte) (int, error) {
	c.wait()
	return c.Conn.Read(b)
}

func (c *delayConn) Write(b []byte) (int, error) {
	c.wait()
	return c.Conn.Write(b)
}

// SilentAddr listens and never accepts: the kernel completes the TCP
// handshake, and no HTTP/2 ever comes back. Close the listener to end it.
func SilentAddr() (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:0")
}

// DeadAddr is a loopback address nothing listens on: connects are refused.
func DeadAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}
