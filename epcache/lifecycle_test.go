package epcache_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// meter counts the values alive as a user sees them: from the start of
// their Create (or the return of a successful Offer) to the return of
// their Release, and the most ever alive at once. The cache counts each
// over a longer span (from before Create starts, from inside Offer), so the
// meter's peak may never exceed MaxEntries.
type meter struct {
	live, peak atomic.Int64
}

func (m *meter) add() {
	n := m.live.Add(1)
	for {
		p := m.peak.Load()
		if n <= p || m.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (m *meter) done() { m.live.Add(-1) }

// metered returns a ledger's Create and Release, counted by m.
func metered(l *ledger, m *meter) (func(context.Context, int) (*conn, error), func(int, *conn)) {
	create := func(ctx context.Context, k int) (*conn, error) {
		m.add()
		return l.create(ctx, k)
	}
	release := func(k int, v *conn) {
		l.release(k, v)
		m.done()
	}
	return create, release
}

func TestNewRejectsNegativeLifecycleFields(t *testing.T) {
	create := func(context.Context, int) (int, error) { return 0, nil }
	_, err := epcache.New(epcache.Config[int, int]{Create: create, IdleTimeout: -time.Second})
	require.ErrorContains(t, err, "Config.IdleTimeout is -1s")
	_, err = epcache.New(epcache.Config[int, int]{Create: create, MaxEntries: -1})
	require.ErrorContains(t, err, "Config.MaxEntries is -1")
}

// A value unused for IdleTimeout is removed between IdleTimeout and 5/4
// IdleTimeout after its last use; one used more often stays; and once the
// cache holds nothing, no sweep is scheduled.
func TestIdleTimeoutRemovesUnusedValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idle = time.Minute
		l := newLedger()
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) { cfg.IdleTimeout = idle })
		ctx := context.Background()
		start := time.Now()
		v1, err := c.Get(ctx, 1)
		require.NoError(t, err)
		_, err = c.Get(ctx, 2)
		require.NoError(t, err)
		require.True(t, epcache.SweepArmed(c))

		// Key 2 is used every half IdleTimeout; key 1 never again.
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 10 {
				time.Sleep(idle / 2)
				if _, err := c.Get(ctx, 2); err != nil {
					t.Error(err)
				}
			}
		}()
		time.Sleep(idle - time.Nanosecond)
		synctest.Wait()
		_, ok := c.Load(1) // a Load is not a use
		assert.True(t, ok, "removed before IdleTimeout")
		time.Sleep(idle/4 + 2*time.Nanosecond)
		synctest.Wait()
		_, ok = c.Load(1)
		assert.False(t, ok, "still there %v after its last use", time.Since(start))
		assert.Equal(t, int32(1), v1.released.Load())
		assert.Equal(t, uint64(1), c.Stats().IdleRemovals)

		<-done
		_, ok = c.Load(2)
		assert.True(t, ok, "a value used every IdleTimeout/2 was removed")
		// Unused from now on: removed, and then nothing is scheduled.
		time.Sleep(idle * 5 / 4)
		synctest.Wait()
		assert.Zero(t, c.Len())
		assert.Equal(t, uint64(2), c.Stats().IdleRemovals)
		assert.False(t, epcache.SweepArmed(c), "a sweep is scheduled for an empty cache")

		// A new value arms the sweeps again.
		_, err = c.Get(ctx, 3)
		require.NoError(t, err)
		assert.True(t, epcache.SweepArmed(c))
	})
}

// A leased value is never idle: it is removed IdleTimeout (to 5/4 of it)
// after its last lease ends, however long that lease was held.
func TestIdleTimeoutNeverRemovesALeasedValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idle = time.Minute
		l := newLedger()
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) { cfg.IdleTimeout = idle })
		a, err := c.Acquire(context.Background(), 1)
		require.NoError(t, err)
		time.Sleep(10*idle + time.Second)
		synctest.Wait()
		assert.Zero(t, a.Value().released.Load(), "released while leased")
		assert.Zero(t, c.Stats().IdleRemovals)
		a.Release()
		end := time.Now()
		time.Sleep(idle - time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, 1, c.Len(), "removed sooner than IdleTimeout after its lease ended")
		time.Sleep(idle/4 + 2*time.Nanosecond)
		synctest.Wait()
		assert.Zero(t, c.Len(), "still there %v after its lease ended", time.Since(end))
		assert.Equal(t, int32(1), a.Value().released.Load())
	})
}

