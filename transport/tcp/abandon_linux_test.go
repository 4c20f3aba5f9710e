package tcp

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/internal/meshtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An acceptor never takes a connection whose dialer has gone. A dial given
// up right after its hello (cut short because the other peer's own
// connection won, timed out, or its process died) can wait in the
// acceptor's backlog whole: hello, then the end of the stream. Offered to
// the cache, it would answer the Sends waiting for that peer, which would
// write their frames into it and report them sent. Here peer 1 waits for a
// connection to peer 0 (the test, which holds peer 1's dial unanswered)
// when such a connection "from peer 0" arrives: peer 1 refuses it, and its
// frame goes on its own dial once the test answers that.
func TestAbandonedDialIsNotTaken(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.NoError(t, dir.Publish(0, ln.Addr().String()))
	// Peer 1's dial waits for the test's answer as long as the test takes.
	p, err := Listen(Config{ID: 1, Directory: dir, HandshakeTimeout: meshtest.Patience, CreateTimeout: meshtest.Patience})
	require.NoError(t, err)
	defer p.Close()

	sent := make(chan error, 1)
	go func() { sent <- p.Send(context.Background(), 0, []byte("frame")) }()
	dialed, err := ln.Accept() // peer 1's dial: its hello is read, and not answered yet
	require.NoError(t, err)
	defer dialed.Close()
	var hb [helloSize]byte
	_, err = io.ReadFull(dialed, hb[:])
	require.NoError(t, err)

	// The acceptor registers a connection it accepts under p.mu before it
	// reads a byte of it: held here, it cannot read the hello until the end
	// of the stream is in its socket too (acknowledged: the dialer's end is
	// in FIN_WAIT2), however slowly the dialer's steps follow one another.
	func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		gone, err := net.Dial("tcp", p.Addr())
		require.NoError(t, err)
		defer gone.Close() // the dialer goes before the acceptor has read a byte
		h := hello{from: 0, to: 1, inc: 7, nonce: 42}
		b := h.marshal()
		_, err = gone.Write(b[:])
		require.NoError(t, err)
		require.NoError(t, gone.(*net.TCPConn).CloseWrite())
		require.True(t, meshtest.Eventually(t, func() bool { return tcpState(t, gone.(*net.TCPConn)) == tcpFinWait2 },
			"the acceptor's kernel never acknowledged the end of the stream"))
	}()
	require.True(t, meshtest.Eventually(t, func() bool { return p.Stats().Abandoned > 0 || len(sent) > 0 }))
	select {
	case err := <-sent:
		t.Fatalf("Send returned (%v) with a connection whose dialer had gone; stats %+v", err, p.Stats())
	default:
	}
	st := p.Stats()
	assert.EqualValues(t, 1, st.Abandoned, "the connection was closed unused")
	assert.Zero(t, st.Cache.Offers)

	rep := reply{verdict: verdictAccept, from: 0, inc: 7}
	rb := rep.marshal()
	_, err = dialed.Write(rb[:])
	require.NoError(t, err)
	require.NoError(t, <-sent)
	require.NoError(t, dialed.SetReadDeadline(time.Now().Add(meshtest.Hang)))
	var fh [frameHead]byte
	_, err = io.ReadFull(dialed, fh[:])
	require.NoError(t, err)
	payload := make([]byte, binary.BigEndian.Uint32(fh[:]))
	_, err = io.ReadFull(dialed, payload)
	require.NoError(t, err)
	assert.Equal(t, "frame", string(payload), "the frame came on peer 1's own dial")
}

// tcpFinWait2 is Linux's TCP_FIN_WAIT2: this end's FIN was acknowledged.
const tcpFinWait2 = 5

// tcpState returns the state of nc's socket: the first byte of Linux's
// struct tcp_info (tcpi_state), of the first four bytes that
// getsockopt(TCP_INFO) copies into an int (the kernel copies as much of
// the struct as fits).
func tcpState(t *testing.T, nc *net.TCPConn) byte {
	t.Helper()
	rc, err := nc.SyscallConn()
	require.NoError(t, err)
	var (
		v    int
		gerr error
	)
	require.NoError(t, rc.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_INFO)
	}))
	require.NoError(t, gerr, "getsockopt(TCP_INFO)")
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(v))
	return b[0]
}
