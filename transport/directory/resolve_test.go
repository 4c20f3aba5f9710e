package directory_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resolved is the outcome of a Resolve running on a goroutine of its own,
// and the bubble's time when it returned.
type resolved struct {
	addr string
	err  error
	at   time.Time
}

// resolveAsync starts Resolve(ctx, peer) on a goroutine and returns where
// its outcome arrives.
func resolveAsync(ctx context.Context, d directory.Resolver, peer int) <-chan resolved {
	out := make(chan resolved, 1)
	go func() {
		addr, err := d.Resolve(ctx, peer)
		out <- resolved{addr, err, time.Now()}
	}()
	return out
}

// notYet asserts that the Resolve whose outcome arrives on out is still
// waiting, once every goroutine of the bubble has blocked.
func notYet(t *testing.T, out <-chan resolved) {
	t.Helper()
	synctest.Wait()
	select {
	case r := <-out:
		t.Fatalf("Resolve returned (%q, %v) before the address was visible", r.addr, r.err)
	default:
	}
}

func TestResolveVisibleAddress(t *testing.T) {
	d := newDir(t, 2, 0)
	require.NoError(t, d.Publish(1, "a:1"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // an address already visible needs no time
	addr, err := d.Resolve(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, "a:1", addr)
}

func TestResolveUnknownPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDir(t, 2, 0)
		for _, peer := range []int{-1, 2} {
			_, err := d.Resolve(context.Background(), peer) // at once: a context that never ends
			require.ErrorIs(t, err, directory.ErrUnknownPeer, "peer %d", peer)
			assert.NotErrorIs(t, err, directory.ErrNotPublished)
		}
	})
}

// A Resolve for a peer that has not published waits for its Publish, and
// returns at that instant, not at the next tick of some poll.
func TestResolveWaitsForPublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDir(t, 3, 0)
		start := time.Now()
		out := resolveAsync(context.Background(), d, 1)
		other := resolveAsync(context.Background(), d, 2)
		time.Sleep(37 * time.Millisecond)
		notYet(t, out)
		require.NoError(t, d.Publish(0, "not-the-one")) // another peer's publication wakes nobody for good
		notYet(t, out)
		require.NoError(t, d.Publish(1, "b:1"))
		r := <-out
		require.NoError(t, r.err)
		assert.Equal(t, "b:1", r.addr)
		assert.Equal(t, 37*time.Millisecond, r.at.Sub(start), "returned at the Publish")
		notYet(t, other)
		require.NoError(t, d.Publish(2, "c:1"))
		assert.Equal(t, "c:1", (<-other).addr)
	})
}

// With a publication delay, Resolve returns when the address becomes
// visible: exactly Delay after the Publish.
func TestResolveWaitsOutTheDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 100 * time.Millisecond
		d := newDir(t, 2, delay)
		out := resolveAsync(context.Background(), d, 1)
		time.Sleep(10 * time.Millisecond)
		published := time.Now()
		require.NoError(t, d.Publish(1, "b:1"))
		notYet(t, out)
		r := <-out
		require.NoError(t, r.err)
		assert.Equal(t, "b:1", r.addr)
		assert.Equal(t, delay, r.at.Sub(published), "returned as the address became visible")

		// Already published, not visible yet: the timer alone wakes it.
		require.NoError(t, d.Publish(0, "a:1"))
		time.Sleep(delay / 4)
		began := time.Now()
		r = <-resolveAsync(context.Background(), d, 0)
		require.NoError(t, r.err)
		assert.Equal(t, 3*delay/4, r.at.Sub(began))
	})
}

// A republication keeps the old address visible during its delay:
// Resolve returns the old one at once, as Lookup does.
func TestResolveDuringRepublication(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDir(t, 1, time.Second)
		require.NoError(t, d.Publish(0, "old"))
		time.Sleep(time.Second)
		require.NoError(t, d.Publish(0, "new"))
		addr, err := d.Resolve(context.Background(), 0)
		require.NoError(t, err)
		assert.Equal(t, "old", addr)
	})
}

