package epcache_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Acquire is Get plus a lease: the same value, created once, and until the
// lease's Release no Invalidate releases it; the next Get creates another.
func TestAcquireAndInvalidate(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		c := newCache(t, l, hash, nil)
		a, err := c.Acquire(context.Background(), 1)
		require.NoError(t, err)
		v := a.Value()
		require.NotNil(t, v)
		assert.Equal(t, 1, a.Key())
		got, err := c.Get(context.Background(), 1)
		require.NoError(t, err)
		assert.Same(t, v, got, "Acquire created the value Get finds")
		b, err := c.Acquire(context.Background(), 1)
		require.NoError(t, err)
		assert.Same(t, v, b.Value(), "a hit")

		assert.True(t, c.Invalidate(1), "a leased value is invalidated at once")
		assert.Zero(t, v.released.Load(), "but not released while leased")
		st := c.Stats()
		assert.EqualValues(t, 1, st.Lingering)
		assert.Zero(t, st.Ready)
		fresh, err := c.Get(context.Background(), 1)
		require.NoError(t, err)
		assert.NotSame(t, v, fresh, "the next Get creates another")

		a.Release()
		assert.Zero(t, v.released.Load(), "one lease is left")
		b.Release()
		assert.EqualValues(t, 1, v.released.Load(), "the last lease's Release releases")
		assert.Zero(t, c.Stats().Lingering)
	})
}

// CompareAndInvalidate of a leased value too, and Close: it returns without
// waiting for leases; the values they hold are released by their last
// Release, and a lease never released is visible in Stats.
func TestLeasesAcrossCompareAndInvalidateAndClose(t *testing.T) {
	l := newLedger()
	c, err := epcache.New(epcache.Config[int, *conn]{Create: l.create, Release: l.release})
	require.NoError(t, err)
	a, err := c.Acquire(context.Background(), 1)
	require.NoError(t, err)
	assert.False(t, c.CompareAndInvalidate(1, newConn(0, 0)), "another value")
	assert.True(t, c.CompareAndInvalidate(1, a.Value()))
	assert.Zero(t, a.Value().released.Load())

	b, err := c.Acquire(context.Background(), 2)
	require.NoError(t, err)
	forgotten, err := c.Acquire(context.Background(), 3)
	require.NoError(t, err)
	_, err = c.Get(context.Background(), 4)
	require.NoError(t, err)

	require.NoError(t, c.Close(), "Close does not wait for leases")
	st := c.Stats()
	assert.EqualValues(t, 3, st.Lingering, "three values wait for their leases")
	assert.EqualValues(t, 1, st.Releases, "the unleased one was released")
	_, err = c.Acquire(context.Background(), 2)
	assert.ErrorIs(t, err, epcache.ErrClosed)

	a.Release()
	b.Release()
	st = c.Stats()
	assert.EqualValues(t, 1, st.Lingering, "a forgotten lease stays visible")
	assert.EqualValues(t, 1, st.Live)
	forgotten.Release()
	l.checkClosed(t, c)
	assert.Zero(t, c.Stats().Lingering)
}

// Releasing a lease twice (or its copy), or one that Acquire returned with
// an error, panics with a message that says so, and releases nothing; so
// does the zero Lease's, with a nil dereference.
func TestLeaseMisuse(t *testing.T) {
	l := newLedger()
	c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
		create := cfg.Create
		cfg.Create = func(ctx context.Context, k int) (*conn, error) {
			if k < 0 {
				return nil, errors.New("no such peer")
			}
			return create(ctx, k)
		}
	})
	var zero epcache.Lease[int, *conn]
	assert.Nil(t, zero.Value())
	assert.Panics(t, zero.Release)
	failed, err := c.Acquire(context.Background(), -1)
	require.Error(t, err)
	assert.Nil(t, failed.Value())
	assert.PanicsWithValue(t, "epcache: Release of a Lease that Acquire returned with an error", failed.Release)

	a, err := c.Acquire(context.Background(), 7)
	require.NoError(t, err)
	cp := a
	a.Release()
	assert.PanicsWithValue(t, "epcache: Lease of key 7 released twice", a.Release)
	assert.PanicsWithValue(t, "epcache: Lease of key 7 released twice", cp.Release, "a copy is the same lease")

	// The ticket is handed out again: the stale lease still cannot end it.
	b, err := c.Acquire(context.Background(), 7)
	require.NoError(t, err)
	assert.Panics(t, a.Release)
	require.True(t, c.Invalidate(7))
	assert.Zero(t, b.Value().released.Load(), "b's lease survived the stale Release")
	b.Release()
	assert.EqualValues(t, 1, b.Value().released.Load())
}

