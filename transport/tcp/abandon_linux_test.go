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
	p, err := Listen(Config{ID: 1, Directory: dir})
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

	gone, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	// Corked (TCP_CORK, Linux's: hence this file's name), the hello
	// leaves with the end of the stream, in one segment: peer 1 cannot
	// read it before the dialer has gone.
	rc, err := gone.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	require.NoError(t, rc.Control(func(fd uintptr) {
		err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, 1)
	}))
	require.NoError(t, err)
	h := hello{from: 0, to: 1, inc: 7, nonce: 42}
	b := h.marshal()
	_, err = gone.Write(b[:])
	require.NoError(t, err)
	require.NoError(t, gone.Close()) // the dialer goes before the acceptor has read a byte
	require.Eventually(t, func() bool { return p.Stats().Abandoned > 0 || len(sent) > 0 }, 10*time.Second, time.Millisecond)
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
	require.NoError(t, dialed.SetReadDeadline(time.Now().Add(10*time.Second)))
	var fh [frameHead]byte
	_, err = io.ReadFull(dialed, fh[:])
	require.NoError(t, err)
	payload := make([]byte, binary.BigEndian.Uint32(fh[:]))
	_, err = io.ReadFull(dialed, payload)
	require.NoError(t, err)
	assert.Equal(t, "frame", string(payload), "the frame came on peer 1's own dial")
}
