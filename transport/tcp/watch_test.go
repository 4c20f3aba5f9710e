package tcp_test

import (
	"context"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// watching is the in-process directory with a watch, as a directory backed
// by a store (etcddir) has one: watchers hear of every Publish.
type watching struct {
	*directory.Directory
	mu       sync.Mutex
	watchers map[int]func(int, string)
	next     int
}

func (w *watching) Publish(peer int, addr string) error {
	if err := w.Directory.Publish(peer, addr); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.watchers {
		f(peer, addr)
	}
	return nil
}

func (w *watching) Watch(f func(int, string)) (stop func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	id := w.next
	w.next++
	w.watchers[id] = f
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.watchers, id)
	}
}

// A peer that restarts and publishes again is reachable at once through a
// watching directory, though a failure to reach its previous life is
// remembered for an hour (ErrorTTL): the watch makes the others forget it.
func TestWatchForgetsARestartedPeer(t *testing.T) {
	baseline := openFDs(t)
	d, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	dir := &watching{Directory: d, watchers: map[int]func(int, string){}}
	ctx := context.Background()
	newPeer := func(id int) *tcp.Peer {
		p, err := tcp.Listen(tcp.Config{ID: id, Directory: dir, ErrorTTL: time.Hour,
			Retry:            func(int, error) (time.Duration, bool) { return 0, false },
			HandshakeTimeout: patience, CreateTimeout: patience})
		require.NoError(t, err)
		return p
	}
	p1 := newPeer(1)
	defer p1.Close()
	p0 := newPeer(0)
	require.NoError(t, p0.Close()) // dead, its address still published: refused

	err = p1.Send(ctx, 0, []byte("hello"))
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Error(t, p1.Send(ctx, 0, []byte("hello")))
	assert.Equal(t, uint64(1), p1.Stats().Cache.ErrorHits, "the failure is remembered")

	p0 = newPeer(0) // back, and published again
	defer p0.Close()
	require.NoError(t, p1.Send(ctx, 0, []byte("hello")), "the restarted peer was not reached: the remembered failure still answered")
	m, err := p0.Recv(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, m.From)
	require.NoError(t, p0.Close())
	require.NoError(t, p1.Close())
	checkFDs(t, baseline)
}

// A peer not published yet is worth waiting for; one whose address was
// withdrawn (it died, or its lease expired) is not: its failure is final,
// and ErrorTTL remembers it until it publishes again.
func TestRetryableWithdrawn(t *testing.T) {
	assert.True(t, tcp.Retryable(&directory.NotPublishedError{Peer: 1}))
	assert.True(t, tcp.Retryable(&directory.NotPublishedError{Peer: 1, Pending: true}))
	assert.False(t, tcp.Retryable(&directory.NotPublishedError{Peer: 1, Withdrawn: true}))
	assert.True(t, tcp.Retryable(tcp.ErrSuperseded))
	assert.False(t, tcp.Retryable(syscall.ECONNREFUSED))
}

// TestFailureInFlightAtRestart (issue 24, defect 5): peer 1 connects to
// peer 0's previous address (a life that accepts and never answers) when
// peer 0 restarts and publishes again. The watch reports the publication
// while the connection attempt is still in flight, so that there is no
// failure to forget yet; the attempt then fails, and ErrorTTL (an hour)
// remembers it. A failure at an address the directory no longer gives is
// not the peer's: the Send that gets it, and every Send after it, connects
// to the new address. Before the fix, both Sends failed, and peer 0 was
// unreachable for an hour.
func TestFailureInFlightAtRestart(t *testing.T) {
	baseline := openFDs(t)
	d, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	dir := &watching{Directory: d, watchers: map[int]func(int, string){}}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	cfg := tcp.Config{Directory: dir, ErrorTTL: time.Hour, HandshakeTimeout: patience, CreateTimeout: patience,
		Retry: func(int, error) (time.Duration, bool) { return 0, false }}
	cfg.ID = 1
	p1, err := tcp.Listen(cfg)
	require.NoError(t, err)
	defer p1.Close()

	hung, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer hung.Close()
	require.NoError(t, dir.Publish(0, hung.Addr().String()))
	errc := make(chan error, 1)
	go func() { errc <- p1.Send(ctx, 0, []byte("first")) }()
	attempt, err := hung.Accept() // peer 1's dial, its hello unanswered
	require.NoError(t, err)

	cfg.ID = 0
	p0, err := tcp.Listen(cfg) // publishes: the watch forgets peer 0's failures, of which there is none yet
	require.NoError(t, err)
	defer p0.Close()
	require.NoError(t, attempt.Close()) // the attempt fails now
	require.NoError(t, <-errc, "the failure at peer 0's previous address answered the Send")
	require.NoError(t, p1.Send(ctx, 0, []byte("second")), "the failure at peer 0's previous address was remembered")
	for _, want := range []string{"first", "second"} {
		m, err := p0.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, want, string(m.Payload))
	}
	require.NoError(t, p0.Close())
	require.NoError(t, p1.Close())
	require.NoError(t, hung.Close())
	checkFDs(t, baseline)
}

// TestWatchDropsConnectionToPreviousLife: peer 0 holds a connection it
// dialed to peer 1, whose process then hangs (it takes no frames: what
// peer 0 writes on the connection would wait in its buffers forever) and
// restarts elsewhere. The watch reports the new address, and peer 0 drops
// the connection to the old one: its next Send reaches the new life.
// Before, peer 0's Sends kept going to the hung life until the new life
// happened to connect to peer 0.
func TestWatchDropsConnectionToPreviousLife(t *testing.T) {
	baseline := openFDs(t)
	d, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	dir := &watching{Directory: d, watchers: map[int]func(int, string){}}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	cfg := tcp.Config{Directory: dir, HandshakeTimeout: patience, CreateTimeout: patience}
	p0, err := tcp.Listen(cfg)
	require.NoError(t, err)
	cfg.ID, cfg.RecvBuffer = 1, 1
	old, err := tcp.Listen(cfg)
	require.NoError(t, err)
	for f := range 2 { // peer 0 dials; the old life takes no frame
		require.NoError(t, p0.Send(ctx, 1, payload(0, 0, f)))
	}
	require.True(t, eventually(t, func() bool { return old.Stats().Received == 1 && readersHoldingAFrame(t) == 1 }))

	cfg.RecvBuffer = 0
	fresh, err := tcp.Listen(cfg) // publishes: the watch tells peer 0
	require.NoError(t, err)
	inFresh := receive(fresh, 2)
	require.NoError(t, p0.Send(ctx, 1, payload(0, 1, 0)))
	waitTotal(t, inFresh, 1, "the new life")
	assert.EqualValues(t, 1, old.Stats().Received, "the old life got nothing more")

	inOld := receive(old, 2)
	waitTotal(t, inOld, 2, "the old life")
	require.NoError(t, old.Close())
	require.NoError(t, fresh.Close())
	require.NoError(t, p0.Close())
	<-inOld.Done
	<-inFresh.Done
	checkFDs(t, baseline)
}