// shard.NoMiss, given to Acquire, is a context like any other: the value is
// created and leased (the table keeps its own context for a lease that
// must not miss).
func TestAcquireWithNoMiss(t *testing.T) {
	l := newLedger()
	c := newCache(t, l, nil, nil)
	a, err := c.Acquire(shard.NoMiss, 3)
	require.NoError(t, err)
	assert.Equal(t, 3, a.Value().key)
	a.Release()
}

// A Release that panics when the last lease ends propagates to the lease's
// Release, and the value counts as released once.
func TestLeaseReleasePanics(t *testing.T) {
	l := newLedger()
	var boom atomic.Bool
	c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
		cfg.Release = func(k int, v *conn) {
			l.release(k, v)
			if boom.Load() {
				panic("release failed")
			}
		}
	})
	a, err := c.Acquire(context.Background(), 1)
	require.NoError(t, err)
	require.True(t, c.Invalidate(1))
	boom.Store(true)
	assert.PanicsWithValue(t, "release failed", a.Release)
	boom.Store(false)
	st := c.Stats()
	assert.EqualValues(t, 1, st.Releases)
	assert.EqualValues(t, 1, st.ReleasePanics)
	assert.Zero(t, st.Lingering)

	// So after Close: Close leaves the leased value to its lease, whose
	// Release gets the panic.
	b, err := c.Acquire(context.Background(), 2)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	assert.EqualValues(t, 1, c.Stats().Lingering)
	boom.Store(true)
	assert.PanicsWithValue(t, "release failed", b.Release)
	boom.Store(false)
	st = c.Stats()
	assert.EqualValues(t, 2, st.Releases)
	assert.EqualValues(t, 2, st.ReleasePanics)
	assert.Zero(t, st.Lingering)
	assert.EqualValues(t, 1, b.Value().released.Load())
}

// A lease on a ready key allocates nothing once the value has its lease
// table, and takes no lock (the table's readers never lock; a lease is two
// compare-and-swaps on the slot's own line).
func TestAcquireAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := newLedger()
	c := newCache(t, l, nil, nil)
	ctx := context.Background()
	a, err := c.Acquire(ctx, 1) // makes the value's lease table
	require.NoError(t, err)
	a.Release()
	allocs := testing.AllocsPerRun(1000, func() {
		a, err := c.Acquire(ctx, 1)
		if err != nil {
			panic(err)
		}
		a.Release()
	})
	assert.Zero(t, allocs)
}

// An Acquire that creates the value leases it before it is published: an
// Invalidate racing the creation cannot release it under the Acquire, and
// the Acquire never creates a value nobody sees.
func TestAcquireLeasesWhatItCreates(t *testing.T) {
	eachCreateGoroutine(t, func(t *testing.T, l *ledger, g *gatedCreate, c *epcache.Cache[int, *conn], ctx context.Context, _ bool) {
		got := make(chan epcache.Lease[int, *conn], 1)
		go func() {
			a, err := c.Acquire(ctx, 3)
			if err != nil {
				panic(err)
			}
			got <- a
		}()
		<-g.started
		stop := make(chan struct{})
		invalidated := make(chan int, 1)
		go func() { // invalidates as soon as there is something to invalidate
			n := 0
			for {
				select {
				case <-stop:
					invalidated <- n
					return
				default:
				}
				if c.Invalidate(3) {
					n++
				}
				time.Sleep(time.Microsecond)
			}
		}()
		g.proceed <- nil
		a := <-got
		synctest.Wait()
		close(stop)
		n := <-invalidated
		assert.LessOrEqual(t, n, 1)
		assert.EqualValues(t, 1, l.callsFor(3), "one creation, the one this Acquire returned")
		if n == 0 {
			require.True(t, c.Invalidate(3))
		}
		assert.Zero(t, a.Value().released.Load(), "not released while leased")
		a.Release()
		assert.EqualValues(t, 1, a.Value().released.Load())
	})
}

