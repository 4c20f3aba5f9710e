package tcp_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/internal/meshtest"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResolveWaitsForPublication: with a directory.Resolver (the
// in-process directory is one), a Send to a peer that has not published
// yet waits for its address in one connection attempt, rather than
// retrying the lookup (the retry policy here would give up at once), and
// connects as soon as the peer publishes.
func TestResolveWaitsForPublication(t *testing.T) {
	baseline := openFDs(t)
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	noRetry := func(int, error) (d time.Duration, retry bool) { return 0, false }
	a, err := tcp.Listen(tcp.Config{Directory: dir, Retry: noRetry, HandshakeTimeout: patience, CreateTimeout: patience})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- a.Send(context.Background(), 1, payload(0, 0, 0)) }()
	require.True(t, eventually(t, func() bool { return a.Stats().NotPublished > 0 }), "the lookup never said 'not yet'")

	b, err := tcp.Listen(tcp.Config{ID: 1, Directory: dir, HandshakeTimeout: patience, CreateTimeout: patience})
	require.NoError(t, err)
	inB := receive(b, 2)
	require.NoError(t, <-errc)
	waitTotal(t, inB, 1, "peer 1")
	st := a.Stats()
	assert.EqualValues(t, 1, st.NotPublished, "one lookup said 'not yet', and the attempt waited")
	assert.EqualValues(t, 1, st.Cache.Attempts, "one attempt")
	assert.EqualValues(t, 1, st.DialAttempts)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	<-inB.Done
	checkFDs(t, baseline)
}

// TestUnreachableAddress: a dial refused at the address the directory gave
// reports it with Unreachable; the directory, asked again, has a newer one
// (here: the report makes it publish the peer's real address, as a store
// that held a stale copy would fetch the new one), and the same connection
// attempt dials that. An address that is still the directory's after the
// report fails the attempt.
func TestUnreachableAddress(t *testing.T) {
	baseline := openFDs(t)
	d, err := directory.New(directory.Options{Size: 3})
	require.NoError(t, err)
	dir := &meshtest.Reporting{Directory: d}
	noRetry := func(int, error) (d time.Duration, retry bool) { return 0, false }
	a, err := tcp.Listen(tcp.Config{Directory: dir, Retry: noRetry, HandshakeTimeout: patience, CreateTimeout: patience})
	require.NoError(t, err)
	b, err := tcp.Listen(tcp.Config{ID: 1, Directory: dir, HandshakeTimeout: patience, CreateTimeout: patience})
	require.NoError(t, err)
	inB := receive(b, 3)

	// A port nothing listens on: closed after it was taken.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	stale := gone.Addr().String()
	require.NoError(t, gone.Close())
	require.NoError(t, d.Publish(1, stale))
	dir.OnUnreachable = func(peer int, addr string) {
		if peer == 1 && addr == stale {
			assert.NoError(t, d.Publish(1, b.Addr()))
		}
	}
	require.NoError(t, a.Send(context.Background(), 1, payload(0, 0, 0)))
	waitTotal(t, inB, 1, "peer 1")
	assert.Equal(t, []string{stale}, dir.Reported())
	st := a.Stats()
	assert.EqualValues(t, 2, st.DialAttempts, "the stale address, then the new one")
	assert.EqualValues(t, 1, st.Cache.Attempts, "in one connection attempt")

	// Peer 2's address stays stale: the attempt fails, having reported it.
	require.NoError(t, d.Publish(2, stale))
	err = a.Send(context.Background(), 2, payload(0, 0, 0))
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	assert.Equal(t, []string{stale, stale}, dir.Reported())

	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	<-inB.Done
	checkFDs(t, baseline)
}
