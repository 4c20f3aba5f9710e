package tcp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helloBytes is a hello as the package doc lays it out, for a client that
// speaks the protocol by hand.
func helloBytes(from, to uint32, inc, nonce uint64) []byte {
	b := make([]byte, 36)
	copy(b, "epT\x01")
	binary.BigEndian.PutUint32(b[4:], from)
	binary.BigEndian.PutUint32(b[8:], to)
	binary.BigEndian.PutUint64(b[12:], inc)
	binary.BigEndian.PutUint64(b[20:], nonce)
	return b
}

// Verdicts and reasons of a reply.
const (
	accepted        = 1
	refused         = 3
	wrongPeer       = 1
	unknownPeer     = 2
	claimsOwnID     = 3
	lateHello       = 6
	handshakeWindow = 200 * time.Millisecond
)

// stranger connects to addr, writes send, and returns everything it reads
// until the peer closes the connection, and how long that took from before
// the connection was made: no less than the peer waited for it. It fails the
// test if the peer never closes the connection.
func stranger(t *testing.T, addr string, send []byte) ([]byte, time.Duration) {
	t.Helper()
	began := time.Now()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer func() { assert.NoError(t, nc.Close()) }()
	require.NoError(t, nc.SetDeadline(time.Now().Add(hang)))
	if len(send) > 0 {
		_, err = nc.Write(send)
		require.NoError(t, err)
	}
	got, err := io.ReadAll(nc)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the peer did not close the stranger's connection in %v (read %q)", hang, got)
	}
	// A reset instead of a clean end is a close too.
	return got, time.Since(began)
}

// refusal asserts that got is a refusal with reason why from peer id.
func refusal(t *testing.T, got []byte, id int, why byte) {
	t.Helper()
	require.Len(t, got, 20, "reply: %q", got)
	assert.Equal(t, "epT\x01", string(got[:4]))
	assert.Equal(t, byte(refused), got[4], "verdict")
	assert.Equal(t, why, got[5], "reason")
	assert.Equal(t, uint32(id), binary.BigEndian.Uint32(got[8:]), "acceptor id")
}

// TestBadInput feeds a peer what it must refuse: sends to peers that do not
// exist, to itself, frames over MaxFrame, and connections from strangers
// that send garbage, nothing, or hellos it cannot accept. Each is a clear
// error (or a closed connection), and nothing leaks.
func TestBadInput(t *testing.T) {
	baseline := openFDs(t)
	// Peers 0 and 1 run; peer 2 is in the directory but absent, so that a
	// stranger can claim its id. They wait for a hello with patience, so
	// that a stranger's slow hello is still read.
	m := startMesh(t, 2, 3, func(c *tcp.Config) { c.MaxFrame = 1024 })
	a := m.peers[0]
	// The strangers that test the handshake's timeout meet a peer of their
	// own: a short HandshakeTimeout there cuts nothing else short, since
	// only they connect to it.
	strictDir, err := directory.New(directory.Options{Size: 1})
	require.NoError(t, err)
	strict, err := tcp.Listen(tcp.Config{Directory: strictDir, HandshakeTimeout: handshakeWindow})
	require.NoError(t, err)
	defer func() { assert.NoError(t, strict.Close()) }()
	ctx := context.Background()

	t.Run("unknown peer", func(t *testing.T) {
		for _, to := range []int{3, -1, 1 << 30} {
			err := a.Send(ctx, to, []byte("x"))
			require.ErrorIs(t, err, directory.ErrUnknownPeer, "send to %d", to)
			assert.ErrorContains(t, err, "(peers are 0 to 2)")
		}
		assert.EqualError(t, a.Send(ctx, 7, nil), "tcp: send to peer 7: directory: unknown peer (peers are 0 to 2)")
		assert.Zero(t, a.Stats().Cache.Attempts, "no connection attempted, nothing cached")
	})

	t.Run("self", func(t *testing.T) {
		err := a.Send(ctx, 0, []byte("x"))
		assert.ErrorIs(t, err, tcp.ErrSelf)
		assert.EqualError(t, err, "tcp: send to self (peer 0)")
	})

	t.Run("oversized frame", func(t *testing.T) {
		err := a.Send(ctx, 1, make([]byte, 1025))
		require.ErrorIs(t, err, tcp.ErrFrameTooLarge)
		assert.EqualError(t, err, "tcp: frame too large: 1025 bytes to peer 1 (MaxFrame is 1024)")
		// Exactly MaxFrame is fine.
		full := make([]byte, 1024)
		copy(full, payload(0, 0, 0))
		require.NoError(t, a.Send(ctx, 1, full))
		waitTotal(t, m.in[1], 1, "peer 1")
	})

	strangers := []struct {
		name     string
		send     []byte
		timesOut bool // meets strict, whose handshake times out
		check    func(t *testing.T, got []byte, took time.Duration)
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n"), false,
			func(t *testing.T, got []byte, _ time.Duration) {
				assert.Empty(t, got, "closed without a reply")
			}},
		{"short garbage", []byte("hi"), true, func(t *testing.T, got []byte, took time.Duration) {
			assert.Empty(t, got)
			assert.GreaterOrEqual(t, took, handshakeWindow, "closed once the handshake timed out")
		}},
		{"silence", nil, true, func(t *testing.T, got []byte, took time.Duration) {
			assert.Empty(t, got)
			assert.GreaterOrEqual(t, took, handshakeWindow, "closed once the handshake timed out")
		}},
		{"zero nonce", helloBytes(2, 0, 1, 0), false, func(t *testing.T, got []byte, _ time.Duration) {
			assert.Empty(t, got)
		}},
		{"unknown id", helloBytes(1000, 0, 1, 1), false, func(t *testing.T, got []byte, _ time.Duration) {
			refusal(t, got, 0, unknownPeer)
		}},
		{"claims the acceptor's id", helloBytes(0, 0, 1, 1), false, func(t *testing.T, got []byte, _ time.Duration) {
			refusal(t, got, 0, claimsOwnID)
		}},
		{"hello for another peer", helloBytes(2, 1, 1, 1), false, func(t *testing.T, got []byte, _ time.Duration) {
			refusal(t, got, 0, wrongPeer)
		}},
	}
	for _, s := range strangers {
		t.Run("stranger/"+s.name, func(t *testing.T) {
			p := a
			if s.timesOut {
				p = strict
			}
			before := p.Stats()
			got, took := stranger(t, p.Addr(), s.send)
			s.check(t, got, took)
			eventually(t, func() bool { return p.Stats().Refused == before.Refused+1 }, "the connection counts as refused")
		})
	}

	// A stranger that claims the id of the absent peer 2 passes the
	// handshake (there is no authentication), but a frame over MaxFrame
	// ends its connection.
	t.Run("stranger/oversized frame", func(t *testing.T) {
		before := a.Stats()
		frame := make([]byte, 4+12)
		binary.BigEndian.PutUint32(frame, 12)
		copy(frame[4:], payload(2, 0, 0))
		huge := make([]byte, 4)
		binary.BigEndian.PutUint32(huge, 1025)
		msg := append(append(helloBytes(2, 0, 1, 1), frame...), huge...)
		got, _ := stranger(t, a.Addr(), msg)
		require.Len(t, got, 20)
		assert.Equal(t, byte(accepted), got[4], "verdict")
		waitTotal(t, m.in[0], 1, "peer 0")
		assert.Equal(t, int64(1), m.in[0].From[2].Load(), "the good frame arrived")
		eventually(t, func() bool { return a.Stats().BadFrames == before.BadFrames+1 })
		assert.Equal(t, before.Refused, a.Stats().Refused)
	})

	assert.NoError(t, strict.Close())
	m.close(t)
	checkFDs(t, baseline)
}

