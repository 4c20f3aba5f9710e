package directory_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newDir(t *testing.T, size int, delay time.Duration) *directory.Directory {
	t.Helper()
	d, err := directory.New(directory.Options{Size: size, Delay: delay})
	require.NoError(t, err)
	return d
}

// notPublished asserts that err is a *NotPublishedError for peer with the
// given flags, matched by both errors.Is and errors.As.
func notPublished(t *testing.T, err error, peer int, withdrawn, pending bool) {
	t.Helper()
	require.ErrorIs(t, err, directory.ErrNotPublished)
	var np *directory.NotPublishedError
	require.ErrorAs(t, err, &np)
	assert.Equal(t, peer, np.Peer)
	assert.Equal(t, withdrawn, np.Withdrawn, "Withdrawn")
	assert.Equal(t, pending, np.Pending, "Pending")
	assert.NotErrorIs(t, err, directory.ErrUnknownPeer)
}

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		opts directory.Options
		want string
	}{
		{directory.Options{}, "directory: Options.Size is 0; want 1 to 2147483647"},
		{directory.Options{Size: -1}, "directory: Options.Size is -1; want 1 to 2147483647"},
		{directory.Options{Size: 1, Delay: -time.Second}, "directory: Options.Delay is -1s; want 0 (visible at once) or a positive duration"},
	} {
		_, err := directory.New(tc.opts)
		assert.EqualError(t, err, tc.want)
	}
}

func TestPublishLookup(t *testing.T) {
	d := newDir(t, 4, 0)
	assert.Equal(t, 4, d.Size())

	_, err := d.Lookup(2)
	notPublished(t, err, 2, false, false)
	assert.EqualError(t, err, "directory: peer 2 has not published an address yet")

	require.NoError(t, d.Publish(2, "127.0.0.1:9"))
	addr, err := d.Lookup(2)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9", addr)

	_, err = d.Lookup(1)
	notPublished(t, err, 1, false, false)
}

func TestUnknownPeer(t *testing.T) {
	d := newDir(t, 4, 0)
	for _, peer := range []int{-1, 4, 1<<31 - 1} {
		_, err := d.Lookup(peer)
		require.ErrorIs(t, err, directory.ErrUnknownPeer, "Lookup(%d)", peer)
		assert.NotErrorIs(t, err, directory.ErrNotPublished)
		assert.EqualError(t, err, fmt.Sprintf("directory: unknown peer %d (peers are 0 to 3)", peer))
		assert.ErrorIs(t, d.Publish(peer, "x"), directory.ErrUnknownPeer, "Publish(%d)", peer)
		assert.False(t, d.Unpublish(peer), "Unpublish(%d)", peer)
	}
}

func TestPublishEmptyAddress(t *testing.T) {
	d := newDir(t, 1, 0)
	assert.EqualError(t, d.Publish(0, ""), "directory: Publish of an empty address for peer 0")
	_, err := d.Lookup(0)
	notPublished(t, err, 0, false, false)
}

func TestAddressesAreOpaque(t *testing.T) {
	d := newDir(t, 1, 0)
	blob := []byte{0, 1, 2, 0xff, 0} // a UCX worker address, say
	require.NoError(t, d.Publish(0, string(blob)))
	blob[0] = 42 // the directory holds its own copy
	addr, err := d.Lookup(0)
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 1, 2, 0xff, 0}, []byte(addr))
}

func TestDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 100 * time.Millisecond
		d := newDir(t, 2, delay)
		assert.Equal(t, delay, d.Delay())
		require.NoError(t, d.Publish(0, "a:1"))

		_, err := d.Lookup(0)
		notPublished(t, err, 0, false, true)
		assert.EqualError(t, err, "directory: peer 0 has published an address that is not visible yet")

		time.Sleep(delay - time.Nanosecond)
		_, err = d.Lookup(0)
		notPublished(t, err, 0, false, true)

		time.Sleep(time.Nanosecond)
		addr, err := d.Lookup(0)
		require.NoError(t, err)
		assert.Equal(t, "a:1", addr)
	})
}

// A new address replaces the old one only once it is visible: lookups in
// between still get the old one, as PMIx gets see the last fenced value.
func TestRepublishKeepsOldAddressDuringDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = time.Second
		d := newDir(t, 1, delay)
		require.NoError(t, d.Publish(0, "old"))
		time.Sleep(delay)

		require.NoError(t, d.Publish(0, "new"))
		addr, err := d.Lookup(0)
		require.NoError(t, err)
		assert.Equal(t, "old", addr)

		// A third publication during the second one's delay still keeps
		// the visible one, not the pending one.
		time.Sleep(delay / 2)
		require.NoError(t, d.Publish(0, "newer"))
		addr, _ = d.Lookup(0)
		assert.Equal(t, "old", addr)

		time.Sleep(delay / 2) // "new" would be visible now, but "newer" replaced it
		addr, _ = d.Lookup(0)
		assert.Equal(t, "old", addr)

		time.Sleep(delay / 2)
		addr, _ = d.Lookup(0)
		assert.Equal(t, "newer", addr)
	})
}

func TestUnpublishAndRepublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 50 * time.Millisecond
		d := newDir(t, 3, delay)
		assert.False(t, d.Unpublish(1), "nothing published yet")

		require.NoError(t, d.Publish(1, "first"))
		time.Sleep(delay)
		assert.True(t, d.Unpublish(1))
		assert.False(t, d.Unpublish(1), "already withdrawn")

		_, err := d.Lookup(1)
		notPublished(t, err, 1, true, false)
		assert.EqualError(t, err, "directory: peer 1's address was withdrawn and none is published yet")

		// The restarted peer republishes: the delay applies again, and the
		// dead address does not come back in between.
		require.NoError(t, d.Publish(1, "second"))
		_, err = d.Lookup(1)
		notPublished(t, err, 1, true, true)
		time.Sleep(delay)
		addr, err := d.Lookup(1)
		require.NoError(t, err)
		assert.Equal(t, "second", addr)
	})
}

func TestUnpublishWithdrawsPendingPublication(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDir(t, 1, time.Second)
		require.NoError(t, d.Publish(0, "a"))
		assert.True(t, d.Unpublish(0), "a pending publication counts")
		time.Sleep(2 * time.Second)
		_, err := d.Lookup(0)
		notPublished(t, err, 0, true, false)
	})
}

// TestConcurrent runs publishers, withdrawers and readers of the same peers
// at once, for the race detector; every successful lookup must return an
// address some publisher wrote for that peer.
func TestConcurrent(t *testing.T) {
	const peers, rounds = 8, 2000
	d := newDir(t, peers, 0)
	var wg sync.WaitGroup
	for p := range peers {
		wg.Go(func() {
			for i := range rounds {
				if err := d.Publish(p, fmt.Sprintf("%d/%d", p, i)); err != nil {
					t.Error(err)
					return
				}
				if i%7 == 0 {
					d.Unpublish(p)
				}
			}
		})
		wg.Go(func() {
			for range rounds {
				addr, err := d.Lookup(p)
				var gotPeer, i int
				switch {
				case errors.Is(err, directory.ErrNotPublished):
				case err != nil:
					t.Error(err)
					return
				default:
					if _, err := fmt.Sscanf(addr, "%d/%d", &gotPeer, &i); err != nil || gotPeer != p {
						t.Errorf("Lookup(%d) = %q", p, addr)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

func TestLookupDoesNotAllocate(t *testing.T) {
	d := newDir(t, 2, 0)
	require.NoError(t, d.Publish(1, "127.0.0.1:1"))
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := d.Lookup(1); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}
