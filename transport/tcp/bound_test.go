package tcp_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMaxConns runs an all-to-all exchange under Config.MaxConns: every
// peer sends to every other, from several goroutines at once, with room
// for far fewer connections than it has peers, so that connections are
// evicted and made again all through the run, and peers often find each
// other full ("busy") when they connect. Every frame must arrive exactly
// once, no peer may ever hold more descriptors than MaxConns (its own
// count, Stats.Descriptors, which runs from before each dial or accept to
// after each close, sampled all through the run, and its high-water mark),
// the process's descriptors, sampled from /proc, may never exceed the
// baseline plus MaxConns+1 (the listener) per peer, and closing the peers
// gives every descriptor back.
func TestMaxConns(t *testing.T) {
	for _, tc := range []struct {
		peers, senders, maxConns int
	}{
		{peers: 64, senders: 2, maxConns: 8}, // the mesh
		// Room for one connection: every send evicts, or waits. (It
		// stalled in about one run in fifteen on a lost wakeup in
		// epcache's room, since fixed: a unit given back between a failed
		// take and the enqueue reached nobody.)
		{peers: 8, senders: 4, maxConns: 2},
	} {
		if testing.Short() && tc.peers > 16 {
			tc.peers = 16
		}
		t.Run(fmt.Sprintf("peers=%d/maxconns=%d", tc.peers, tc.maxConns), func(t *testing.T) {
			testMaxConns(t, tc.peers, tc.senders, tc.maxConns)
		})
	}
}