// An Acquire that leaves on its context, or is answered by Close, before
// its creation ends does not keep the lease its creator took for it.
func TestAcquireLeavingDropsItsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		g := newGated(l)
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) { cfg.Create = g.create })
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.Acquire(ctx, 5)
			errc <- err
		}()
		<-g.started
		cancel()
		assert.ErrorIs(t, <-errc, context.Canceled)
		g.proceed <- nil // the creation finishes for nobody
		synctest.Wait()
		v, ok := c.Load(5)
		require.True(t, ok)
		require.True(t, c.Invalidate(5))
		assert.EqualValues(t, 1, v.released.Load(), "no lease was left behind")
	})
}

// Offer stores a value made elsewhere when the key holds none (or a
// remembered failure) and the cache then owns it; it refuses, leaving the
// value the caller's, when the key holds one or Close has begun.
func TestOffer(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			var failing atomic.Bool
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
				cfg.ErrorTTL = time.Hour
				cfg.Create = func(ctx context.Context, k int) (*conn, error) {
					if failing.Load() {
						return nil, errors.New("refused")
					}
					return l.create(ctx, k)
				}
			})
			mine := l.newConn(1)
			require.True(t, c.Offer(1, mine))
			got, err := c.Get(context.Background(), 1)
			require.NoError(t, err)
			assert.Same(t, mine, got, "the offered value is the key's")
			assert.Zero(t, l.callsFor(1), "no Create")

			other := l.newConn(1)
			assert.False(t, c.Offer(1, other), "the key holds a value")
			l.keepBack(other)

			failing.Store(true)
			_, err = c.Get(context.Background(), 2)
			require.Error(t, err)
			failing.Store(false)
			accepted := l.newConn(2)
			require.True(t, c.Offer(2, accepted), "a remembered failure is no value")
			got, err = c.Get(context.Background(), 2)
			require.NoError(t, err)
			assert.Same(t, accepted, got)

			require.True(t, c.Invalidate(1))
			assert.EqualValues(t, 1, mine.released.Load(), "an offered value is released like a created one")
			st := c.Stats()
			assert.EqualValues(t, 2, st.Offers)
			assert.EqualValues(t, 1, st.Live)

			require.NoError(t, c.Close())
			late := l.newConn(3)
			assert.False(t, c.Offer(3, late), "Close has begun")
			l.keepBack(late)
		})
	})
}

// An Offer while a creation is in flight answers it: every waiting Get, the
// one running Create included, gets the offered value, and the value Create
// returns later is released. Until that Create returns, no second creation
// of the key starts, even if the offered value is invalidated.
func TestOfferAnswersACreationInFlight(t *testing.T) {
	eachCreateGoroutine(t, func(t *testing.T, l *ledger, g *gatedCreate, c *epcache.Cache[int, *conn], ctx context.Context, leavable bool) {
		claimer := goGet(c, ctx, 9)
		<-g.started
		waiter := goGet(c, context.Background(), 9)
		synctest.Wait()

		accepted := l.newConn(9)
		require.True(t, c.Offer(9, accepted))
		assert.Same(t, accepted, (<-waiter).c, "a waiter gets the offered value at once")
		if leavable {
			assert.Same(t, accepted, (<-claimer).c, "so does the Get that started the creation")
		}
		got, ok := c.Load(9)
		require.True(t, ok)
		assert.Same(t, accepted, got)

		// The offered value goes; its successor waits for the
		// first Create to return.
		require.True(t, c.Invalidate(9))
		next := goGet(c, context.Background(), 9)
		synctest.Wait()
		assert.Equal(t, 1, l.callsFor(9), "no second Create while the first runs")

		g.proceed <- nil // the first Create returns a value nobody wants
		if !leavable {
			assert.Same(t, accepted, (<-claimer).c, "the Get running Create got the offered value")
		}
		<-g.started // the successor's creation starts only now
		g.proceed <- nil
		r := <-next
		require.NoError(t, r.err)
		assert.NotSame(t, accepted, r.c)
		synctest.Wait()
		assert.EqualValues(t, 1, l.maxInflightOf(), "the two Creates never overlapped")
		st := c.Stats()
		assert.EqualValues(t, 2, st.Creates)
		assert.EqualValues(t, 1, st.Offers)
		assert.EqualValues(t, 2, st.Releases, "the offered value and the late one")
	})
}

