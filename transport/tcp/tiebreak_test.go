package tcp_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTieBreak is the acceptor's rule as a table: peer 5 receives a hello
// from a lower (3) or higher (7) peer, whose incarnation is 1.
func TestTieBreak(t *testing.T) {
	mine := &tcp.Held{RemoteInc: 1, Nonce: 10, DialedBy: "acceptor"}
	theirs := &tcp.Held{RemoteInc: 1, Nonce: 10, DialedBy: "dialer"}
	oldLife := &tcp.Held{RemoteInc: 2, Nonce: 10, DialedBy: "acceptor"}
	for _, tc := range []struct {
		name              string
		from              int
		dropped           uint64
		dialing           bool
		dial              uint64 // the nonce of the dial in flight, if any
		held              *tcp.Held
		accept, dropsHeld bool
	}{
		{name: "idle, lower", from: 3, accept: true},
		{name: "idle, higher", from: 7, accept: true},
		{name: "both dialing, lower wins", from: 3, dialing: true, accept: true},
		{name: "both dialing, higher loses", from: 7, dialing: true, accept: false},
		{name: "both dialing, higher loses to another dial", from: 7, dropped: 12, dialing: true, dial: 11, accept: false},
		// The higher accepted the dial in flight and dropped it before its
		// answer arrived here: it waits for no other connection.
		{name: "both dialing, higher dropped the dial in flight", from: 7, dropped: 11, dialing: true, dial: 11, accept: true},
		{name: "holding own, higher loses", from: 7, held: mine, accept: false},
		{name: "holding own, lower replaces it", from: 3, held: mine, accept: true, dropsHeld: true},
		{name: "holding own, higher dropped it", from: 7, dropped: 10, held: mine, accept: true, dropsHeld: true},
		{name: "holding own, higher dropped another", from: 7, dropped: 11, held: mine, accept: false},
		{name: "holding theirs: they gave it up", from: 7, held: theirs, accept: true, dropsHeld: true},
		{name: "holding theirs, lower", from: 3, held: theirs, accept: true, dropsHeld: true},
		{name: "holding a previous life's", from: 7, held: oldLife, accept: true, dropsHeld: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			accept, dropped := tcp.Decide(5, tc.from, 1, tc.dropped, tc.dialing, tc.dial, tc.held)
			assert.Equal(t, tc.accept, accept, "accept")
			assert.Equal(t, tc.dropsHeld, dropped, "held endpoint given up")
		})
	}
}

// TestLostTieBreakWithoutWinner: peer 1 dials peer 0 while peer 0 is
// dialing peer 1 too, so peer 1 (the higher id) loses the tie-break; but
// peer 0's connection never comes, because peer 0 dialed a stale address (a
// listener that never answers). Peer 1's attempt fails with ErrSuperseded
// once its HandshakeTimeout has passed, and succeeds once peer 0 has given
// up (peer 0's Send then tries peer 1's real address).
//
// Peer 0 gives up when the test closes the stale connection, not at a
// timeout of its own, which a slow machine could reach before peer 1 has
// dialed. Peer 1's HandshakeTimeout, the one tested, also bounds its
// handshake with peer 0: an attempt whose answer from peer 0 comes later
// than that, on a slow machine, times out, and is made again.
func TestLostTieBreakWithoutWinner(t *testing.T) {
	baseline := openFDs(t)
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	holeConns := make(chan net.Conn, 8)
	go func() {
		for {
			nc, err := hole.Accept()
			if err != nil {
				close(holeConns)
				return
			}
			holeConns <- nc // and never answer
		}
	}()

	m := startMesh(t, 1, 2, nil)
	b := m.peers[0]
	require.NoError(t, m.dir.Publish(1, hole.Addr().String())) // peer 1's stale address
	errc := make(chan error, 1)
	go func() { errc <- b.Send(context.Background(), 1, payload(0, 0, 0)) }()
	var holeConn net.Conn
	select {
	case holeConn = <-holeConns:
	case <-time.After(hang):
		t.Fatal("peer 0 did not dial the stale address")
	}

	// Peer 1 starts and publishes its real address; peer 0 is busy dialing
	// the stale one.
	m.peers = append(m.peers, nil)
	m.in = append(m.in, nil)
	m.start(t, 1, func(c *tcp.Config) {
		c.HandshakeTimeout = 50 * time.Millisecond
		c.Retry = func(int, error) (time.Duration, bool) { return 0, false }
	})
	a := m.peers[1]
	err = sendPastSlowHandshakes(t, a, 0, payload(1, 0, 0))
	t.Log(err)
	require.ErrorIs(t, err, tcp.ErrSuperseded)
	assert.True(t, tcp.Retryable(err))
	assert.Equal(t, uint64(1), a.Stats().Duplicates, "peer 1 closed its losing connection")

	// Peer 0 gives up on the stale address. The directory has peer 1's
	// real address by then: the failure is of an address peer 1 no longer
	// has, and peer 0's Send tries the new one (peer 1's short handshake
	// timeout, on a slow machine, may refuse it: then the Send fails as a
	// handshake at peer 1's real address).
	require.NoError(t, holeConn.Close())
	err = <-errc
	t.Log(err)
	if err != nil {
		require.ErrorIs(t, err, tcp.ErrHandshake)
		assert.False(t, tcp.Retryable(err))
		assert.NotContains(t, err.Error(), hole.Addr().String(), "the failure is at peer 1's real address")
	} else {
		waitTotal(t, m.in[1], 1, "peer 1")
	}
	// Peer 0 is no longer dialing: peer 1 gets through.
	require.NoError(t, sendPastSlowHandshakes(t, a, 0, payload(1, 0, 0)))
	waitTotal(t, m.in[0], 1, "peer 0")

	require.NoError(t, hole.Close())
	for nc := range holeConns {
		require.NoError(t, nc.Close())
	}
	m.close(t)
	checkFDs(t, baseline)
}

// sendPastSlowHandshakes sends payload from p to peer to, and again while
// the Send fails because its handshake timed out: p's HandshakeTimeout is
// short for a test of it, and a slow machine may answer later. It returns
// the first other outcome.
func sendPastSlowHandshakes(t *testing.T, p *tcp.Peer, to int, payload []byte) error {
	t.Helper()
	for began := time.Now(); ; {
		err := p.Send(context.Background(), to, payload)
		if !errors.Is(err, tcp.ErrHandshake) || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		t.Logf("again: %v", err)
		require.Less(t, time.Since(began), hang, "every handshake timed out")
	}
}