// A Get that needs room in a full cache evicts an unleased value, whose
// Release returns before the new Create starts.
func TestMaxEntriesEvictsAnUnleasedValue(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		var m meter
		create, release := metered(l, &m)
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.MaxEntries, cfg.Create, cfg.Release = 2, create, release
		})
		ctx := context.Background()
		for k := range 10 {
			_, err := c.Get(ctx, k)
			require.NoError(t, err)
			assert.LessOrEqual(t, m.peak.Load(), int64(2))
		}
		st := c.Stats()
		assert.Equal(t, uint64(8), st.Evictions)
		assert.Equal(t, uint64(8), st.Releases)
		assert.Equal(t, int64(2), st.Room)
		assert.Equal(t, 2, c.Len())
		assert.Equal(t, int64(2), m.peak.Load())
	})
}

// When every value is leased, a Get that needs room waits for it, and
// leaves on its context with an error that wraps the context's and says
// why; when a lease ends, its value is evicted for the waiter.
func TestMaxEntriesWaitsWhileEverythingIsLeased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) { cfg.MaxEntries = 2 })
		bg := context.Background()
		a1, err := c.Acquire(bg, 1)
		require.NoError(t, err)
		a2, err := c.Acquire(bg, 2)
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		_, err = c.Get(ctx, 3)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "MaxEntries 2")
		assert.Equal(t, uint64(1), c.Stats().RoomWaits)
		assert.Zero(t, l.callsFor(3))

		var got atomic.Pointer[conn]
		go func() {
			v, err := c.Get(bg, 3)
			assert.NoError(t, err)
			got.Store(v)
		}()
		synctest.Wait()
		assert.Nil(t, got.Load(), "a Get found room in a cache full of leased values")
		a1.Release()
		synctest.Wait()
		require.NotNil(t, got.Load())
		assert.Equal(t, int32(1), a1.Value().released.Load(), "the value whose lease ended was not evicted")
		assert.Zero(t, a2.Value().released.Load(), "a leased value was evicted")
		assert.Equal(t, uint64(1), c.Stats().Evictions)
		a2.Release()
	})
}

// Waiters for room are served in the order they came: each Acquire below
// waits, and each lease's end makes room for the next.
func TestRoomWaitersAreServedInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		var mu sync.Mutex
		var order []int
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
			cfg.MaxEntries = 1
			cfg.Create = func(ctx context.Context, k int) (*conn, error) {
				mu.Lock()
				order = append(order, k)
				mu.Unlock()
				return l.create(ctx, k)
			}
		})
		bg := context.Background()
		first, err := c.Acquire(bg, 0)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for k := 1; k <= 5; k++ {
			wg.Go(func() {
				a, err := c.Acquire(bg, k)
				if assert.NoError(t, err) {
					a.Release()
				}
			})
			synctest.Wait() // k is in line before k+1 comes
		}
		first.Release()
		wg.Wait()
		assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, order)
		assert.Equal(t, uint64(5), c.Stats().RoomWaits)
		assert.Equal(t, uint64(5), c.Stats().Evictions)
	})
}

// A claimer that leaves while it waits for room hands its claim to the
// Gets waiting on it: one of them claims the key anew and creates it.
func TestClaimerLeavingTheRoomWaitHandsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) { cfg.MaxEntries = 1 })
		bg := context.Background()
		held, err := c.Acquire(bg, 0)
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(bg)
		claimerErr := make(chan error, 1)
		go func() {
			_, err := c.Get(ctx, 1)
			claimerErr <- err
		}()
		synctest.Wait()
		var got atomic.Pointer[conn]
		go func() {
			v, err := c.Get(bg, 1)
			assert.NoError(t, err)
			got.Store(v)
		}()
		synctest.Wait()
		cancel()
		err = <-claimerErr
		require.ErrorIs(t, err, context.Canceled)
		assert.True(t, strings.Contains(err.Error(), "no room"), err.Error())
		synctest.Wait()
		assert.Nil(t, got.Load(), "the waiter got a value with the cache full")
		held.Release()
		synctest.Wait()
		require.NotNil(t, got.Load())
		assert.Equal(t, 1, l.callsFor(1))
		assert.Equal(t, int64(1), c.Stats().Room)
	})
}