func testMaxConns(t *testing.T, peers, senders, maxConns int) {
	require.Zero(t, peers&(peers-1), "peers must be a power of two for the i^k pairing")
	baseline := openFDs(t)
	m := startMesh(t, peers, 0, 0, func(c *tcp.Config) { c.MaxConns = maxConns })

	// The sampler: the process's descriptors, and each peer's count of the
	// descriptors it holds, as often as it can.
	var (
		stop                       = make(chan struct{})
		sampler                    sync.WaitGroup
		samples                    int
		maxFDs, maxSum, maxOnePeer int64
	)
	sampler.Go(func() {
		for {
			n := int64(openFDs(t))
			var total int64
			for _, p := range m.peers {
				d := p.Stats().Descriptors
				total += d
				maxOnePeer = max(maxOnePeer, d)
			}
			samples++
			maxFDs, maxSum = max(maxFDs, n), max(maxSum, total)
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Microsecond):
			}
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := make(chan struct{})
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
	)
	began := time.Now()
	for i := range peers {
		for g := range senders {
			wg.Go(func() {
				<-start
				for step := range peers - 1 {
					k := 1 + (step+g)%(peers-1)
					if err := m.peers[i].Send(ctx, i^k, payload(i, g, k)); err != nil {
						failed.Add(1)
						t.Errorf("peer %d -> %d: %v", i, i^k, err)
						return
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	require.Zero(t, failed.Load())
	for i := range peers {
		waitTotal(t, m.in[i], int64((peers-1)*senders), fmt.Sprintf("peer %d", i))
		for j := range peers {
			if j != i {
				assert.Equal(t, int64(senders), m.in[i].From[j].Load(), "frames from %d to %d", j, i)
			}
		}
	}
	elapsed := time.Since(began)
	close(stop)
	sampler.Wait()

	st := sum(m.peers)
	for i, p := range m.peers {
		s := p.Stats()
		assert.LessOrEqual(t, s.PeakDescriptors, int64(maxConns), "peer %d held more descriptors than MaxConns", i)
		assert.LessOrEqual(t, s.Cache.Room, int64(maxConns-1), "peer %d: cache room", i)
	}
	t.Logf("%d frames in %v: %d dial attempts, %d accepted, %d busy answers (%d Sends waited), %d frames resent; cache: %d created, %d offered, %d evicted, %d waits for room",
		st.Sent, elapsed, st.DialAttempts, st.Accepted, st.Busy, st.BusyRetries, st.Resent, st.Cache.Creates, st.Cache.Offers, st.Cache.Evictions, st.Cache.RoomWaits)
	t.Logf("descriptors (MaxConns %d): highest PeakDescriptors %d; %d samples: at most %d in one peer, %d in all peers, %d in the process (baseline %d + %d peers × (MaxConns+1) = %d)",
		maxConns, st.PeakDescriptors, samples, maxOnePeer, maxSum, maxFDs, baseline, peers, baseline+peers*(maxConns+1))
	assert.Equal(t, uint64(peers*(peers-1)*senders), st.Sent)
	assert.Positive(t, st.Cache.Evictions, "connections were evicted to make room")
	assert.LessOrEqual(t, maxOnePeer, int64(maxConns))
	if baseline >= 0 {
		assert.LessOrEqual(t, maxFDs, int64(baseline+peers*(maxConns+1)), "process descriptors")
	}

	m.close(t)
	checkFDs(t, baseline)
}

// TestIdleTimeout: a connection that carries nothing for IdleTimeout is
// closed at both ends, and the next Send reconnects; one that a Send is
// writing on, or whose receiver holds a frame Recv has not taken, is never
// closed, however long that lasts, and every frame on it arrives.
func TestIdleTimeout(t *testing.T) {
	const idle = 50 * time.Millisecond
	baseline := openFDs(t)
	cfg := func(c *tcp.Config) { c.IdleTimeout = idle }
	m := startMesh(t, 2, 3, 0, cfg)
	a, b := m.peers[0], m.peers[1]
	ctx := context.Background()

	t.Run("unused", func(t *testing.T) {
		require.NoError(t, a.Send(ctx, 1, payload(0, 0, 0)))
		waitTotal(t, m.in[1], 1, "peer 1")
		before := a.Stats().Cache.Creates
		// Both ends drop it: one sweeps it, the other sees the end (or
		// sweeps it too).
		assert.Eventually(t, func() bool {
			_, _, okA := tcp.Endpoint(a, 1)
			_, _, okB := tcp.Endpoint(b, 0)
			return !okA && !okB && a.Stats().Open() == 0 && b.Stats().Open() == 0
		}, 10*time.Second, idle/10, "the idle connection is closed at both ends")
		assert.Positive(t, a.Stats().Cache.IdleRemovals+b.Stats().Cache.IdleRemovals)

		require.NoError(t, a.Send(ctx, 1, payload(0, 0, 1)))
		waitTotal(t, m.in[1], 2, "peer 1")
		assert.Equal(t, before+1, a.Stats().Cache.Creates, "the next Send reconnected")
	})

	t.Run("in use", func(t *testing.T) {
		// Peer 2 takes no frame for a while: peer 0's Sends fill the
		// connection and block (holding their lease), and peer 2's reader
		// holds a frame it cannot deliver.
		c, err := tcp.Listen(tcp.Config{ID: 2, Directory: m.dir, IdleTimeout: idle, RecvBuffer: 1})
		require.NoError(t, err)
		defer func() { assert.NoError(t, c.Close()) }()
		const frames, size = 64, 256 << 10
		var (
			sender sync.WaitGroup
			sent   atomic.Int64
		)
		sender.Go(func() {
			for f := range frames {
				msg := make([]byte, size)
				copy(msg, payload(0, 2, f))
				if err := a.Send(ctx, 2, msg); err != nil {
					t.Errorf("frame %d: %v", f, err)
					return
				}
				sent.Add(1)
			}
		})
		var local, remote string
		require.Eventually(t, func() bool {
			var okA, okC bool
			local, remote, okA = tcp.Endpoint(a, 2)
			_, _, okC = tcp.Endpoint(c, 0)
			return okA && okC
		}, 10*time.Second, time.Millisecond, "both ends hold the connection")
		time.Sleep(8 * idle) // many sweeps: none may take the connection
		t.Logf("%d of %d frames sent while peer 2 took none", sent.Load(), frames)
		assert.Less(t, sent.Load(), int64(frames), "the sender is blocked: the test needs bigger frames")
		l, r, ok := tcp.Endpoint(a, 2)
		assert.True(t, ok, "peer 0 dropped the connection in use")
		assert.Equal(t, [2]string{local, remote}, [2]string{l, r}, "peer 0 replaced the connection in use")
		l, r, ok = tcp.Endpoint(c, 0)
		assert.True(t, ok, "peer 2 dropped the connection in use")
		assert.Equal(t, [2]string{remote, local}, [2]string{l, r}, "peer 2 replaced the connection in use")
		assert.Zero(t, c.Stats().Cache.IdleRemovals, "peer 2 swept a connection it held a frame of")

		for f := range frames {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			msg, err := c.Recv(rctx)
			cancel()
			require.NoError(t, err, "frame %d", f)
			require.Equal(t, payload(0, 2, f), msg.Payload[:12], "frame %d", f)
		}
		sender.Wait()
		assert.Zero(t, tcp.ClosedUnderWriter(a))
		assert.Equal(t, int64(frames), sent.Load())
	})

	m.close(t)
	checkFDs(t, baseline)
}
