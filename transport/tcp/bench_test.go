package tcp_test

import (
	"context"
	"net"
	"testing"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
)

// BenchmarkSend is one Send of a 64-byte frame on a connection already
// made, to a peer whose receiver takes every frame: what a frame costs the
// sender (a lease, the look at the connection's TCP state, one write).
func BenchmarkSend(b *testing.B) {
	dir, err := directory.New(directory.Options{Size: 2})
	if err != nil {
		b.Fatal(err)
	}
	cfg := tcp.Config{Directory: dir, HandshakeTimeout: patience, CreateTimeout: patience}
	a, err := tcp.Listen(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ID = 1
	r, err := tcp.Listen(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := r.Recv(ctx); err != nil {
				return
			}
		}
	}()
	frame := make([]byte, 64)
	if err := a.Send(ctx, 1, frame); err != nil { // connects
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := a.Send(ctx, 1, frame); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := a.Close(); err != nil {
		b.Error(err)
	}
	if err := r.Close(); err != nil {
		b.Error(err)
	}
	<-done
}

// BenchmarkRemoteShut is the look Send takes at a connection's TCP state
// before each write (tcp.RemoteShut: getsockopt TCP_INFO on Linux), on a
// loopback connection, for scale beside BenchmarkSend.
func BenchmarkRemoteShut(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for b.Loop() {
		if tcp.RemoteShut(c) {
			b.Fatal("an open connection reported shut")
		}
	}
}
