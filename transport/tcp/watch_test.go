package tcp_test

import (
	"context"
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