// Offers race with creations, Acquires, Invalidates and each other, on a
// few keys: every value, created or offered, is released exactly once and
// never while leased, and no two Creates of a key overlap (the ledger).
//
// Near the end of the storm Close races the ends of leases, whose Releases
// (of values given up while leased) take a little while: every Release that
// began before Close was called must have returned before Close returned.
// Each Release stamps its start and its end from one sequence, which Close's
// caller stamps just before the call and just after it returns.
func TestLeaseAndOfferStress(t *testing.T) {
	const keys, goroutines = 4, 16
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}
	l := newLedger()
	var releasedLeased atomic.Int32
	var (
		seq              atomic.Int64
		closeCalled      atomic.Int64 // stamps of Close's call and return, when made
		closeReturned    atomic.Int64
		releasesMu       sync.Mutex
		releaseStartEnds [][2]int64
	)
	c, err := epcache.New(epcache.Config[int, *conn]{
		Create: func(ctx context.Context, k int) (*conn, error) {
			if k == 0 {
				time.Sleep(20 * time.Microsecond) // so that Gets wait, and leave
			}
			return l.create(ctx, k)
		},
		Release: func(k int, v *conn) {
			start := seq.Add(1)
			if v.leases.Load() != 0 {
				releasedLeased.Add(1)
			}
			if k%2 == 1 {
				time.Sleep(50 * time.Microsecond) // closing the endpoint takes a while
			}
			l.release(k, v)
			end := seq.Add(1)
			releasesMu.Lock()
			releaseStartEnds = append(releaseStartEnds, [2]int64{start, end})
			releasesMu.Unlock()
		},
	})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				k := (g + i) % keys
				// Half the goroutines pass contexts that end soon: they
				// leave creations (and the leases taken for them) behind.
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if g%2 == 1 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%40)*time.Microsecond)
				}
				switch i % 5 {
				case 0, 1:
					a, err := c.Acquire(ctx, k)
					if errors.Is(err, epcache.ErrClosed) {
						cancel()
						return
					}
					if errors.Is(err, context.DeadlineExceeded) {
						cancel()
						continue
					}
					if !assert.NoError(t, err) { // not require: this is not the test's goroutine
						cancel()
						return
					}
					v := a.Value()
					v.leases.Add(1)
					time.Sleep(time.Duration(i%3) * time.Microsecond)
					v.leases.Add(-1)
					a.Release()
				case 2:
					v := l.newConn(k)
					if !c.Offer(k, v) {
						l.keepBack(v)
					}
				case 3:
					c.Invalidate(k)
				default:
					if v, err := c.Get(ctx, k); err == nil {
						c.CompareAndInvalidate(k, v)
					}
				}
				cancel()
				if g == 0 && i == rounds*9/10 {
					closeCalled.Store(seq.Add(1))
					assert.NoError(t, c.Close()) // near the end of the storm
					closeReturned.Store(seq.Add(1))
				}
			}
		})
	}
	stopWalking := make(chan struct{})
	walked := make(chan int)
	go func() { // Peers walks the table, and the lingering values, throughout
		n := 0
		for {
			select {
			case <-stopWalking:
				walked <- n
				return
			default:
			}
			for range c.Peers() {
				n++
			}
		}
	}()
	wg.Wait()
	close(stopWalking)
	t.Logf("Peers yielded %d peers in its walks", <-walked)
	require.NoError(t, c.Close())
	l.checkClosed(t, c)
	assert.Zero(t, releasedLeased.Load(), "values released while leased")
	assert.Zero(t, c.Stats().Lingering)
	for p := range c.Peers() {
		t.Errorf("closed, every lease released, and Peers still lists %+v", p)
	}
	lingered := 0
	for _, se := range releaseStartEnds {
		if se[0] < closeCalled.Load() && se[1] > closeReturned.Load() {
			lingered++
		}
	}
	assert.Zero(t, lingered, "Releases that began before Close was called and returned after Close did")
}

// An Offer that answers a creation cancels the creation's context, with
// ErrOffered as the cause: Create may stop.
func TestOfferCancelsTheCreationItAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		cause := make(chan error, 1)
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
			cfg.Create = func(ctx context.Context, k int) (*conn, error) {
				<-ctx.Done()
				cause <- context.Cause(ctx)
				return nil, ctx.Err()
			}
		})
		ch := goGet(c, context.Background(), 4)
		synctest.Wait()
		v := l.newConn(4)
		require.True(t, c.Offer(4, v))
		assert.ErrorIs(t, <-cause, epcache.ErrOffered)
		r := <-ch
		require.NoError(t, r.err, "the Get got the offered value, not Create's error")
		assert.Same(t, v, r.c)
	})
}