// TestConfig checks that Listen names the field it rejects.
func TestConfig(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	for _, tc := range []struct {
		cfg  tcp.Config
		want string
	}{
		{tcp.Config{}, "tcp: Config.Directory is nil; it is required"},
		{tcp.Config{Directory: dir, ID: 2}, "tcp: Config.ID is 2; want 0 to 1 (the directory's peers)"},
		{tcp.Config{Directory: dir, ID: -1}, "tcp: Config.ID is -1; want 0 to 1 (the directory's peers)"},
		{tcp.Config{Directory: dir, MaxFrame: -1}, "tcp: Config.MaxFrame is -1; want 0 (default) to 1073741824"},
		{tcp.Config{Directory: dir, HandshakeTimeout: -1}, "tcp: Config.HandshakeTimeout is -1ns; want 0 (default) or a positive duration"},
		{tcp.Config{Directory: dir, CreateTimeout: -1}, "tcp: Config.CreateTimeout is -1ns; want 0 (default) or a positive duration"},
		{tcp.Config{Directory: dir, RecvBuffer: -1}, "tcp: Config.RecvBuffer is -1; want 0 (default) or a positive count"},
		{tcp.Config{Directory: dir, ErrorTTL: -1}, "tcp: Config.ErrorTTL is -1ns; want 0 (failures not remembered) or a positive duration"},
		{tcp.Config{Directory: dir, MaxConns: -1}, "tcp: Config.MaxConns is -1; want 0 (no bound) or at least 2 (one for the connection being accepted, one to hold)"},
		{tcp.Config{Directory: dir, MaxConns: 1}, "tcp: Config.MaxConns is 1; want 0 (no bound) or at least 2 (one for the connection being accepted, one to hold)"},
		{tcp.Config{Directory: dir, IdleTimeout: -time.Second}, "tcp: Config.IdleTimeout is -1s; want 0 (connections never expire) or a positive duration"},
	} {
		p, err := tcp.Listen(tc.cfg)
		if !assert.EqualError(t, err, tc.want) && p != nil {
			assert.NoError(t, p.Close())
		}
	}
	_, err = dir.Lookup(0)
	assert.ErrorIs(t, err, directory.ErrNotPublished, "nothing published by a rejected config")
}
