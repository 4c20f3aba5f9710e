//go:build ucx

package ucx_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/ucx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLateAddress starts a peer whose address becomes visible only after
// the senders have looked it up: senders that start at once retry the
// lookup while it says "not yet published" (Config.Retry), then connect
// once, and every message arrives.
func TestLateAddress(t *testing.T) {
	c := newContext(t, nil)
	// The publication is late by as long as the test wants, not by a delay
	// a slow machine could outlast before its first lookup.
	fence := make(chan struct{})
	m := startMesh(t, c, 3, 0, func(c *ucx.Config) {
		if c.ID != 2 {
			c.Directory = fenced{c.Directory, fence}
		}
	})
	var wg sync.WaitGroup
	for _, i := range []int{0, 1} {
		for g := range 4 {
			wg.Go(func() {
				assert.NoError(t, m.peers[i].Send(context.Background(), 2, payload(i, g, 0)))
			})
		}
	}
	eventually(t, func() bool { return m.peers[0].Stats().NotPublished > 0 && m.peers[1].Stats().NotPublished > 0 },
		"peers 0 and 1 have been told 'not yet'")
	close(fence)
	wg.Wait()
	waitTotal(t, m.in[2], 8, "peer 2")
	for _, i := range []int{0, 1} {
		st := m.peers[i].Stats()
		assert.Positive(t, st.NotPublished, "peer %d: lookups answered 'not yet'", i)
		assert.EqualValues(t, 1, st.ConnectAttempts, "peer %d: one connection, once the address was visible", i)
		assert.EqualValues(t, 1, st.Endpoints.Created, "peer %d", i)
	}
}

// fenced is a directory whose addresses are not visible until fence is
// closed: every lookup says "published, not visible yet" until then, as
// before a PMIx fence.
type fenced struct {
	directory.Interface
	fence <-chan struct{}
}

func (f fenced) Lookup(peer int) (string, error) {
	select {
	case <-f.fence:
		return f.Interface.Lookup(peer)
	default:
		return "", &directory.NotPublishedError{Peer: peer, Pending: true}
	}
}

// TestWorkerLifecycle checks the endpoint counters and what each close
// does: Endpoint.Close twice, operations on a closed endpoint, a Recv cut
// short by its context or by Close, endpoints left open at Worker.Close
// (orphans, counted), operations on a closed worker, and a Context.Close
// that closes the workers still open.
func TestWorkerLifecycle(t *testing.T) {
	c, err := ucx.NewContext(ucx.Options{Config: testConfig})
	require.NoError(t, err)
	a, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(t, err)
	b, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(t, err)
	ctx := context.Background()

	ep, err := a.Connect(ctx, b.Address(), 7)
	require.NoError(t, err)
	assert.Equal(t, 7, ep.Label())
	assert.Same(t, a, ep.Worker())
	require.NoError(t, ep.Send(ctx, 42, []byte("hello")))
	buf := make([]byte, 8)
	n, tag, err := b.Recv(ctx, buf)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(buf[:n]))
	assert.EqualValues(t, 42, tag)
	require.NoError(t, ep.Send(ctx, 43, nil), "an empty message")
	n, tag, err = b.Recv(ctx, buf)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.EqualValues(t, 43, tag)

	require.NoError(t, ep.Close())
	require.NoError(t, ep.Close(), "a second Close")
	assert.ErrorIs(t, ep.Send(ctx, 1, []byte("x")), ucx.ErrEndpointClosed)
	assert.Equal(t, ucx.EndpointStats{Created: 1, Closed: 1}, a.Stats())

	// A Recv cut short by its context, then by Close.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, _, err = b.Recv(short, buf)
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	recvErr := make(chan error)
	go func() {
		_, _, err := b.Recv(ctx, buf)
		recvErr <- err
	}()

	// Endpoints nobody closes: Worker.Close closes them, as orphans.
	for range 3 {
		_, err := a.Connect(ctx, b.Address(), 7)
		require.NoError(t, err)
	}
	assert.EqualValues(t, 3, a.Stats().Live())
	require.NoError(t, a.Close())
	assert.Equal(t, ucx.EndpointStats{Created: 4, Closed: 4, Orphaned: 3}, a.Stats())
	require.NoError(t, a.Close(), "a second Close")
	_, err = a.Connect(ctx, b.Address(), 7)
	assert.ErrorIs(t, err, ucx.ErrClosed)
	_, _, err = a.Recv(ctx, buf)
	assert.ErrorIs(t, err, ucx.ErrClosed)

	// Context.Close closes b, which ends the Recv waiting on it.
	require.NoError(t, c.Close())
	assert.ErrorIs(t, <-recvErr, ucx.ErrClosed)
	_, err = c.NewWorker(ucx.WorkerOptions{})
	assert.ErrorIs(t, err, ucx.ErrClosed)
	require.NoError(t, c.Close(), "a second Close")
	assert.Equal(t, ucx.EndpointStats{Created: 4, Closed: 4, Orphaned: 3}, c.Stats())
}

