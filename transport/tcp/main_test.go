package tcp_test

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/internal/meshtest"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// accept loop, reader and connection attempt must be gone once the test has
// closed its peers.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// openFDs returns the number of this process's open file descriptors, or
// -1 where /proc is absent.
func openFDs(t *testing.T) int {
	t.Helper()
	warmUp.Do(func() {
		// The runtime's network poller keeps a few descriptors (epoll, an
		// eventfd) from its first use on: open it before the baseline.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		require.NoError(t, ln.Close())
	})
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(entries)
}

var warmUp sync.Once

// checkFDs asserts that the process is back to baseline open descriptors.
func checkFDs(t *testing.T, baseline int) {
	t.Helper()
	if baseline < 0 {
		t.Log("no /proc/self/fd: descriptor count not checked")
		return
	}
	var now int
	ok := eventually(t, func() bool {
		now = openFDs(t)
		return now == baseline
	})
	if !ok {
		t.Errorf("%d descriptors open after closing every peer; %d before", now, baseline)
	}
}

// mesh is n peers sharing a directory, each with a receiver counting what
// arrives.
type mesh struct {
	dir   *directory.Directory
	peers []*tcp.Peer
	in    []*inbox
}

// startMesh starts peers 0 to n-1 of a directory of size dirSize (n if 0),
// with cfg adjusting each peer's Config. The peers are closed when the test
// ends, if the test did not close them.
func startMesh(t *testing.T, n, dirSize int, cfg func(*tcp.Config)) *mesh {
	t.Helper()
	if dirSize == 0 {
		dirSize = n
	}
	dir, err := directory.New(directory.Options{Size: dirSize})
	require.NoError(t, err)
	m := &mesh{dir: dir, peers: make([]*tcp.Peer, n), in: make([]*inbox, n)}
	t.Cleanup(func() { m.close(t) })
	for i := range n {
		m.start(t, i, cfg)
	}
	return m
}

// start starts (or restarts) peer i. Its handshakes and connections are
// given patience: a test that tests one of those timeouts sets it in cfg.
func (m *mesh) start(t *testing.T, i int, cfg func(*tcp.Config)) {
	t.Helper()
	c := tcp.Config{ID: i, Directory: m.dir, HandshakeTimeout: patience, CreateTimeout: patience}
	if cfg != nil {
		cfg(&c)
	}
	p, err := tcp.Listen(c)
	require.NoError(t, err)
	m.peers[i] = p
	m.in[i] = receive(p, m.dir.Size())
}

// kill closes peer i and waits for its receiver.
func (m *mesh) kill(t *testing.T, i int) {
	t.Helper()
	assert.NoError(t, m.peers[i].Close())
	<-m.in[i].Done
}

func (m *mesh) close(t *testing.T) {
	t.Helper()
	for i, p := range m.peers {
		if p != nil {
			m.kill(t, i)
		}
	}
	for i, p := range m.peers {
		if p == nil {
			continue
		}
		st := p.Stats()
		assert.Zero(t, st.Open(), "peer %d: connection ends still open after Close: %+v", i, st)
		assert.Zero(t, st.Cache.Live, "peer %d: endpoints not released after Close", i)
	}
}

// inbox counts the messages one peer receives, by sender.
type inbox = meshtest.Inbox

// receive counts p's messages until p closes.
func receive(p *tcp.Peer, n int) *inbox {
	return meshtest.Receive(func(ctx context.Context) (int, []byte, error) {
		msg, err := p.Recv(ctx)
		return msg.From, msg.Payload, err
	}, tcp.ErrClosed, n)
}

var (
	payload    = meshtest.Payload
	waitTotal  = meshtest.WaitTotal
	waitFinals = meshtest.WaitFinals
	eventually = meshtest.Eventually
)

const (
	// hang bounds a wait that only detects a hang (see meshtest.Hang).
	hang = meshtest.Hang
	// patience is the HandshakeTimeout and CreateTimeout of a peer whose
	// test does not test them (see meshtest.Patience).
	patience = meshtest.Patience
)

// checkOnePerPair asserts that every pair of peers among ids that holds an
// endpoint shares one connection (each end's local address is the other's
// remote address), that every pair in want holds one, and that no other
// connection end is open.
func checkOnePerPair(t *testing.T, m *mesh, ids []int) {
	t.Helper()
	pairs := 0
	for a, i := range ids {
		for _, j := range ids[a+1:] {
			li, ri, oki := tcp.Endpoint(m.peers[i], j)
			lj, rj, okj := tcp.Endpoint(m.peers[j], i)
			if !oki || !okj {
				t.Errorf("peers %d and %d: endpoints held: %v and %v; want both", i, j, oki, okj)
				continue
			}
			pairs++
			if li != rj || ri != lj {
				t.Errorf("peers %d and %d use different connections: %s->%s and %s->%s", i, j, li, ri, lj, rj)
			}
		}
	}
	// The ends that lost, or were given up, close on their own goroutines,
	// some once the other end has closed its side.
	var open int64
	ok := eventually(t, func() bool {
		open = 0
		for _, i := range ids {
			open += m.peers[i].Stats().Open()
		}
		return open == int64(2*pairs)
	})
	if !ok {
		t.Errorf("%d connection ends open for %d pairs; want exactly 2 per pair", open, pairs)
	}
}

// sum adds up the stats of peers.
func sum(peers []*tcp.Peer) tcp.Stats {
	var s tcp.Stats
	for _, p := range peers {
		if p == nil {
			continue
		}
		st := p.Stats()
		s.DialAttempts += st.DialAttempts
		s.Dialed += st.Dialed
		s.Accepted += st.Accepted
		s.Closed += st.Closed
		s.Duplicates += st.Duplicates
		s.Refused += st.Refused
		s.NotPublished += st.NotPublished
		s.BadFrames += st.BadFrames
		s.Sent += st.Sent
		s.Received += st.Received
		s.Busy += st.Busy
		s.BusyRetries += st.BusyRetries
		s.Resent += st.Resent
		s.Descriptors += st.Descriptors
		s.PeakDescriptors = max(s.PeakDescriptors, st.PeakDescriptors)
		s.Cache.Evictions += st.Cache.Evictions
		s.Cache.IdleRemovals += st.Cache.IdleRemovals
		s.Cache.RoomWaits += st.Cache.RoomWaits
		s.Cache.Creates += st.Cache.Creates
		s.Cache.Offers += st.Cache.Offers
		s.Cache.Attempts += st.Cache.Attempts
		s.Cache.CreateErrors += st.Cache.CreateErrors
		s.Cache.ErrorHits += st.Cache.ErrorHits
	}
	return s
}
