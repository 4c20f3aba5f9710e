package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
)

// tcpMesh is P peers on loopback TCP, each a listener on 127.0.0.1. An
// endpoint is a connection dialed by one peer to another, opened with an
// 8-byte hello (from, to) that the acceptor checks; the acceptor then reads
// until the dialer closes. Release closes the connection; the acceptor's end
// closes on EOF. It is the minimal mesh: the full transport, with one
// connection per pair and frames, is package transport/tcp.
type tcpMesh struct {
	lns    []net.Listener
	addrs  []string
	dialer net.Dialer
	wg     sync.WaitGroup // accept loops and the readers of accepted connections
}

func newTCPMesh(peers int) (mesh, error) {
	m := &tcpMesh{}
	for me := range peers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			m.close()
			return nil, err
		}
		m.lns = append(m.lns, ln)
		m.addrs = append(m.addrs, ln.Addr().String())
		m.wg.Go(func() { m.accept(ln, me) })
	}
	return m, nil
}

func (m *tcpMesh) accept(ln net.Listener, me int) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // the listener was closed
		}
		m.wg.Go(func() {
			defer c.Close()
			var hello [8]byte
			if _, err := io.ReadFull(c, hello[:]); err != nil || int(binary.LittleEndian.Uint32(hello[4:])) != me {
				return // not for this peer, or gone before saying hello
			}
			io.Copy(io.Discard, c) // until the dialer closes its end
		})
	}
}

var errNoPeer = errors.New("bench: no such peer in the mesh")

func (m *tcpMesh) open(ctx context.Context, from, to int) (io.Closer, error) {
	if to < 0 || to >= len(m.addrs) {
		return nil, errNoPeer
	}
	c, err := m.dialer.DialContext(ctx, "tcp", m.addrs[to])
	if err != nil {
		return nil, err
	}
	var hello [8]byte
	binary.LittleEndian.PutUint32(hello[:4], uint32(from))
	binary.LittleEndian.PutUint32(hello[4:], uint32(to))
	if _, err := c.Write(hello[:]); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// roundTrips: the connect (SYN, SYN-ACK). The hello is not answered: the
// dialer writes it and goes on.
func (m *tcpMesh) roundTrips() int { return 1 }

func (m *tcpMesh) close() error {
	var err error
	for _, ln := range m.lns {
		err = errors.Join(err, ln.Close())
	}
	m.wg.Wait()
	return err
}
