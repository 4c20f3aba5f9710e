package tcp_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLatePublication starts peers whose addresses become visible only
// after the directory's delay, and has them send to each other at once:
// the lookups say "not yet", the connection attempts retry, and every send
// succeeds, since the delay is inside the retry budget.
func TestLatePublication(t *testing.T) {
	const peers, senders = 4, 4
	delay := 300 * time.Millisecond
	if testing.Short() {
		delay = 100 * time.Millisecond
	}
	baseline := openFDs(t)
	m := startMesh(t, peers, 0, delay, func(c *tcp.Config) {
		c.Retry = epcache.Backoff(2*time.Millisecond, 20*time.Millisecond, 0, tcp.Retryable)
		c.CreateTimeout = 10 * delay
	})
	began := time.Now()
	var wg sync.WaitGroup
	for i := range peers {
		for g := range senders {
			wg.Go(func() {
				for j := range peers {
					if j == i {
						continue
					}
					if err := m.peers[i].Send(context.Background(), j, payload(i, g, j)); err != nil {
						t.Errorf("peer %d -> %d: %v", i, j, err)
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(began)
	for i := range peers {
		waitTotal(t, m.in[i], (peers-1)*senders, "peer "+strconv.Itoa(i))
	}
	st := sum(m.peers)
	t.Logf("all sent after %v (delay %v): %d lookups said not yet, %d connection attempts for %d creations",
		elapsed, delay, st.NotPublished, st.Cache.Attempts, st.Cache.Creates)
	assert.Positive(t, st.NotPublished, "lookups before the delay say not yet")
	assert.Greater(t, st.Cache.Attempts, st.Cache.Creates, "creations retried")
	assert.Zero(t, st.Cache.CreateErrors, "no creation failed")

	m.close(t)
	checkFDs(t, baseline)
}

// TestPublicationOutsideBudget has a peer whose address becomes visible
// only long after the sender's retry budget: the send fails with an error
// that says why, whether the budget is a number of attempts or a timeout.
func TestPublicationOutsideBudget(t *testing.T) {
	for _, tc := range []struct {
		name  string
		retry func(int, error) (time.Duration, bool)
		limit time.Duration
	}{
		{"attempts", epcache.Backoff(time.Millisecond, 5*time.Millisecond, 5, tcp.Retryable), 0},
		{"timeout", epcache.Backoff(time.Millisecond, 5*time.Millisecond, 0, tcp.Retryable), 100 * time.Millisecond},
	} {
		t.Run("budget="+tc.name, func(t *testing.T) {
			baseline := openFDs(t)
			dir, err := directory.New(directory.Options{Size: 2, Delay: time.Hour})
			require.NoError(t, err)
			cfg := tcp.Config{Directory: dir, Retry: tc.retry, CreateTimeout: tc.limit}
			a, err := tcp.Listen(cfg)
			require.NoError(t, err)
			cfg.ID = 1
			b, err := tcp.Listen(cfg)
			require.NoError(t, err)

			// The address becomes visible in an hour: the send returns
			// because the retry budget ran out (else the test times out).
			err = a.Send(context.Background(), 1, []byte("hello"))
			t.Log(err)
			require.ErrorIs(t, err, directory.ErrNotPublished)
			var np *directory.NotPublishedError
			require.ErrorAs(t, err, &np)
			assert.Equal(t, 1, np.Peer)
			assert.True(t, np.Pending)
			assert.ErrorContains(t, err, "tcp: connect to peer 1: directory: peer 1 has published an address that is not visible yet")
			if tc.limit > 0 {
				assert.ErrorIs(t, err, context.DeadlineExceeded)
			}
			assert.Zero(t, a.Stats().DialAttempts)

			assert.NoError(t, a.Close())
			assert.NoError(t, b.Close())
			checkFDs(t, baseline)
		})
	}
}

// TestCloseCancelsWaitingSend closes a peer while a Send waits for an
// address that is not published: the Send returns ErrClosed at once.
func TestCloseCancelsWaitingSend(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	a, err := tcp.Listen(tcp.Config{Directory: dir})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- a.Send(context.Background(), 1, nil) }()
	require.Eventually(t, func() bool { return a.Stats().NotPublished > 0 }, 5*time.Second, time.Millisecond)
	require.NoError(t, a.Close())
	err = <-errc // the address is never published: only Close ends the Send
	assert.ErrorIs(t, err, tcp.ErrClosed)

	assert.ErrorIs(t, a.Send(context.Background(), 1, nil), tcp.ErrClosed)
	_, err = a.Recv(context.Background())
	assert.ErrorIs(t, err, tcp.ErrClosed)
	assert.NoError(t, a.Close(), "a second Close")
}

// TestSendContext: a Send whose own context ends while the connection is
// being made returns ctx.Err() unchanged.
func TestSendContext(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	a, err := tcp.Listen(tcp.Config{Directory: dir})
	require.NoError(t, err)
	defer func() { assert.NoError(t, a.Close()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = a.Send(ctx, 1, nil)
	assert.True(t, errors.Is(err, context.DeadlineExceeded) && err == ctx.Err(), "got %v", err)

	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = a.Recv(ctx)
	assert.Equal(t, context.DeadlineExceeded, err)
}

// hiding is a directory in which one peer's address is not published yet,
// as peer 0 below sees it (a publication that has not reached it).
type hiding struct {
	directory.Interface
	peer int
}

func (h hiding) Lookup(peer int) (string, error) {
	if peer == h.peer {
		return "", &directory.NotPublishedError{Peer: peer}
	}
	return h.Interface.Lookup(peer)
}

// TestConnectedWhileWaitingForAddress: peer 0 waits for peer 1's address,
// which it cannot see yet, while peer 1, which sees peer 0's, connects to
// it. Peer 0 is not dialing while it waits for an address, so it accepts
// peer 1's connection, and its next attempt adopts it: its send completes
// without the address and without a dial.
func TestConnectedWhileWaitingForAddress(t *testing.T) {
	baseline := openFDs(t)
	m := startMesh(t, 2, 0, 0, func(c *tcp.Config) {
		c.Retry = epcache.Backoff(time.Millisecond, 10*time.Millisecond, 0, tcp.Retryable)
		if c.ID == 0 {
			c.Directory = hiding{c.Directory, 1}
		}
	})
	a, b := m.peers[0], m.peers[1]

	errc := make(chan error, 1)
	go func() { errc <- a.Send(context.Background(), 1, payload(0, 0, 0)) }()
	require.Eventually(t, func() bool { return a.Stats().NotPublished > 0 }, 5*time.Second, time.Millisecond)
	require.NoError(t, b.Send(context.Background(), 0, payload(1, 0, 0)))
	require.NoError(t, <-errc)
	assert.Zero(t, a.Stats().DialAttempts, "peer 0 adopted peer 1's connection")
	assert.Zero(t, a.Stats().Duplicates+b.Stats().Duplicates)
	waitTotal(t, m.in[0], 1, "peer 0")
	waitTotal(t, m.in[1], 1, "peer 1")
	checkOnePerPair(t, m, []int{0, 1})
	m.close(t)
	checkFDs(t, baseline)
}