// A withdrawn peer is waited for until it publishes again; the withdrawal
// itself does not end the wait.
func TestResolveWithdrawnPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 50 * time.Millisecond
		d := newDir(t, 2, delay)
		require.NoError(t, d.Publish(1, "first"))
		time.Sleep(delay)
		require.True(t, d.Unpublish(1))
		out := resolveAsync(context.Background(), d, 1)
		notYet(t, out)
		d.Unpublish(1)
		time.Sleep(time.Hour)
		notYet(t, out)
		require.NoError(t, d.Publish(1, "second"))
		r := <-out
		require.NoError(t, r.err)
		assert.Equal(t, "second", r.addr)

		// A publication withdrawn during its delay never becomes visible.
		require.NoError(t, d.Publish(0, "doomed"))
		out = resolveAsync(context.Background(), d, 0)
		time.Sleep(delay / 2)
		require.True(t, d.Unpublish(0))
		time.Sleep(time.Hour)
		notYet(t, out)
		require.NoError(t, d.Publish(0, "later"))
		assert.Equal(t, "later", (<-out).addr)
	})
}

// When its context ends first, Resolve returns an error that wraps
// ctx.Err() and names the peer, and leaves nothing behind.
func TestResolveContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDir(t, 2, time.Hour)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		began := time.Now()
		_, err := d.Resolve(ctx, 1)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, time.Minute, time.Since(began))
		assert.EqualError(t, err, "directory: peer 1 has not published an address yet: context deadline exceeded")
		var np *directory.NotPublishedError
		require.ErrorAs(t, err, &np)
		assert.Equal(t, 1, np.Peer)

		require.NoError(t, d.Publish(1, "b:1")) // visible in an hour
		ctx, cancel = context.WithCancel(context.Background())
		out := resolveAsync(ctx, d, 1)
		notYet(t, out)
		cancel()
		r := <-out
		require.ErrorIs(t, r.err, context.Canceled)
		assert.True(t, errors.Is(r.err, directory.ErrNotPublished))
		assert.EqualError(t, r.err, "directory: peer 1 has published an address that is not visible yet: context canceled")
	})
}

// Many Resolves of the same peers, from many goroutines, all wake on the
// one Publish each.
func TestResolveManyWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const peers, waiters = 4, 8
		d := newDir(t, peers, 0)
		outs := make([][]<-chan resolved, peers)
		for p := range peers {
			for range waiters {
				outs[p] = append(outs[p], resolveAsync(context.Background(), d, p))
			}
		}
		synctest.Wait()
		for p := range peers {
			require.NoError(t, d.Publish(p, string(rune('a'+p))))
			for _, out := range outs[p] {
				r := <-out
				require.NoError(t, r.err)
				assert.Equal(t, string(rune('a'+p)), r.addr)
			}
		}
	})
}

// Unreachable has nothing to drop: the directory holds the truth, and the
// next Resolve returns the same address.
func TestUnreachableKeepsTheAddress(t *testing.T) {
	d := newDir(t, 2, 0)
	require.NoError(t, d.Publish(1, "b:1"))
	d.Unreachable(1, "b:1")
	d.Unreachable(1, "elsewhere")
	d.Unreachable(7, "x") // an unknown peer: nothing to do either
	addr, err := d.Resolve(context.Background(), 1)
	require.NoError(t, err)
	assert.Equal(t, "b:1", addr)
}

// A Publish with no Resolve waiting takes no lock and allocates nothing
// beyond its entry; Resolve of a visible address allocates nothing.
func TestResolveVisibleDoesNotAllocate(t *testing.T) {
	d := newDir(t, 2, 0)
	require.NoError(t, d.Publish(1, "127.0.0.1:1"))
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := d.Resolve(ctx, 1); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}
