package tcp

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/internal/meshtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDroppedWhileLeasedIsNamed (issue 24, defect 3): peer 1 (the higher
// id) gives up the connection peer 0 dialed, while a lease still holds it,
// so that its Release has not run, and sends to peer 0 again. Its hello
// must name the connection it gave up: peer 0 then drops its own end and
// accepts the new connection at once. Named only when the connection was
// released, the hello named none, peer 0 kept its end and answered
// "duplicate", and peer 1's Send waited HandshakeTimeout (here: patience)
// for a winning connection that peer 1 had dropped itself.
func TestDroppedWhileLeasedIsNamed(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	cfg := Config{Directory: dir, HandshakeTimeout: meshtest.Patience, CreateTimeout: meshtest.Patience}
	lo, err := Listen(cfg)
	require.NoError(t, err)
	defer func() { assert.NoError(t, lo.Close()) }()
	cfg.ID = 1
	hi, err := Listen(cfg)
	require.NoError(t, err)
	defer func() { assert.NoError(t, hi.Close()) }()

	ctx, cancel := context.WithTimeout(context.Background(), meshtest.Hang)
	defer cancel()
	require.NoError(t, lo.Send(ctx, 1, []byte("first"))) // peer 0 dials; peer 1 accepts
	m, err := hi.Recv(ctx)
	require.NoError(t, err)
	assert.Equal(t, "first", string(m.Payload))

	lease, err := hi.cache.Acquire(ctx, 0) // as a Send in its write would
	require.NoError(t, err)
	old := lease.Value()
	require.False(t, old.dialed, "peer 1's endpoint is the one peer 0 dialed")
	require.True(t, hi.cache.CompareAndInvalidate(0, old), "peer 1 gives it up")

	require.NoError(t, hi.Send(ctx, 0, []byte("second")), "peer 1 waited for a connection that it had dropped")
	m, err = lo.Recv(ctx)
	require.NoError(t, err)
	assert.Equal(t, "second", string(m.Payload))
	assert.Zero(t, hi.Stats().Duplicates+lo.Stats().Duplicates, "no duplicate: peer 0 dropped its end of the old connection")
	lease.Release()
}

// TestClosingPeerSaysSo: a hello that reaches a peer whose Close has begun
// is refused with reason "closing", not answered "duplicate": a dialer told
// "duplicate" waits HandshakeTimeout for a winning connection that a
// closing peer never makes.
func TestClosingPeerSaysSo(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	p, err := Listen(Config{Directory: dir, HandshakeTimeout: meshtest.Patience, CreateTimeout: meshtest.Patience})
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()

	// The acceptor's decision on a connection whose hello it has read, as
	// Close begins: p.closed is what Close sets first, under p.mu.
	dialer, accepted := net.Pipe()
	defer dialer.Close()
	p.stats.fdOpening() // as the accept call did
	c := newConn(p, accepted)
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.closed = false // for the deferred Close
		p.mu.Unlock()
	}()
	done := make(chan admission, 1)
	go func() { done <- p.answer(c, hello{from: 1, to: 0, inc: 7, nonce: 42}) }()
	var rb [replySize]byte
	_, err = io.ReadFull(dialer, rb[:])
	require.NoError(t, err)
	rep, err := parseReply(&rb)
	require.NoError(t, err)
	assert.Equal(t, verdictRefused, rep.verdict)
	assert.Equal(t, reasonClosing, rep.reason, "reason: %v", rep.reason)
	assert.Equal(t, closing, <-done)
}