// TestConnectCancelled cancels the context of a Connect before its
// wire-up can complete: Connect returns the context's error, and the
// endpoint it created is closed.
func TestConnectCancelled(t *testing.T) {
	c := newContext(t, nil)
	a, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(t, err)
	b, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ep, err := a.Connect(ctx, b.Address(), 1)
	if err == nil {
		t.Log("the wire-up completed at once; nothing to cancel")
		require.NoError(t, ep.Close())
	} else {
		assert.ErrorIs(t, err, context.Canceled)
	}
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	st := a.Stats()
	assert.Zero(t, st.Live())
	assert.Zero(t, st.Orphaned)
}

// TestIdleCost measures what idle workers cost: once progress has found
// nothing to do for activeWindow (200 ms), each progress goroutine sleeps
// in epoll_wait, waking every idleTick (250 ms); the process's CPU time
// over an idle second must stay a small fraction of a core.
//
// A worker turns idle activeWindow after its last work, and on a busy
// machine the work of the exchange may end late: a second in which some
// worker was still active says nothing of the idle cost. So the test
// measures one second after another until one is idle (or, after hang,
// fails with the last), and rates each by the time it really lasted.
func TestIdleCost(t *testing.T) {
	if testing.Short() {
		t.Skip("an idle second")
	}
	const workers = 16
	c := newContext(t, nil)
	m := startMesh(t, c, workers, 0, nil)
	ids := make([]int, workers)
	for i := range ids {
		ids[i] = i
	}
	exchange(t, m, ids, map[int]int64{}) // every pair connected: the transports have descriptors to watch
	time.Sleep(300 * time.Millisecond)   // past activeWindow, on a machine that keeps up
	const idle = time.Second
	for began := time.Now(); ; {
		wake0 := make([]uint64, workers)
		for i, p := range m.peers {
			wake0[i] = p.Worker().Wakeups()
		}
		cpu0, wall0 := cpuTime(t), time.Now()
		time.Sleep(idle)
		used, wall := cpuTime(t)-cpu0, time.Since(wall0)
		var wakeups uint64
		for i, p := range m.peers {
			wakeups += p.Worker().Wakeups() - wake0[i]
		}
		perWorker := float64(wakeups) / workers / wall.Seconds()
		t.Logf("%d idle workers (%d endpoints) for %v: %v of CPU (%.2f%% of a core), %.1f wake-ups per worker per second",
			workers, workers*(workers-1), wall, used, 100*used.Seconds()/wall.Seconds(), perWorker)
		if used < wall/20 && perWorker <= 8 || time.Since(began) > hang {
			assert.Less(t, used, wall/20, "idle workers burn CPU")
			assert.LessOrEqual(t, perWorker, 8.0, "wake-ups per idle worker per second")
			return
		}
	}
}

// cpuTime returns the CPU time (user and system) the process has used.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkConnect measures one endpoint's life between two idle workers:
// Connect (ucp_ep_create and the wire-up's flush) and Close
// (ucp_ep_close_nbx, waited for).
func BenchmarkConnect(b *testing.B) {
	c, err := ucx.NewContext(ucx.Options{Config: testConfig})
	require.NoError(b, err)
	defer c.Close()
	w, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(b, err)
	peer, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(b, err)
	addr := peer.Address()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		ep, err := w.Connect(ctx, addr, 1)
		if err != nil {
			b.Fatal(err)
		}
		if err := ep.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSend measures a small tagged message from one worker to
// another, sent and received.
func BenchmarkSend(b *testing.B) {
	c, err := ucx.NewContext(ucx.Options{Config: testConfig})
	require.NoError(b, err)
	defer c.Close()
	w, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(b, err)
	peer, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(b, err)
	ctx := context.Background()
	ep, err := w.Connect(ctx, peer.Address(), 1)
	require.NoError(b, err)
	msg, buf := make([]byte, 64), make([]byte, 64)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if err := ep.Send(ctx, 1, msg); err != nil {
			b.Fatal(err)
		}
		if _, _, err := peer.Recv(ctx, buf); err != nil {
			b.Fatal(err)
		}
	}
	require.NoError(b, ep.Close())
}
