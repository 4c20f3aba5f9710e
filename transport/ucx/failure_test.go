//go:build ucx

package ucx_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/ucx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exchange has every peer of ids send one message to every other, at once,
// and waits until they have all arrived; want holds the messages each
// inbox has received so far and is updated.
func exchange(t *testing.T, m *mesh, ids []int, want map[int]int64) {
	t.Helper()
	var wg sync.WaitGroup
	for _, i := range ids {
		for _, j := range ids {
			if i != j {
				wg.Go(func() {
					if err := m.peers[i].Send(context.Background(), j, payload(i, j, 0)); err != nil {
						t.Errorf("peer %d -> %d: %v", i, j, err)
					}
				})
			}
		}
	}
	wg.Wait()
	for _, i := range ids {
		want[i] += int64(len(ids) - 1)
		waitTotal(t, m.in[i], want[i], "peer")
	}
}

// TestDeadPeer destroys a peer's worker in the middle of a run, as a crash
// would: nothing of the peer closes its endpoints first. The other peers'
// endpoints to it fail (UCX calls their error callbacks, which drop them
// from the caches); senders to it get errors; the failure to reconnect is
// remembered for ErrorTTL, so that however hard they send, they try to
// connect at most about once per ErrorTTL instead of creating endpoint
// after endpoint; the others still talk to each other; once the peer
// restarts (a new worker, a republished address, the same id) and the
// remembered failure has expired, everyone reaches it again; and at the
// end every endpoint created was closed.
func TestDeadPeer(t *testing.T) {
	for _, unpublish := range []bool{false, true} {
		name := "address=stale"
		if unpublish {
			name = "address=withdrawn"
		}
		t.Run(name, func(t *testing.T) { testDeadPeer(t, unpublish) })
	}
}

