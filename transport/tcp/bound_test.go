package tcp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
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
	// Every wait in the mesh ends by itself, however many connections are
	// evicted and made again: the handshakes and the connections get
	// patience (startMesh), and a wait that only HandshakeTimeout could end
	// (a creation that lost a simultaneous connect and waits for a winning
	// connection that never comes: issue 24) hangs the test. It used to
	// keep the default timeout for those, and to retry the handshakes that
	// it cut on a busy machine.
	m := startMesh(t, peers, 0, func(c *tcp.Config) { c.MaxConns = maxConns })

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
					if err := sendOrHang(m.peers[i], i^k, payload(i, g, k)); err != nil {
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
	t.Logf("%d frames in %v: %d dial attempts, %d accepted, %d busy answers (%d Sends waited), %d frames resent, %d abandoned dials; cache: %d created, %d offered, %d evicted, %d waits for room",
		st.Sent, elapsed, st.DialAttempts, st.Accepted, st.Busy, st.BusyRetries, st.Resent, st.Abandoned, st.Cache.Creates, st.Cache.Offers, st.Cache.Evictions, st.Cache.RoomWaits)
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
	m := startMesh(t, 2, 0, cfg)
	a, b := m.peers[0], m.peers[1]
	ctx := context.Background()

	t.Run("unused", func(t *testing.T) {
		require.NoError(t, a.Send(ctx, 1, payload(0, 0, 0)))
		waitTotal(t, m.in[1], 1, "peer 1")
		before := a.Stats().Cache.Creates
		// Both ends drop it: one sweeps it, the other sees the end (or
		// sweeps it too).
		eventually(t, func() bool {
			_, _, okA := tcp.Endpoint(a, 1)
			_, _, okB := tcp.Endpoint(b, 0)
			return !okA && !okB && a.Stats().Open() == 0 && b.Stats().Open() == 0
		}, "the idle connection is closed at both ends")
		assert.Positive(t, a.Stats().Cache.IdleRemovals+b.Stats().Cache.IdleRemovals)

		require.NoError(t, a.Send(ctx, 1, payload(0, 0, 1)))
		waitTotal(t, m.in[1], 2, "peer 1")
		assert.Equal(t, before+1, a.Stats().Cache.Creates, "the next Send reconnected")
	})

	t.Run("in use", func(t *testing.T) {
		for attempt := 1; !idleInUse(t, idle); attempt++ {
			t.Logf("attempt %d: the connection was closed for idleness before it was in use; again", attempt)
		}
	})

	m.close(t)
	checkFDs(t, baseline)
}