// An Offer takes room only if there is some: a full cache refuses it, and
// the value stays the caller's.
func TestOfferUnderMaxEntries(t *testing.T) {
	l := newLedger()
	c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) { cfg.MaxEntries = 1 })
	require.True(t, c.Offer(1, l.newConn(1)))
	v := l.newConn(2)
	require.False(t, c.Offer(2, v), "a full cache took an offered value")
	l.keepBack(v)
	assert.Equal(t, int64(1), c.Stats().Room)
	// A value refused for a key that holds one does not leak its room.
	w := l.newConn(1)
	require.True(t, c.Invalidate(1))
	require.True(t, c.Offer(1, w))
	x := l.newConn(1)
	require.False(t, c.Offer(1, x))
	l.keepBack(x)
	assert.Equal(t, int64(1), c.Stats().Room)
}

// Values that left the cache but wait for their last lease count against
// MaxEntries until their Release returns.
func TestLingeringValuesCountAgainstMaxEntries(t *testing.T) {
	l := newLedger()
	c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) { cfg.MaxEntries = 1 })
	bg := context.Background()
	a, err := c.Acquire(bg, 1)
	require.NoError(t, err)
	require.True(t, c.Invalidate(1))
	assert.Equal(t, int64(1), c.Stats().Room)
	ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	_, err = c.Get(ctx, 2)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	a.Release()
	assert.Equal(t, int64(0), c.Stats().Room)
	_, err = c.Get(bg, 2)
	require.NoError(t, err)
}

// Close wakes the Gets waiting for room; their room is never taken.
func TestCloseWakesRoomWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		c, err := epcache.New(epcache.Config[int, *conn]{Create: l.create, Release: l.release, MaxEntries: 1})
		require.NoError(t, err)
		bg := context.Background()
		a, err := c.Acquire(bg, 0)
		require.NoError(t, err)
		errs := make(chan error, 3)
		for k := 1; k <= 3; k++ {
			go func() {
				_, err := c.Get(bg, k)
				errs <- err
			}()
		}
		synctest.Wait()
		require.NoError(t, c.Close())
		for range 3 {
			require.ErrorIs(t, <-errs, epcache.ErrClosed)
		}
		assert.Equal(t, int64(1), c.Stats().Room, "the leased value still counts")
		a.Release()
		assert.Zero(t, c.Stats().Room)
		l.checkClosed(t, c)
	})
}

// With either option set, or both, a hit allocates nothing: Get, Load,
// and Acquire with its Release. Nor does an idle sweep, or the first hit on
// a value it aged (the slow path that makes the value young again).
func TestLifecycleHitAllocatesNothing(t *testing.T) {
	for _, o := range []struct {
		name       string
		maxEntries int
		idle       time.Duration
	}{
		{"MaxEntries", 100, 0},
		{"IdleTimeout", 0, time.Hour},
		{"both", 100, time.Hour},
	} {
		t.Run(o.name, func(t *testing.T) {
			l := newLedger()
			c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
				cfg.MaxEntries, cfg.IdleTimeout = o.maxEntries, o.idle
			})
			ctx := context.Background()
			_, err := c.Get(ctx, 1)
			require.NoError(t, err)
			_, err = c.Get(ctx, 1) // with MaxEntries, the hit that ends the value's probation
			require.NoError(t, err)
			assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.Get(ctx, 1) }), "Get")
			assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.Load(1) }), "Load")
			assert.Zero(t, testing.AllocsPerRun(100, func() {
				a, _ := c.Acquire(ctx, 1)
				a.Release()
			}), "Acquire and Release")
			if o.idle > 0 {
				assert.Zero(t, testing.AllocsPerRun(100, func() {
					epcache.SweepNow(c)
					_, _ = c.Get(ctx, 1)
				}), "a sweep and the hit on the value it aged")
			}
		})
	}
}

