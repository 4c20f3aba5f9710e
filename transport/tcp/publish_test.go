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
// after the others have looked them up, and has them send to each other at
// once: the lookups say "not yet", the connection attempts retry, and every
// send succeeds once the addresses are visible, since that is inside the
// retry budget.
func TestLatePublication(t *testing.T) {
	const peers, senders = 4, 4
	baseline := openFDs(t)
	// The publication is late by as long as the test wants, not by a delay
	// a slow machine could outlast before its first lookup.
	fence := make(chan struct{})
	m := startMesh(t, peers, 0, func(c *tcp.Config) {
		c.Directory = fenced{c.Directory, fence}
		c.Retry = epcache.Backoff(2*time.Millisecond, 20*time.Millisecond, 0, tcp.Retryable)
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
	eventually(t, func() bool {
		for _, p := range m.peers {
			if p.Stats().NotPublished == 0 {
				return false
			}
		}
		return true
	}, "every peer has been told 'not yet'")
	close(fence)
	wg.Wait()
	elapsed := time.Since(began)
	for i := range peers {
		waitTotal(t, m.in[i], (peers-1)*senders, "peer "+strconv.Itoa(i))
	}
	st := sum(m.peers)
	t.Logf("all sent after %v: %d lookups said not yet, %d connection attempts for %d creations",
		elapsed, st.NotPublished, st.Cache.Attempts, st.Cache.Creates)
	assert.Positive(t, st.NotPublished, "lookups before the publication say not yet")
	assert.Greater(t, st.Cache.Attempts, st.Cache.Creates, "creations retried")
	assert.Zero(t, st.Cache.CreateErrors, "no creation failed")

	m.close(t)
	checkFDs(t, baseline)
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

// TestPublicationOutsideBudget has a peer whose address becomes visible
// only long after the sender's retry budget: the send fails with an error
// that says why, whether the budget is a number of attempts (of lookups
// that say "not yet", with a directory that cannot wait) or a timeout
// (with one that can, a directory.Resolver, the wait in Resolve too).
func TestPublicationOutsideBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		retry    func(int, error) (time.Duration, bool)
		limit    time.Duration
		resolver bool
	}{
		{"attempts", epcache.Backoff(time.Millisecond, 5*time.Millisecond, 5, tcp.Retryable), patience, false},
		{"timeout", epcache.Backoff(time.Millisecond, 5*time.Millisecond, 0, tcp.Retryable), 100 * time.Millisecond, false},
		{"timeout/resolver", epcache.Backoff(time.Millisecond, 5*time.Millisecond, 0, tcp.Retryable), 100 * time.Millisecond, true},
	} {
		t.Run("budget="+tc.name, func(t *testing.T) {
			baseline := openFDs(t)
			d, err := directory.New(directory.Options{Size: 2, Delay: time.Hour})
			require.NoError(t, err)
			var dir directory.Interface = lookupOnly{d}
			if tc.resolver {
				dir = d
			}
			cfg := tcp.Config{Directory: dir, Retry: tc.retry, CreateTimeout: tc.limit}
			a, err := tcp.Listen(cfg)
			require.NoError(t, err)
			cfg.ID = 1
			b, err := tcp.Listen(cfg)
			require.NoError(t, err)

			// The address becomes visible in an hour: the send returns
			// because the retry budget ran out (else the test times out).
			// A CreateTimeout can end the creation before its first
			// lookup has returned, on a slow machine: the error can only
			// say that time ran out, and the send is made again.
			send := func() error { return a.Send(context.Background(), 1, []byte("hello")) }
			err = send()
			for began := time.Now(); errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, directory.ErrNotPublished); err = send() {
				t.Logf("no attempt had failed before the timeout: %v", err)
				require.Less(t, time.Since(began), hang, "no attempt ever failed before the timeout")
			}
			t.Log(err)
			require.ErrorIs(t, err, directory.ErrNotPublished)
			var np *directory.NotPublishedError
			require.ErrorAs(t, err, &np)
			assert.Equal(t, 1, np.Peer)
			assert.True(t, np.Pending)
			assert.ErrorContains(t, err, "tcp: connect to peer 1: directory: peer 1 has published an address that is not visible yet")
			if tc.name != "attempts" {
				assert.ErrorIs(t, err, context.DeadlineExceeded)
			}
			assert.Zero(t, a.Stats().DialAttempts)

			assert.NoError(t, a.Close())
			assert.NoError(t, b.Close())
			checkFDs(t, baseline)
		})
	}
}

// lookupOnly is a directory that cannot wait for an address: it hides the
// in-process directory's Resolve, as a directory of one's own may lack one.
type lookupOnly struct{ directory.Interface }

// TestCloseCancelsWaitingSend closes a peer while a Send waits for an
// address that is not published: the Send returns ErrClosed at once.
func TestCloseCancelsWaitingSend(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	a, err := tcp.Listen(tcp.Config{Directory: dir, CreateTimeout: patience})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- a.Send(context.Background(), 1, nil) }()
	require.True(t, eventually(t, func() bool { return a.Stats().NotPublished > 0 }))
	require.NoError(t, a.Close())
	err = <-errc // the address is never published: only Close ends the Send
	assert.ErrorIs(t, err, tcp.ErrClosed)

	assert.ErrorIs(t, a.Send(context.Background(), 1, nil), tcp.ErrClosed)
	_, err = a.Recv(context.Background())
	assert.ErrorIs(t, err, tcp.ErrClosed)
	assert.NoError(t, a.Close(), "a second Close")
}

// TestSendContext: a Send whose own context ends while the connection is
// being made returns ctx.Err() unchanged. The address is never published,
// and the creation's own timeout is patience: only the context can end the
// Send, however late its 20ms are up.
func TestSendContext(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	a, err := tcp.Listen(tcp.Config{Directory: dir, CreateTimeout: patience})
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
	m := startMesh(t, 2, 0, func(c *tcp.Config) {
		c.Retry = epcache.Backoff(time.Millisecond, 10*time.Millisecond, 0, tcp.Retryable)
		if c.ID == 0 {
			c.Directory = hiding{c.Directory, 1}
		}
	})
	a, b := m.peers[0], m.peers[1]

	errc := make(chan error, 1)
	go func() { errc <- a.Send(context.Background(), 1, payload(0, 0, 0)) }()
	require.True(t, eventually(t, func() bool { return a.Stats().NotPublished > 0 }))
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