// idleInUse is one attempt of TestIdleTimeout/in use. Peer 0 sends peer 1
// two small frames and a big one, and peer 1 takes none for a while: its
// inbox (RecvBuffer 1) holds the first, its reader holds the second (and a
// lease), and peer 0's Send of the third blocks in its write (holding a
// lease too). Before that state is reached, either end may rightly close
// the connection for idleness (a gap between two Sends, or a reader not run
// yet, longer than IdleTimeout on a busy machine): the attempt then reports
// false, to be made again. Once it is reached, nothing may close the
// connection, however long the test waits.
func idleInUse(t *testing.T, idle time.Duration) bool {
	t.Helper()
	const big = 16 << 20 // more than the kernel's buffers hold: its write blocks
	var (
		sender sync.WaitGroup
		sent   atomic.Int64
	)
	defer sender.Wait() // after the peers' Close, which ends a Send still blocked
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	cfg := tcp.Config{Directory: dir, IdleTimeout: idle, MaxFrame: big, HandshakeTimeout: patience, CreateTimeout: patience}
	s, err := tcp.Listen(cfg)
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Close()) }()
	cfg.ID, cfg.RecvBuffer = 1, 1
	c, err := tcp.Listen(cfg)
	require.NoError(t, err)
	defer func() { assert.NoError(t, c.Close()) }()

	frames := [][]byte{payload(0, 1, 0), payload(0, 1, 1), make([]byte, big)}
	copy(frames[2], payload(0, 1, 2))
	sender.Go(func() {
		for f, msg := range frames {
			if err := s.Send(context.Background(), 1, msg); err != nil {
				if !errors.Is(err, tcp.ErrClosed) { // closed by an attempt given up
					t.Errorf("frame %d: %v", f, err)
				}
				return
			}
			sent.Add(1)
		}
	})

	// In use: the big frame's Send is in its write (sent 2), peer 1's
	// reader is parked with the second frame, both ends hold the one
	// connection ever made, and neither has closed one for idleness.
	removed := func() bool { return s.Stats().Cache.IdleRemovals+c.Stats().Cache.IdleRemovals > 0 }
	var local, remote string
	inUse := func() bool {
		if sent.Load() != 2 || !tcp.Writing(s, 1) || c.Stats().Received != 1 || readersHoldingAFrame(t) != 1 {
			return false
		}
		var okS, okC bool
		local, remote, okS = tcp.Endpoint(s, 1)
		l, r, okC := tcp.Endpoint(c, 0)
		return okS && okC && l == remote && r == local && s.Stats().Cache.Creates == 1 && c.Stats().Cache.Offers == 1
	}
	for deadline := time.Now().Add(hang); !inUse(); time.Sleep(time.Millisecond) {
		switch {
		case removed():
			return false
		case time.Now().After(deadline):
			t.Fatalf("the connection was never in use: %d frames sent; peer 0: %+v; peer 1: %+v", sent.Load(), s.Stats(), c.Stats())
		}
	}
	if removed() {
		return false
	}

	time.Sleep(8 * idle) // many sweeps: none may take the connection
	assert.EqualValues(t, 2, sent.Load(), "the big frame's Send returned while peer 1 took no frame: the test needs a bigger frame")
	l, r, ok := tcp.Endpoint(s, 1)
	assert.True(t, ok, "peer 0 dropped the connection in use")
	assert.Equal(t, [2]string{local, remote}, [2]string{l, r}, "peer 0 replaced the connection in use")
	l, r, ok = tcp.Endpoint(c, 0)
	assert.True(t, ok, "peer 1 dropped the connection in use")
	assert.Equal(t, [2]string{remote, local}, [2]string{l, r}, "peer 1 replaced the connection in use")
	assert.Zero(t, s.Stats().Cache.IdleRemovals, "peer 0 swept a connection a Send was writing on")
	assert.Zero(t, c.Stats().Cache.IdleRemovals, "peer 1 swept a connection it held a frame of")

	for f := range frames {
		rctx, cancel := context.WithTimeout(context.Background(), hang)
		msg, err := c.Recv(rctx)
		cancel()
		require.NoError(t, err, "frame %d", f)
		require.Equal(t, payload(0, 1, f), msg.Payload[:12], "frame %d", f)
	}
	sender.Wait()
	assert.Zero(t, tcp.ClosedUnderWriter(s))
	assert.EqualValues(t, len(frames), sent.Load())
	return true
}

// readersHoldingAFrame counts the connection readers parked in deliver's
// wait for room in a full inbox: each has taken its lease first (or found
// its connection given up). Where a reader waits is not otherwise
// observable from outside the package, and a goroutine's state is.
func readersHoldingAFrame(t *testing.T) int {
	t.Helper()
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	held := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(header, "[select") && strings.Contains(g, "transport/tcp.(*conn).deliver(") {
			held++
		}
	}
	return held
}

// TestSilentStrangersUnderMaxConns (issue 24, defect 6): two connections
// that never say hello reach a peer with MaxConns, whose one accept slot
// each holds while the peer waits for its hello; a real peer's dial waits
// in the backlog behind them. A stranger may hold the slot for an eighth of
// HandshakeTimeout, a second at most: the peer then answers it "late" (a
// dialer of this package tries again) and takes the next. Before the fix,
// each held the slot for a whole HandshakeTimeout (here, patience), and the
// real dial, with the same budget, failed first (here: hung).
func TestSilentStrangersUnderMaxConns(t *testing.T) {
	baseline := openFDs(t)
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	p0, err := tcp.Listen(tcp.Config{ID: 0, Directory: dir, MaxConns: 2, HandshakeTimeout: patience, CreateTimeout: patience})
	require.NoError(t, err)
	in0 := receive(p0, 2)
	p1, err := tcp.Listen(tcp.Config{ID: 1, Directory: dir, HandshakeTimeout: patience, CreateTimeout: patience})
	require.NoError(t, err)

	var strangers []net.Conn
	for range 2 {
		nc, err := net.Dial("tcp", p0.Addr())
		require.NoError(t, err)
		strangers = append(strangers, nc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	require.NoError(t, p1.Send(ctx, 0, payload(1, 0, 0)), "the real dial never got through")
	waitTotal(t, in0, 1, "peer 0")
	for i, nc := range strangers {
		require.NoError(t, nc.SetReadDeadline(time.Now().Add(hang)))
		got, err := io.ReadAll(nc)
		require.NoError(t, err, "stranger %d", i)
		refusal(t, got, 0, lateHello)
		require.NoError(t, nc.Close())
	}
	assert.EqualValues(t, 2, p0.Stats().Refused)
	require.NoError(t, p1.Close())
	require.NoError(t, p0.Close())
	<-in0.Done
	checkFDs(t, baseline)
}