func testDeadPeer(t *testing.T, unpublish bool) {
	const peers, victim, senders = 4, 3, 4
	ttl, hammer := 250*time.Millisecond, time.Second
	if testing.Short() {
		hammer = 600 * time.Millisecond
	}
	c := newContext(t, quiet())
	cfg := func(c *ucx.Config) {
		c.ErrorTTL = ttl
		c.Retry = epcache.Backoff(time.Millisecond, 10*time.Millisecond, 3, ucx.Retryable)
	}
	m := startMesh(t, c, peers, 0, cfg)
	all, survivors := []int{0, 1, 2, 3}, []int{0, 1, 2}
	want := map[int]int64{}
	exchange(t, m, all, want)

	// The victim's worker is destroyed under it: a crash. Its endpoints
	// are closed as orphans (Worker.Close), its sockets close, and the
	// survivors' endpoints to it fail.
	dead := m.peers[victim]
	require.NoError(t, dead.Worker().Close())
	if unpublish {
		m.dir.Unpublish(victim) // the resource manager noticed
	}
	for _, i := range survivors {
		eventually(t, func() bool {
			_, held := ucx.Held(m.peers[i], victim)
			return m.peers[i].Stats().Endpoints.Failed == 1 && !held
		}, "peer %d: the error callback of its endpoint to the dead peer", i)
	}
	before := make([]ucx.Stats, peers)
	for _, i := range survivors {
		before[i] = m.peers[i].Stats()
	}
	// The senders hammer the dead peer for at least hammer, and each peer's
	// go on until one of its sends has been answered by the remembered
	// failure, which a slow machine may take longer to reach. The bound on
	// connection attempts follows from the time the hammering really lasted.
	remembered := func(i int) bool {
		return m.peers[i].Stats().Cache.ErrorHits > before[i].Cache.ErrorHits
	}
	var (
		wg               sync.WaitGroup
		sends, failures  atomic.Int64
		lastErr          [peers]atomic.Pointer[error]
		hammerCtx, abort = context.WithTimeout(context.Background(), hammer)
	)
	defer abort()
	began := time.Now()
	for _, i := range survivors {
		for range senders {
			wg.Go(func() {
				for {
					sends.Add(1)
					if err := m.peers[i].Send(context.Background(), victim, payload(i, 0, 0)); err != nil {
						failures.Add(1)
						lastErr[i].Store(&err)
					}
					if hammerCtx.Err() != nil && remembered(i) || time.Since(began) > hang {
						return
					}
					time.Sleep(100 * time.Microsecond)
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(began)
	t.Logf("%d sends to the dead peer in %v, %d failed", sends.Load(), elapsed, failures.Load())
	assert.Equal(t, sends.Load(), failures.Load(), "every send to the dead peer fails")
	maxConnects := uint64(elapsed/ttl) + 2 // attempts at least ErrorTTL apart: elapsed/ttl + 1, and one to spare
	if unpublish {
		maxConnects = 0 // the lookups fail: nothing to connect to
	}
	for _, i := range survivors {
		st := m.peers[i].Stats()
		connects := st.ConnectAttempts - before[i].ConnectAttempts
		created := st.Endpoints.Created - before[i].Endpoints.Created
		t.Logf("peer %d: %d connection attempts (%d creations by the cache), %d endpoints created, %d sends answered by the remembered failure",
			i, connects, st.Cache.Attempts-before[i].Cache.Attempts, created, st.Cache.ErrorHits-before[i].Cache.ErrorHits)
		assert.LessOrEqual(t, connects, maxConnects, "peer %d: connection attempts to the dead peer", i)
		assert.Zero(t, created, "peer %d: endpoints created to the dead peer", i)
		assert.Positive(t, st.Cache.ErrorHits-before[i].Cache.ErrorHits, "peer %d: the failure was remembered", i)
		p := lastErr[i].Load()
		require.NotNil(t, p, "peer %d: no send failed", i)
		err := *p
		if unpublish {
			var np *directory.NotPublishedError
			if assert.ErrorAs(t, err, &np, "peer %d", i) {
				assert.True(t, np.Withdrawn)
			}
		} else {
			assert.ErrorIs(t, err, ucx.StatusUnreachable, "peer %d", i)
		}
	}
	t.Logf("last error: %v", *lastErr[0].Load())

	// The others are not disturbed.
	exchange(t, m, survivors, want)

	// The victim restarts with the same id; once the remembered failure
	// has expired, everyone reaches it again.
	m.kill(t, victim)
	st := dead.Stats().Endpoints
	assert.EqualValues(t, peers-1, st.Orphaned, "the crashed worker's endpoints were closed as orphans")
	assert.Zero(t, st.Live())
	m.start(t, victim, cfg)
	want[victim] = 0
	for _, i := range survivors {
		assert.Eventually(t, func() bool {
			return m.peers[i].Send(context.Background(), victim, payload(i, 1, 0)) == nil
		}, hang, ttl/10, "peer %d cannot reach the restarted peer", i)
	}
	want[victim] = int64(len(survivors))
	waitTotal(t, m.in[victim], want[victim], "restarted peer")
	exchange(t, m, all, want)
	assert.EqualValues(t, len(survivors), c.Stats().Failed, "failed endpoints: one per survivor, to the crashed worker")

	// Closing the peers one after another fails the others' endpoints to
	// each peer already gone: more error callbacks, no leak.
	m.close(t)
	total := c.Stats()
	t.Logf("context: %+v", total)
	assert.Equal(t, total.Created, total.Closed, "every endpoint created was closed")
	assert.EqualValues(t, peers-1, total.Orphaned, "only the crashed worker's endpoints were orphans")
}

// TestFailureDuringSend closes a peer normally while others send to it as
// fast as they can: every send succeeds or fails with a clear error, the
// failed endpoints are dropped, and nothing leaks.
func TestFailureDuringSend(t *testing.T) {
	c := newContext(t, quiet())
	m := startMesh(t, c, 3, 0, func(c *ucx.Config) { c.ErrorTTL = 50 * time.Millisecond })
	exchange(t, m, []int{0, 1, 2}, map[int]int64{})
	var (
		wg            sync.WaitGroup
		ok, failed    atomic.Int64
		unexpectedErr atomic.Pointer[error]
		stop          = make(chan struct{})
	)
	for _, i := range []int{0, 1} {
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					err := m.peers[i].Send(context.Background(), 2, payload(i, 0, 0))
					switch {
					case err == nil:
						ok.Add(1)
					default:
						failed.Add(1)
						var st ucx.Status
						if !assertClearError(err, &st) {
							unexpectedErr.Store(&err)
						}
					}
				}
			})
		}
	}
	// Sends succeed while the peer lives, and fail once it is gone: each
	// phase lasts until it has been seen, however slowly the senders run.
	eventually(t, func() bool { return ok.Load() > 0 }, "no send succeeded before the peer closed")
	m.kill(t, 2)
	eventually(t, func() bool { return failed.Load() > 0 }, "no send to the dead peer failed")
	close(stop)
	wg.Wait()
	t.Logf("%d sends succeeded, %d failed", ok.Load(), failed.Load())
	assert.Positive(t, ok.Load())
	assert.Positive(t, failed.Load())
	if p := unexpectedErr.Load(); p != nil {
		t.Errorf("a send failed with an unexpected error: %v", *p)
	}
}

// assertClearError reports whether err is one a sender to a dead peer may
// see: the endpoint failed, or connecting to the peer failed in UCX.
func assertClearError(err error, st *ucx.Status) bool {
	return errors.As(err, st) || errors.Is(err, ucx.ErrEndpointFailed)
}
