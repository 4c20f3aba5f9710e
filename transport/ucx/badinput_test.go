//go:build ucx

package ucx_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/ucx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBadAddress hands Connect what is not a worker address: truncated,
// padded, garbage behind a valid header, random bytes, an address of a
// closed context. Each is refused with a clear error before UCX sees it
// (UCX trusts the lengths inside an address and would read past a
// truncated one); nothing is created, nothing crashes.
func TestBadAddress(t *testing.T) {
	c := newContext(t, nil)
	w, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, w.Close()) }()
	peer, err := c.NewWorker(ucx.WorkerOptions{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, peer.Close()) }()
	good := peer.Address()

	// An address of a context that is closed by now.
	old, err := ucx.NewContext(ucx.Options{Config: testConfig})
	require.NoError(t, err)
	ow, err := old.NewWorker(ucx.WorkerOptions{})
	require.NoError(t, err)
	stale := ow.Address()
	require.NoError(t, old.Close())

	garbage := append([]byte(nil), good...)
	for i := 8; i < len(garbage); i++ {
		garbage[i] = byte(rand.N(256))
	}
	random := make([]byte, len(good))
	for i := range random {
		random[i] = byte(rand.N(256))
	}
	lying := append([]byte(nil), good...) // the header announces more than follows
	binary.BigEndian.PutUint32(lying[4:], uint32(len(good)))

	for _, tc := range []struct {
		name    string
		addr    []byte
		bad     bool // ErrBadAddress; else ErrUnknownAddress
		pattern string
	}{
		{"empty", nil, true, "shorter than the 8-byte header"},
		{"header only", good[:8], true, "truncated"},
		{"truncated by one", good[:len(good)-1], true, "truncated"},
		{"truncated to half", good[:len(good)/2], true, "truncated"},
		{"padded", append(append([]byte(nil), good...), 0), true, "1 bytes after"},
		{"no header", good[8:], true, "no \"epU\" header"},
		{"random", random, true, "no \"epU\" header"},
		{"lying length", lying, true, "truncated"},
		{"garbage behind a header", garbage, false, "no open context of this process issued it"},
		{"closed context", stale, false, "no open context of this process issued it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep, err := w.Connect(context.Background(), tc.addr, 1)
			assert.Nil(t, ep)
			if tc.bad {
				assert.ErrorIs(t, err, ucx.ErrBadAddress)
				var ae *ucx.AddressError
				if assert.ErrorAs(t, err, &ae) {
					assert.Equal(t, len(tc.addr), ae.Len)
				}
			} else {
				assert.ErrorIs(t, err, ucx.ErrUnknownAddress)
			}
			assert.ErrorContains(t, err, tc.pattern)
		})
	}
	assert.Zero(t, w.Stats().Created, "nothing reached ucp_ep_create")
	assert.Zero(t, w.Stats().CreateErrors)

	ep, err := w.Connect(context.Background(), good, 1)
	require.NoError(t, err, "the good address still connects")
	require.NoError(t, ep.Close())
}

// TestBadInput feeds a peer what it must refuse: sends to peers that do not
// exist, to itself, messages over MaxMessage, a directory entry that is not
// a worker address, a peer that never publishes; and a receiver whose
// MaxMessage is smaller than a message sent to it. Each is a clear error,
// and nothing leaks.
func TestBadInput(t *testing.T) {
	c := newContext(t, nil)
	// Peers 0 and 1 run; peer 2 is in the directory, with garbage for an
	// address.
	m := startMesh(t, c, 2, 3, func(c *ucx.Config) {
		if c.ID == 1 {
			c.MaxMessage = 16
		}
	})
	p := m.peers[0]
	ctx := context.Background()
	require.NoError(t, m.dir.Publish(2, "this is not a UCX worker address"))

	err := p.Send(ctx, 3, []byte("x"))
	assert.ErrorIs(t, err, directory.ErrUnknownPeer)
	assert.ErrorIs(t, p.Send(ctx, -1, []byte("x")), directory.ErrUnknownPeer)
	assert.ErrorIs(t, p.Send(ctx, 0, []byte("x")), ucx.ErrSelf)
	err = p.Send(ctx, 1, make([]byte, ucx.DefaultMaxMessage+1))
	assert.ErrorIs(t, err, ucx.ErrMessageTooLarge)
	err = p.Send(ctx, 2, []byte("x"))
	assert.ErrorIs(t, err, ucx.ErrBadAddress, "a garbage address in the directory")
	t.Logf("garbage address: %v", err)

	// A peer that never publishes fails the send at CreateTimeout. The
	// timeout is short for the test, so it belongs to a peer of its own,
	// which connects to nobody else: it cuts no other connection short.
	impatient, err := ucx.Start(ucx.Config{ID: 0, Directory: neverPublished(t), Context: c, CreateTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer func() { assert.NoError(t, impatient.Close()) }()
	// On a slow machine, the timeout can end the creation before its first
	// lookup has returned: the error can only say that time ran out, and
	// the send is made again.
	send := func() error { return impatient.Send(ctx, 1, []byte("x")) }
	err = send()
	for began := time.Now(); errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, directory.ErrNotPublished); err = send() {
		t.Logf("no attempt had failed before the timeout: %v", err)
		require.Less(t, time.Since(began), hang, "no attempt ever failed before the timeout")
	}
	assert.ErrorIs(t, err, directory.ErrNotPublished, "a peer that never publishes, after CreateTimeout")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	t.Logf("never published: %v", err)
	assert.NoError(t, impatient.Close())

	// Peer 1 receives into 16 bytes: a longer message is dropped and
	// counted; a short one after it arrives.
	require.NoError(t, p.Send(ctx, 1, make([]byte, 100)))
	require.NoError(t, p.Send(ctx, 1, payload(0, 0, 0)))
	waitTotal(t, m.in[1], 1, "peer 1")
	assert.EqualValues(t, 1, m.peers[1].Stats().Truncated)

	for _, cfg := range []ucx.Config{
		{ID: 0, Context: c},
		{ID: 0, Directory: m.dir},
		{ID: 3, Directory: m.dir, Context: c},
		{ID: 0, Directory: m.dir, Context: c, MaxMessage: ucx.MaxMessageLimit + 1},
		{ID: 0, Directory: m.dir, Context: c, ErrorTTL: -1},
	} {
		_, err := ucx.Start(cfg)
		assert.ErrorContains(t, err, "ucx: Config.", "%+v", cfg)
	}
	_, err = ucx.NewContext(ucx.Options{Config: map[string]string{"USE_MT_MUTEX": "perhaps", "LOG_LEVEL": "fatal"}})
	assert.Error(t, err, "a value UCX cannot parse")
	t.Logf("bad configuration: %v", err)
}

// neverPublished returns a directory of two peers in which peer 1 never
// publishes.
func neverPublished(t *testing.T) *directory.Directory {
	t.Helper()
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	return dir
}
