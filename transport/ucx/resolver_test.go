//go:build ucx

package ucx_test

import (
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/internal/meshtest"
	"github.com/epcache/epcache/transport/ucx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResolveWaitsForAddress: with a directory.Resolver (the in-process
// directory is one), a Send to a peer that has not published yet waits for
// its address in one connection attempt (the retry policy here would give
// up at once), and connects once the peer publishes.
func TestResolveWaitsForAddress(t *testing.T) {
	c := newContext(t, nil)
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	noRetry := func(int, error) (time.Duration, bool) { return 0, false }
	a, err := ucx.Start(ucx.Config{Directory: dir, Context: c, Retry: noRetry, CreateTimeout: patience})
	require.NoError(t, err)
	defer func() { assert.NoError(t, a.Close()) }()
	errc := make(chan error, 1)
	go func() { errc <- sendOrHang(a, 1, payload(0, 0, 0)) }()
	require.True(t, eventually(t, func() bool { return a.Stats().NotPublished > 0 }), "the lookup never said 'not yet'")

	b, err := ucx.Start(ucx.Config{ID: 1, Directory: dir, Context: c, CreateTimeout: patience})
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	inB := receive(b, 2)
	require.NoError(t, <-errc)
	waitTotal(t, inB, 1, "peer 1")
	st := a.Stats()
	assert.EqualValues(t, 1, st.NotPublished, "one lookup said 'not yet', and the attempt waited")
	assert.EqualValues(t, 1, st.Cache.Attempts, "one attempt")
	assert.EqualValues(t, 1, st.ConnectAttempts)
}

// TestUnreachableAddress: an address that is no live worker's (here, a
// closed worker's: no open context issued it any more) is reported with
// Unreachable; the directory, asked again, has the peer's new address (the
// report makes it publish it, as a store that held a stale copy would fetch
// the new one), and the same connection attempt connects to it.
func TestUnreachableAddress(t *testing.T) {
	c := newContext(t, quiet())
	old := newContext(t, quiet())
	d, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	dir := &meshtest.Reporting{Directory: d}
	noRetry := func(int, error) (time.Duration, bool) { return 0, false }
	a, err := ucx.Start(ucx.Config{Directory: dir, Context: c, Retry: noRetry, CreateTimeout: patience})
	require.NoError(t, err)
	defer func() { assert.NoError(t, a.Close()) }()
	b, err := ucx.Start(ucx.Config{ID: 1, Directory: dir, Context: c, CreateTimeout: patience})
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	inB := receive(b, 2)

	// Peer 1's previous worker, in a context since closed.
	w, err := old.NewWorker(ucx.WorkerOptions{})
	require.NoError(t, err)
	stale := string(w.Address())
	require.NoError(t, w.Close())
	require.NoError(t, old.Close())
	require.NoError(t, d.Publish(1, stale))
	fresh := string(b.Worker().Address())
	dir.OnUnreachable = func(peer int, addr string) {
		if peer == 1 && addr == stale {
			assert.NoError(t, d.Publish(1, fresh))
		}
	}
	require.NoError(t, sendOrHang(a, 1, payload(0, 0, 0)))
	waitTotal(t, inB, 1, "peer 1")
	assert.Equal(t, []string{stale}, dir.Reported())
	st := a.Stats()
	assert.EqualValues(t, 2, st.ConnectAttempts, "the stale address, then the new one")
	assert.EqualValues(t, 1, st.Cache.Attempts, "in one connection attempt")
}