// Many goroutines get, acquire, offer and invalidate keys under a cap far
// below the keys in use, with an idle timeout that keeps removing values
// and contexts that end: the cap holds at every instant, no value is
// released while leased, every value is released exactly once, and all
// the room comes back.
//
// It runs two storms on one cache. After the first, once every goroutine
// has returned, no value the cache released may still be reachable from it
// (the test holds none: the ledger keeps records, not values). The second
// goes on past its rounds until the cache has evicted, waited for room and
// removed an idle value at least once each, so that it tests all three
// however the machine's speed divides the work between eviction and the
// idle timeout; goroutine 0 then closes the cache while the others go on.
func TestLifecycleStress(t *testing.T) {
	const keys, goroutines, maxEntries = 24, 16, 5
	rounds := 1500
	if testing.Short() {
		rounds = 200
	}
	l := newLedger()
	var m meter
	var releasedLeased atomic.Int32
	c, err := epcache.New(epcache.Config[int, *conn]{
		Create: func(ctx context.Context, k int) (*conn, error) {
			m.add()
			if k%3 == 0 {
				time.Sleep(10 * time.Microsecond)
			}
			if k%7 == 0 && k > 0 {
				m.done()
				return nil, errors.New("refused")
			}
			v, err := l.create(ctx, k)
			if v != nil {
				v.metered.Store(true) // counted since Create began
			}
			return v, err
		},
		Release: func(k int, v *conn) {
			if v.leases.Load() != 0 {
				releasedLeased.Add(1)
			}
			// An offered value released before its Offer returned is
			// counted here, so that it never counts negatively.
			if v.metered.CompareAndSwap(false, true) {
				m.add()
			}
			l.release(k, v)
			m.done()
		},
		MaxEntries:  maxEntries,
		IdleTimeout: 200 * time.Microsecond,
	})
	require.NoError(t, err)
	start := time.Now()
	var closed atomic.Bool
	exercised := func() bool {
		st := c.Stats()
		return st.Evictions > 0 && st.RoomWaits > 0 && st.IdleRemovals > 0
	}
	// storm runs the goroutines for rounds each; with closing, on until
	// goroutine 0 has closed the cache, which it does once the cache has
	// been exercised (or after hang, for the assertions below to fail).
	storm := func(rounds int, closing bool) {
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				closeAt := -1 // goroutine 0's round that closed the cache
				for i := 0; i < rounds || closing && (!closed.Load() || g == 0 && i < closeAt+rounds/10); i++ {
					k := (g*7 + i*i) % keys
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if g%2 == 1 {
						ctx, cancel = context.WithTimeout(ctx, time.Duration(i%50)*time.Microsecond)
					}
					switch i % 6 {
					case 0, 1, 2:
						a, err := c.Acquire(ctx, k)
						if err != nil {
							cancel()
							if errors.Is(err, epcache.ErrClosed) {
								return
							}
							continue
						}
						v := a.Value()
						v.leases.Add(1)
						time.Sleep(time.Duration(i%3) * time.Microsecond)
						v.leases.Add(-1)
						a.Release()
					case 3:
						// An offered value is counted once Offer returns
						// true (or its Release begins, if sooner): from the
						// moment Offer stores it until then, it is alive and
						// not counted, so the peak may be under-counted by
						// the offers that are at that point. Counting it
						// before the call instead would count the refused
						// offers too, and fail a cache that is right.
						v := l.newConn(k)
						if c.Offer(k, v) {
							if v.metered.CompareAndSwap(false, true) {
								m.add()
							}
						} else {
							l.keepBack(v)
						}
					case 4:
						c.Invalidate(k)
					default:
						_, _ = c.Get(ctx, k)
					}
					cancel()
					if closing && g == 0 && closeAt < 0 && i >= rounds*9/10 && (exercised() || time.Since(start) > hang) {
						closeAt = i
						assert.NoError(t, c.Close()) // not require: this is not the test's goroutine
						closed.Store(true)
					}
				}
			})
		}
		wg.Wait()
	}

	storm(rounds/2, false)
	// Idle removals and evictions release on goroutines of their own: wait
	// until every value given up has been released.
	for deadline := time.Now().Add(hang); ; time.Sleep(time.Millisecond) {
		if st := c.Stats(); int64(st.Creates+st.Offers-st.Releases) == st.Ready+st.Lingering {
			break
		}
		require.True(t, time.Now().Before(deadline), "values given up and never released: %+v", c.Stats())
	}
	// A released value may still be on the stack of the goroutine that
	// released it, about to return, for a moment after the counts above
	// agree: what the cache holds stays, and a hang is what this waits
	// for.
	held := l.reachable()
	for deadline := time.Now().Add(hang); held != 0 && time.Now().Before(deadline); held = l.reachable() {
		time.Sleep(10 * time.Millisecond)
	}
	assert.Zero(t, held, "released values the cache still holds")

	storm(rounds, true)
	require.NoError(t, c.Close())
	l.checkClosed(t, c)
	st := c.Stats()
	t.Logf("stats: %+v, peak alive %d", st, m.peak.Load())
	assert.LessOrEqual(t, m.peak.Load(), int64(maxEntries), "values alive plus creations exceeded MaxEntries")
	assert.Zero(t, releasedLeased.Load(), "values released while leased")
	assert.Zero(t, st.Room)
	assert.Zero(t, m.live.Load())
	assert.NotZero(t, st.Evictions)
	assert.NotZero(t, st.RoomWaits)
	assert.NotZero(t, st.IdleRemovals)
}