// A creation its CreateTimeout has answered, whose Create still runs, cannot
// be answered again: Offer returns false and the offered value stays the
// caller's. Once that Create returns (its value released as unwanted), an
// Offer stores its value.
func TestOfferAfterCreateTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		g := newGated(l) // ignores its context
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
			cfg.Create = g.create
			cfg.CreateTimeout = time.Second
		})
		r := goGet(c, context.Background(), 4)
		<-g.started
		time.Sleep(time.Second)
		require.ErrorIs(t, (<-r).err, context.DeadlineExceeded, "answered by the timeout")

		refused := l.newConn(4)
		assert.False(t, c.Offer(4, refused), "the creation was answered; its Create still runs")
		l.keepBack(refused) // the caller's to close (the ledger fails a double release at the end)

		g.proceed <- nil // the stuck Create returns; its value is unwanted
		synctest.Wait()
		accepted := l.newConn(4)
		require.True(t, c.Offer(4, accepted), "nothing in flight any more")
		got, err := c.Get(context.Background(), 4)
		require.NoError(t, err)
		assert.Same(t, accepted, got)
		st := c.Stats()
		assert.EqualValues(t, 1, st.Creates)
		assert.EqualValues(t, 1, st.Releases, "the late value")
		assert.EqualValues(t, 1, st.Offers)
	})
}

// An Offer that looked at a key while its creation ran, and goes on after
// the creation ended (OfferInSteps puts the end between the two): if the
// creation made a value, that value is the key's, and Offer returns false,
// its own value the caller's; if the creation failed, Offer looks again,
// and stores its value.
func TestOfferRacingTheCreationsEnd(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := "the creation made a value"
		if fail {
			name = "the creation failed"
		}
		t.Run(name, func(t *testing.T) {
			eachCreateGoroutine(t, func(t *testing.T, l *ledger, g *gatedCreate, c *epcache.Cache[int, *conn], ctx context.Context, _ bool) {
				claimer := goGet(c, ctx, 5)
				<-g.started
				offered := l.newConn(5)
				rest := epcache.OfferInSteps(c, 5, offered, false) // it sees the creation
				var err error
				if fail {
					err = errors.New("refused")
				}
				g.proceed <- err
				r := <-claimer
				synctest.Wait() // the creation's goroutine, if it has one, is done
				done, ok := rest()
				if !fail {
					require.NoError(t, r.err)
					assert.True(t, done)
					assert.False(t, ok, "the key holds the created value")
					l.keepBack(offered)
					got, _ := c.Load(5)
					assert.Same(t, r.c, got)
					return
				}
				require.Error(t, r.err)
				assert.False(t, done, "the slot changed under it: Offer looks again")
				require.True(t, c.Offer(5, offered), "and finds the key empty")
				got, _ := c.Load(5)
				assert.Same(t, offered, got)
			})
		})
	}
}

// An Offer answers an Acquire's creation as it answers a Get's: the Acquire
// returns a lease of the offered value, which Invalidate removes but does
// not release while the lease is held; the value Create returns later is
// released as unwanted.
func TestOfferAnswersAnAcquire(t *testing.T) {
	eachCreateGoroutine(t, func(t *testing.T, l *ledger, g *gatedCreate, c *epcache.Cache[int, *conn], ctx context.Context, leavable bool) {
		type acquired struct {
			l   epcache.Lease[int, *conn]
			err error
		}
		ch := make(chan acquired, 1)
		go func() {
			a, err := c.Acquire(ctx, 6)
			ch <- acquired{a, err}
		}()
		<-g.started
		offered := l.newConn(6)
		require.True(t, c.Offer(6, offered))
		if !leavable {
			g.proceed <- nil // the Acquire returns once its Create has
		}
		a := <-ch
		require.NoError(t, a.err)
		assert.Same(t, offered, a.l.Value(), "a lease of the offered value")
		require.True(t, c.Invalidate(6))
		assert.Zero(t, offered.released.Load(), "released under a lease")
		a.l.Release()
		assert.EqualValues(t, 1, offered.released.Load(), "released by the lease's end")
		if leavable {
			g.proceed <- nil
		}
		synctest.Wait()
		st := c.Stats()
		assert.EqualValues(t, 1, st.Offers)
		assert.EqualValues(t, 2, st.Releases, "the offered value and Create's late one")
		assert.Zero(t, st.Lingering)
	})
}

