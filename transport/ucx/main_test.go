//go:build ucx

package ucx_test

import (
	"context"
	"maps"
	"testing"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/internal/meshtest"
	"github.com/epcache/epcache/transport/ucx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// progress goroutine, receiver, failure report and abandoned wait must be
// gone once the test has closed its workers. (UCX's own threads are not
// goroutines: goleak does not see them, and ucp_cleanup stops them.)
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testConfig is the UCX configuration of the tests.
//
// TLS=self,tcp: with UCP_ERR_HANDLING_MODE_PEER, UCX 1.13 refuses the
// shared-memory transports for active messages ("no peer failure handler"),
// so between workers everything goes over TCP anyway; leaving sysv and
// posix in would only allocate shared-memory segments per worker, which a
// container's small /dev/shm (64 MiB by default in Docker) runs out of with
// dozens of workers, and cma needs ptrace rights that containers often
// lack. TCP also makes a dead worker visible at once: its sockets close.
var testConfig = map[string]string{"TLS": "self,tcp"}

// quiet adds to testConfig what silences UCX's log, for tests that provoke
// the errors it would print (connect() refused by a dead worker's socket).
func quiet() map[string]string {
	cfg := maps.Clone(testConfig)
	cfg["LOG_LEVEL"] = "fatal"
	return cfg
}

// newContext returns a context of cfg (testConfig if nil), closed when the
// test ends; it then checks that every endpoint created was closed, and
// none had to be closed as an orphan.
func newContext(t *testing.T, cfg map[string]string) *ucx.Context {
	t.Helper()
	if cfg == nil {
		cfg = testConfig
	}
	c, err := ucx.NewContext(ucx.Options{Config: cfg})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, c.Close())
		st := c.Stats()
		assert.Zero(t, st.Live(), "endpoints created and not closed: %+v", st)
	})
	return c
}

// mesh is n peers sharing a directory and a context, each with a receiver
// counting what arrives.
type mesh struct {
	ctx   *ucx.Context
	dir   *directory.Directory
	peers []*ucx.Peer
	in    []*inbox
}

// startMesh starts peers 0 to n-1 of a directory of size dirSize (n if 0)
// in ctx, with cfg adjusting each peer's Config. The peers are closed when
// the test ends, if the test did not close them.
func startMesh(t *testing.T, c *ucx.Context, n, dirSize int, cfg func(*ucx.Config)) *mesh {
	t.Helper()
	if dirSize == 0 {
		dirSize = n
	}
	dir, err := directory.New(directory.Options{Size: dirSize})
	require.NoError(t, err)
	m := &mesh{ctx: c, dir: dir, peers: make([]*ucx.Peer, n), in: make([]*inbox, n)}
	t.Cleanup(func() { m.close(t) })
	for i := range n {
		m.start(t, i, cfg)
	}
	return m
}

// start starts (or restarts) peer i. Its connections are given patience: a
// test that tests CreateTimeout sets it in cfg.
func (m *mesh) start(t *testing.T, i int, cfg func(*ucx.Config)) {
	t.Helper()
	c := ucx.Config{ID: i, Directory: m.dir, Context: m.ctx, CreateTimeout: patience}
	if cfg != nil {
		cfg(&c)
	}
	p, err := ucx.Start(c)
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

// close closes every peer and checks that each closed every endpoint it
// created, none as an orphan.
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
		assert.Zero(t, st.Endpoints.Live(), "peer %d: endpoints not closed after Close: %+v", i, st.Endpoints)
		assert.Zero(t, st.Endpoints.Orphaned, "peer %d: endpoints left to Worker.Close", i)
		assert.Zero(t, st.Cache.Live, "peer %d: endpoints not released after Close", i)
	}
}

// inbox counts the messages one peer receives, by sender.
type inbox = meshtest.Inbox

// receive counts p's messages until p closes.
func receive(p *ucx.Peer, n int) *inbox {
	return meshtest.Receive(func(ctx context.Context) (int, []byte, error) {
		msg, err := p.Recv(ctx)
		return msg.From, msg.Payload, err
	}, ucx.ErrClosed, n)
}

var (
	payload    = meshtest.Payload
	waitTotal  = meshtest.WaitTotal
	eventually = meshtest.Eventually
)

const (
	// hang bounds a wait that only detects a hang (see meshtest.Hang).
	hang = meshtest.Hang
	// patience is the CreateTimeout of a peer whose test does not test it
	// (see meshtest.Patience).
	patience = meshtest.Patience
)

// sendOrHang sends payload from p to peer to, with a context that ends only
// if the Send hangs.
func sendOrHang(p *ucx.Peer, to int, payload []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	return p.Send(ctx, to, payload)
}
