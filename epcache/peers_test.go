package epcache_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Peers reports each key in the state the test put it in: a ready value
// (with its leases, its publication and how long it has been idle), a
// creation with the callers waiting for it, a remembered failure with its
// error and expiry, a straggler, and a lingering value that a lease holds
// after Invalidate, the last gone once its lease ends. It yields each key
// once, and nothing for a key that holds nothing.
func TestPeersReportsEachState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idle = time.Minute
		errDown := errors.New("peer down")
		proceed := make(chan struct{})
		c, err := epcache.New(epcache.Config[int, *conn]{
			MaxEntries:  10,
			IdleTimeout: idle,
			ErrorTTL:    time.Hour,
			Create: func(_ context.Context, k int) (*conn, error) {
				switch k {
				case 2, 5:
					<-proceed
				case 3:
					return nil, errDown
				}
				return newConn(k, 0), nil
			},
		})
		require.NoError(t, err)
		defer c.Close()
		bg := context.Background()
		start := time.Now()

		_, err = c.Get(bg, 1) // ready
		require.NoError(t, err)
		lease1, err := c.Acquire(bg, 1)
		require.NoError(t, err)
		cctx, cancel := context.WithCancel(bg)
		defer cancel()
		creating := goGet(c, cctx, 2) // creating, and two more wait
		synctest.Wait()
		waiters := []<-chan result{goGet(c, bg, 2), goGet(c, bg, 2)}
		_, err = c.Get(bg, 3) // failed
		require.ErrorIs(t, err, errDown)
		lease4, err := c.Acquire(bg, 4) // lingering, after Invalidate
		require.NoError(t, err)
		require.True(t, c.Invalidate(4))
		straggling := goGet(c, cctx, 5) // answered by an Offer, then invalidated
		synctest.Wait()
		require.True(t, c.Offer(5, newConn(5, 1)))
		require.NoError(t, (<-straggling).err)
		require.True(t, c.Invalidate(5))
		synctest.Wait()
		time.Sleep(idle/2 + time.Second) // two sweeps: key 1, leased, stays young
		synctest.Wait()

		peers := map[int]epcache.Peer[int]{}
		for p := range c.Peers() {
			_, twice := peers[p.Key]
			require.False(t, twice, "key %d yielded twice", p.Key)
			peers[p.Key] = p
		}
		require.Len(t, peers, 5, "%v", peers)
		assert.Equal(t, epcache.PeerReady, peers[1].State)
		assert.Equal(t, 1, peers[1].Leases)
		assert.Equal(t, start, peers[1].Since, "published at the start (MaxEntries keeps it)")
		assert.Zero(t, peers[1].Idle, "leased: never idle")
		assert.Equal(t, epcache.PeerCreating, peers[2].State)
		assert.Equal(t, 3, peers[2].Waiting, "the Get that started it and two more")
		assert.Equal(t, start, peers[2].Since)
		assert.Equal(t, epcache.PeerFailed, peers[3].State)
		assert.ErrorIs(t, peers[3].Err, errDown)
		assert.Equal(t, start.Add(time.Hour), peers[3].Until)
		assert.Equal(t, epcache.PeerLingering, peers[4].State)
		assert.Equal(t, 1, peers[4].Leases)
		assert.Equal(t, epcache.PeerStraggling, peers[5].State)
		// Peer reports each key's entry as Peers does, but a lingering
		// value given up (key 4) and a key never asked for.
		for k, want := range peers {
			got, ok := c.Peer(k)
			if want.State == epcache.PeerLingering {
				assert.False(t, ok, "Peer(%d) reported a lingering value: %+v", k, got)
				continue
			}
			assert.True(t, ok, "Peer(%d)", k)
			assert.Equal(t, want, got, "Peer(%d)", k)
		}
		_, ok := c.Peer(6)
		assert.False(t, ok, "Peer of a key never asked for")

		// The lease's end releases key 4: it lingers no more. Unused,
		// key 1's value goes idle.
		lease4.Release()
		lease1.Release()
		time.Sleep(idle / 2)
		synctest.Wait()
		peers = map[int]epcache.Peer[int]{}
		for p := range c.Peers() {
			peers[p.Key] = p
		}
		assert.NotContains(t, peers, 4)
		assert.Equal(t, epcache.PeerReady, peers[1].State)
		assert.Positive(t, peers[1].Idle, "unused through sweeps: idle")
		assert.Equal(t, "lingering", epcache.PeerLingering.String())

		close(proceed)
		require.NoError(t, (<-creating).err)
		for _, w := range waiters {
			require.NoError(t, (<-w).err)
		}
		require.NoError(t, c.Close())
		_, ok = c.Peer(1)
		assert.False(t, ok, "Peer after Close")
	})
}