// Offer and Close, both ways round (OfferInSteps stops the Offer at its
// slot's gate): an Offer inside the gate when Close begins stores its value,
// and Close waits for it and releases it with the others; an Offer that
// reaches the gate after Close shut it stores nothing, and its value stays
// the caller's.
func TestOfferRacingClose(t *testing.T) {
	t.Run("the Offer inside the gate first", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			c := newCache(t, l, nil, nil)
			_, err := c.Get(context.Background(), 1)
			require.NoError(t, err)
			offered := l.newConn(2)
			rest := epcache.OfferInSteps(c, 2, offered, true)
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			synctest.Wait()
			select {
			case <-closed:
				t.Fatal("Close returned while an Offer was inside a gate")
			default:
			}
			done, ok := rest()
			assert.True(t, done)
			assert.True(t, ok, "inside the gate, the Offer stores its value")
			require.NoError(t, <-closed)
			assert.EqualValues(t, 1, offered.released.Load(), "Close released the offered value")
			assert.EqualValues(t, 1, c.Stats().Offers)
		})
	})
	t.Run("Close shut the gate first", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			c := newCache(t, l, nil, nil)
			offered := l.newConn(2)
			rest := epcache.OfferInSteps(c, 2, offered, false)
			require.NoError(t, c.Close())
			done, ok := rest()
			assert.True(t, done)
			assert.False(t, ok, "Close has begun: the value stays the caller's")
			assert.Zero(t, offered.released.Load())
			assert.Zero(t, c.Stats().Offers)
			l.keepBack(offered)
		})
	})
}

// eachCreateGoroutine runs body twice, in a synctest bubble, over a cache
// whose Create waits for g.proceed: with a context that cannot end, so
// that the caller runs Create, and with one that can (leavable), so that
// Create runs on a goroutine of its own and the caller may leave it.
func eachCreateGoroutine(t *testing.T, body func(t *testing.T, l *ledger, g *gatedCreate, c *epcache.Cache[int, *conn], ctx context.Context, leavable bool)) {
	for _, leavable := range []bool{false, true} {
		name := "caller runs Create"
		if leavable {
			name = "Create on its own goroutine"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newLedger()
				g := newGated(l)
				c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) { cfg.Create = g.create })
				ctx := context.Background()
				if leavable {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					defer cancel()
				}
				body(t, l, g, c, ctx, leavable)
			})
		})
	}
}

// An Offer answers a creation whose Create runs on, the offered value is
// invalidated and the key asked for again, while other goroutines insert
// keys into the same shard so that its array is rebuilt again and again:
// the key's next creation must wait for the first Create to return,
// whatever rebuild comes between the invalidation's steps. The ledger
// counts the Creates of a key in flight at once.
func TestOfferAnsweredCreationsAcrossRebuilds(t *testing.T) {
	rounds := 300
	if testing.Short() {
		rounds = 30
	}
	l := newLedger()
	started, proceed := make(chan struct{}, 2), make(chan struct{})
	c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
		cfg.Shards = 1
		cfg.Create = func(ctx context.Context, k int) (*conn, error) {
			if k != 0 {
				return l.create(ctx, k)
			}
			l.enter(k)
			defer l.leave(k)
			started <- struct{}{}
			<-proceed // ignores ctx, as a dial may
			return l.newConn(k), nil
		}
	})
	bg := context.Background()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			// New keys: each insertion may rebuild the shard, which
			// drops the Empty slots the Invalidates leave behind.
			for i := 1; !stop.Load(); i++ {
				k := g*1_000_000_000 + i
				if _, err := c.Get(bg, k); err != nil {
					panic(err)
				}
				c.Invalidate(k)
			}
		})
	}
	for range rounds {
		ctx, cancel := context.WithCancel(bg) // Create(0) runs on its own goroutine
		first := goGet(c, ctx, 0)
		<-started
		offered := l.newConn(0)
		require.True(t, c.Offer(0, offered))
		require.Same(t, offered, (<-first).c)
		require.True(t, c.Invalidate(0))
		next := goGet(c, bg, 0) // waits for the first Create to return
		proceed <- struct{}{}   // it returns a value nobody wants
		<-started               // only now does the next one start
		proceed <- struct{}{}
		r := <-next
		require.NoError(t, r.err)
		require.True(t, c.Invalidate(0))
		cancel()
		if l.maxInflightOf() > 1 {
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Equal(t, 1, l.maxInflightOf(), "a second Create of key 0 started while the first one ran")
}
