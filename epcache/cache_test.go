package epcache_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewRejectsBadConfig(t *testing.T) {
	create := func(context.Context, int) (int, error) { return 0, nil }
	for _, tc := range []struct {
		name  string
		cfg   epcache.Config[int, int]
		field string
	}{
		{"nil Create", epcache.Config[int, int]{}, "Config.Create is nil"},
		{"negative Shards", epcache.Config[int, int]{Create: create, Shards: -1}, "Config.Shards is -1"},
		{"huge Shards", epcache.Config[int, int]{Create: create, Shards: 1 << 20}, "Config.Shards is 1048576"},
		{"negative CreateTimeout", epcache.Config[int, int]{Create: create, CreateTimeout: -time.Second}, "Config.CreateTimeout is -1s"},
		{"negative ErrorTTL", epcache.Config[int, int]{Create: create, ErrorTTL: -time.Millisecond}, "Config.ErrorTTL is -1ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := epcache.New(tc.cfg)
			require.Error(t, err)
			assert.Nil(t, c)
			assert.Contains(t, err.Error(), tc.field)
			assert.Contains(t, err.Error(), "epcache: ")
		})
	}
}

// gatedCreate returns a Create that, for every call, announces itself on
// started and then waits for a value (or error) on proceed.
type gatedCreate struct {
	l       *ledger
	started chan int
	proceed chan error
}

func newGated(l *ledger) *gatedCreate {
	return &gatedCreate{l: l, started: make(chan int, 100), proceed: make(chan error)}
}

func (g *gatedCreate) create(_ context.Context, key int) (*conn, error) {
	g.l.enter(key)
	defer g.l.leave(key)
	g.started <- key
	if err := <-g.proceed; err != nil {
		return nil, err
	}
	return g.l.newConn(key), nil
}

type result struct {
	c   *conn
	err error
}

func goGet(c *epcache.Cache[int, *conn], ctx context.Context, key int) <-chan result {
	ch := make(chan result, 1)
	go func() {
		v, err := c.Get(ctx, key)
		ch <- result{v, err}
	}()
	return ch
}

func TestExactlyOnceCreate(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) { cfg.Create = g.create })
			const callers = 50
			var results []<-chan result
			for range callers {
				results = append(results, goGet(c, context.Background(), 7))
			}
			// Other keys proceed while key 7's creation is blocked.
			results = append(results, goGet(c, context.Background(), 8))
			synctest.Wait()
			assert.Len(t, g.started, 2, "one Create per key, whatever the number of callers")
			g.proceed <- nil
			g.proceed <- nil
			var first *conn
			for i, ch := range results[:callers] {
				r := <-ch
				require.NoError(t, r.err)
				if i == 0 {
					first = r.c
				}
				assert.Same(t, first, r.c, "every caller gets the one value")
			}
			r8 := <-results[callers]
			require.NoError(t, r8.err)
			assert.Equal(t, 8, r8.c.key)
			assert.Equal(t, 1, l.callsFor(7))
			st := c.Stats()
			assert.EqualValues(t, 2, st.Creates)
			assert.EqualValues(t, callers-1, st.Waits, "all but the caller that started the creation waited")
			// A hit returns the same value without another Create.
			v, err := c.Get(context.Background(), 7)
			require.NoError(t, err)
			assert.Same(t, first, v)
			assert.Equal(t, 1, l.callsFor(7))
		})
	})
}

func TestZeroValueIsStored(t *testing.T) {
	calls := 0
	c, err := epcache.New(epcache.Config[string, *int]{
		Create: func(context.Context, string) (*int, error) { calls++; return nil, nil },
	})
	require.NoError(t, err)
	defer c.Close()
	for range 3 {
		v, err := c.Get(context.Background(), "peer")
		require.NoError(t, err)
		assert.Nil(t, v)
	}
	assert.Equal(t, 1, calls)
	v, ok := c.Load("peer")
	assert.True(t, ok, "a nil value returned with a nil error is a value")
	assert.Nil(t, v)
	assert.Equal(t, 1, c.Len())
}

func TestEachCallerLeavesOnItsOwnContext(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) { cfg.Create = g.create })
			starterCtx, cancelStarter := context.WithCancel(context.Background())
			waiterCtx, cancelWaiter := context.WithCancel(context.Background())
			defer cancelWaiter()
			starter := goGet(c, starterCtx, 1)
			synctest.Wait()
			require.Len(t, g.started, 1)
			waiter := goGet(c, waiterCtx, 1)
			patient := goGet(c, context.Background(), 1)
			synctest.Wait()

			start := time.Now()
			cancelStarter()
			synctest.Wait() // every goroutine that can run has run; the fake clock has not moved
			select {
			case r := <-starter:
				assert.Same(t, context.Canceled, r.err, "ctx.Err() itself, unwrapped")
				assert.Zero(t, time.Since(start), "left at once, without waiting for the creation")
			default:
				t.Fatal("the caller that started the creation did not leave when its context ended")
			}
			cancelWaiter()
			synctest.Wait()
			r := <-waiter
			assert.ErrorIs(t, r.err, context.Canceled)

			// The creation went on for the patient caller.
			g.proceed <- nil
			p := <-patient
			require.NoError(t, p.err)
			assert.Equal(t, 1, p.c.key)
			assert.Equal(t, 1, l.callsFor(1))
			assert.EqualValues(t, 2, c.Stats().Cancels)
			// The value stays cached for later callers.
			v, ok := c.Load(1)
			assert.True(t, ok)
			assert.Same(t, p.c, v)
		})
	})
}

func TestCancelledContextOnMissCreatesNothing(t *testing.T) {
	l := newLedger()
	c := newCache(t, l, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Get(ctx, 1)
	assert.Same(t, context.Canceled, err)
	assert.Equal(t, 0, l.callsFor(1))
}

type traceKey struct{}

func TestCreationContextKeepsValuesNotCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gotCtx := make(chan context.Context, 1)
		proceed := make(chan struct{})
		c, err := epcache.New(epcache.Config[int, int]{
			Create: func(ctx context.Context, key int) (int, error) {
				gotCtx <- ctx
				<-proceed
				return key, ctx.Err()
			},
		})
		require.NoError(t, err)
		defer c.Close()
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), traceKey{}, "trace-42"))
		res := make(chan error, 1)
		go func() { _, err := c.Get(ctx, 5); res <- err }()
		cctx := <-gotCtx
		assert.Equal(t, "trace-42", cctx.Value(traceKey{}), "the first caller's values carry over")
		cancel()
		assert.ErrorIs(t, <-res, context.Canceled)
		synctest.Wait()
		assert.NoError(t, cctx.Err(), "the creation is not cancelled with its callers")
		close(proceed)
		synctest.Wait()
		v, ok := c.Load(5)
		assert.True(t, ok)
		assert.Equal(t, 5, v)
		assert.Error(t, cctx.Err(), "the creation's context ends when Create returns")
	})
}

func TestCreateTimeoutCancelsCreation(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
				cfg.CreateTimeout = time.Second
				cfg.Create = func(ctx context.Context, key int) (*conn, error) {
					l.enter(key)
					defer l.leave(key)
					<-ctx.Done()
					return nil, ctx.Err()
				}
			})
			start := time.Now()
			a, b := goGet(c, context.Background(), 3), goGet(c, context.Background(), 3)
			ra, rb := <-a, <-b
			assert.Equal(t, time.Second, time.Since(start))
			for _, r := range []result{ra, rb} {
				require.ErrorIs(t, r.err, context.DeadlineExceeded)
				require.ErrorIs(t, r.err, epcache.ErrCreateTimeout, "the cache's timeout, not Create's own error")
				assert.Contains(t, r.err.Error(), "CreateTimeout of 1s")
			}
			synctest.Wait()
			// Nothing is remembered: the next Get creates again.
			_, err := c.Get(context.Background(), 3)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Equal(t, 2, l.callsFor(3))
			assert.EqualValues(t, 2, c.Stats().CreateErrors)
		})
	})
}

// A Create that ignores its context cannot be stopped, but its callers are
// answered at the deadline, and no second Create of the key overlaps it.
func TestCreateTimeoutWithCreateIgnoringContext(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
				cfg.CreateTimeout = time.Second
				cfg.Create = g.create
			})
			r := <-goGet(c, context.Background(), 3)
			require.ErrorIs(t, r.err, context.DeadlineExceeded)
			// While the stuck Create runs, callers get the error at once.
			start := time.Now()
			_, err := c.Get(context.Background(), 3)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Zero(t, time.Since(start))
			assert.Equal(t, 1, l.callsFor(3))
			assert.EqualValues(t, 1, c.Stats().ErrorHits)
			assert.False(t, c.Forget(3), "a creation still running cannot be forgotten")
			// It returns a value at last: nobody wants it, so it is released.
			g.proceed <- nil
			synctest.Wait()
			st := c.Stats()
			assert.EqualValues(t, 1, st.Creates)
			assert.EqualValues(t, 1, st.Releases)
			assert.Zero(t, c.Len())
			// And the key is free again.
			ch := goGet(c, context.Background(), 3)
			<-g.started
			<-g.started
			g.proceed <- nil
			r = <-ch
			require.NoError(t, r.err)
			assert.Equal(t, 3, r.c.key)
		})
	})
}

func TestFailureReachesEveryWaiterAndIsNotStored(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) { cfg.Create = g.create })
			var rs []<-chan result
			for range 10 {
				rs = append(rs, goGet(c, context.Background(), 9))
			}
			synctest.Wait()
			boom := errors.New("peer not reachable")
			g.proceed <- boom
			for _, ch := range rs {
				assert.Same(t, boom, (<-ch).err)
			}
			_, ok := c.Load(9)
			assert.False(t, ok)
			assert.Zero(t, c.Len())
			// The next Get creates again.
			ch := goGet(c, context.Background(), 9)
			synctest.Wait()
			g.proceed <- nil
			require.NoError(t, (<-ch).err)
			assert.Equal(t, 2, l.callsFor(9))
			st := c.Stats()
			assert.EqualValues(t, 1, st.CreateErrors)
			assert.EqualValues(t, 1, st.Creates)
		})
	})
}

func TestRetryReusesOneCreation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		var attempts []int
		fails := 2
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
			cfg.Create = func(ctx context.Context, key int) (*conn, error) {
				l.enter(key)
				defer l.leave(key)
				if fails > 0 {
					fails--
					return nil, fmt.Errorf("not yet published (%d left)", fails)
				}
				return l.newConn(key), nil
			}
			cfg.Retry = func(attempt int, err error) (time.Duration, bool) {
				attempts = append(attempts, attempt)
				return 10 * time.Millisecond, true
			}
		})
		start := time.Now()
		var rs []<-chan result
		for range 5 {
			rs = append(rs, goGet(c, context.Background(), 1))
		}
		for _, ch := range rs {
			r := <-ch
			require.NoError(t, r.err, "waiters see only the final outcome")
		}
		assert.Equal(t, 20*time.Millisecond, time.Since(start))
		assert.Equal(t, []int{1, 2}, attempts)
		st := c.Stats()
		assert.EqualValues(t, 3, st.Attempts)
		assert.EqualValues(t, 1, st.Creates)
		assert.Zero(t, st.CreateErrors)
	})
}

func TestRetryGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		boom := errors.New("refused")
		c := newCache(t, l, nil, func(cfg *epcache.Config[int, *conn]) {
			cfg.Create = func(context.Context, int) (*conn, error) { return nil, boom }
			cfg.Retry = epcache.Backoff(time.Millisecond, time.Second, 4, nil)
		})
		_, err := c.Get(context.Background(), 1)
		assert.Same(t, boom, err, "the final attempt's error, as Create returned it")
		assert.EqualValues(t, 4, c.Stats().Attempts)
		assert.EqualValues(t, 1, c.Stats().CreateErrors)
	})
}

func TestRetryWaitIsCutShort(t *testing.T) {
	for _, by := range []string{"CreateTimeout", "Close"} {
		t.Run("by="+by, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				boom := errors.New("not yet")
				creates := make(chan struct{}, 10)
				c, err := epcache.New(epcache.Config[int, int]{
					Create:        func(context.Context, int) (int, error) { creates <- struct{}{}; return 0, boom },
					Retry:         func(int, error) (time.Duration, bool) { return time.Hour, true },
					CreateTimeout: map[string]time.Duration{"CreateTimeout": time.Second, "Close": 0}[by],
				})
				require.NoError(t, err)
				start := time.Now()
				if by == "Close" {
					go func() {
						<-creates
						time.Sleep(time.Second)
						c.Close()
					}()
				}
				_, err = c.Get(context.Background(), 1)
				assert.Equal(t, time.Second, time.Since(start), "the hour-long wait ended at once")
				if by == "Close" {
					assert.ErrorIs(t, err, epcache.ErrClosed)
				} else {
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.ErrorIs(t, err, boom, "the last attempt's error is kept")
				}
				require.NoError(t, c.Close())
			})
		})
	}
}

func TestErrorTTL(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			down := true
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
				cfg.ErrorTTL = 5 * time.Second
				cfg.Create = func(_ context.Context, key int) (*conn, error) {
					l.enter(key)
					defer l.leave(key)
					if down {
						return nil, fmt.Errorf("peer %d is down", key)
					}
					return l.newConn(key), nil
				}
			})
			_, err := c.Get(context.Background(), 4)
			require.EqualError(t, err, "peer 4 is down")
			down = false
			for range 100 {
				_, err := c.Get(context.Background(), 4)
				require.EqualError(t, err, "peer 4 is down", "a remembered failure is answered without a Create")
			}
			assert.Equal(t, 1, l.callsFor(4), "the dead peer was not hammered")
			assert.EqualValues(t, 100, c.Stats().ErrorHits)
			// Other keys are unaffected.
			_, err = c.Get(context.Background(), 5)
			require.NoError(t, err)
			time.Sleep(5*time.Second - time.Nanosecond)
			_, err = c.Get(context.Background(), 4)
			require.Error(t, err)
			time.Sleep(time.Nanosecond)
			v, err := c.Get(context.Background(), 4)
			require.NoError(t, err, "the failure is forgotten after ErrorTTL")
			assert.Equal(t, 4, v.key)
			assert.Equal(t, 2, l.callsFor(4))

			// Forget drops a remembered failure before its TTL, and nothing else.
			down = true
			_, err = c.Get(context.Background(), 6)
			require.Error(t, err)
			assert.False(t, c.Forget(4), "a ready value is not a failure")
			assert.False(t, c.Forget(99), "absent key")
			down = false
			assert.True(t, c.Forget(6))
			assert.False(t, c.Forget(6), "already forgotten")
			_, err = c.Get(context.Background(), 6)
			require.NoError(t, err, "created at once, long before the TTL")
			assert.Equal(t, 2, l.callsFor(6))
		})
	})
}

func TestPanicInCreate(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			panicky := true
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
				cfg.Create = func(ctx context.Context, key int) (*conn, error) {
					if panicky {
						<-g.proceed
						panic(fmt.Errorf("wrapped: %w", errSentinel))
					}
					return l.create(ctx, key)
				}
			})
			var rs []<-chan result
			for range 8 {
				rs = append(rs, goGet(c, context.Background(), 2))
			}
			synctest.Wait()
			g.proceed <- nil
			for _, ch := range rs {
				err := (<-ch).err
				var pe *epcache.PanicError
				require.ErrorAs(t, err, &pe)
				assert.ErrorIs(t, err, errSentinel, "Unwrap reaches a panicked error")
				assert.Contains(t, string(pe.Stack), "TestPanicInCreate", "the stack is the panicking goroutine's")
				assert.Contains(t, err.Error(), "wrapped: sentinel")
			}
			// The slot is empty again.
			panicky = false
			v, err := c.Get(context.Background(), 2)
			require.NoError(t, err)
			assert.Equal(t, 2, v.key)
		})
	})
}

var errSentinel = errors.New("sentinel")

// A Create that calls runtime.Goexit answers every waiting caller with
// ErrGoexit. Where it runs on a goroutine of its own (the claimer's context
// can end), the claimer is a waiter like the others.
func TestGoexitInCreate(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			exits := true
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
				cfg.Create = func(ctx context.Context, key int) (*conn, error) {
					if exits {
						runtime.Goexit()
					}
					return l.create(ctx, key)
				}
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var rs []<-chan result
			for range 4 {
				rs = append(rs, goGet(c, ctx, 6))
			}
			for _, ch := range rs {
				assert.ErrorIs(t, (<-ch).err, epcache.ErrGoexit)
			}
			exits = false
			v, err := c.Get(context.Background(), 6)
			require.NoError(t, err)
			assert.Equal(t, 6, v.key)
		})
	})
}

// The other side of that line: a Get whose context can never end runs
// Create on its own goroutine, so a runtime.Goexit in Create ends that
// goroutine, as it would end it in any function it calls; the callers
// waiting on the creation get ErrGoexit, and the key is free again.
func TestGoexitInCreateOnCallerGoroutine(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			exits := true
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
				cfg.Create = func(ctx context.Context, key int) (*conn, error) {
					if exits {
						g.started <- key
						<-g.proceed
						runtime.Goexit()
					}
					return l.create(ctx, key)
				}
			})
			claimer := goGetTracked(c, context.Background(), 6)
			<-g.started
			var waiters []<-chan tracked
			for range 3 {
				waiters = append(waiters, goGetTracked(c, context.Background(), 6))
			}
			synctest.Wait()
			g.proceed <- nil
			assert.Equal(t, tracked{}, <-claimer, "Goexit ended the goroutine that ran Create")
			for _, ch := range waiters {
				r := <-ch
				assert.True(t, r.returned)
				assert.ErrorIs(t, r.err, epcache.ErrGoexit)
			}
			assert.EqualValues(t, 1, c.Stats().CreateErrors)
			exits = false
			v, err := c.Get(context.Background(), 6)
			require.NoError(t, err)
			assert.Equal(t, 6, v.key)
		})
	})
}

// tracked is what a Get started by goGetTracked did: returned is false when
// its goroutine ended inside the Get (runtime.Goexit).
type tracked struct {
	returned bool
	err      error
}

func goGetTracked(c *epcache.Cache[int, *conn], ctx context.Context, key int) <-chan tracked {
	ch := make(chan tracked, 1)
	go func() {
		var r tracked
		defer func() { ch <- r }()
		_, r.err = c.Get(ctx, key)
		r.returned = true
	}()
	return ch
}

// Create runs on the goroutine of the Get that claimed the key exactly when
// nothing could answer that Get before Create returns: its context has no
// Done channel and there is no CreateTimeout. Otherwise it runs on a
// goroutine of its own, so that the Get can leave on its context. Either
// way it gets the caller's values and a context of its own that ends when it
// returns.
func TestWhereCreateRuns(t *testing.T) {
	type key struct{}
	cancelled, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		timeout  time.Duration
		onCaller bool
	}{
		{"background", context.Background(), 0, true},
		{"values only", context.WithValue(context.Background(), key{}, "v"), 0, true},
		{"without cancel", context.WithoutCancel(cancelled), 0, true},
		{"cancelable", cancelled, 0, false},
		{"background with CreateTimeout", context.Background(), time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stack string
			var createCtx context.Context
			c, err := epcache.New(epcache.Config[int, int]{
				CreateTimeout: tc.timeout,
				Create: func(ctx context.Context, k int) (int, error) {
					stack, createCtx = string(debug.Stack()), ctx
					assert.NoError(t, ctx.Err())
					return k, nil
				},
			})
			require.NoError(t, err)
			defer c.Close()
			ctx := context.WithValue(tc.ctx, key{}, tc.name)
			v, err := c.Get(ctx, 7)
			require.NoError(t, err)
			assert.Equal(t, 7, v)
			// The subtest's function (func1; Create is func1.1) is on the
			// stack only if Create ran on the subtest's goroutine.
			const caller = "TestWhereCreateRuns.func1("
			if tc.onCaller {
				assert.Contains(t, stack, caller, "Create ran on the caller's goroutine")
			} else {
				assert.NotContains(t, stack, caller, "Create ran on a goroutine of its own")
			}
			assert.Equal(t, tc.name, createCtx.Value(key{}), "the caller's values")
			assert.ErrorIs(t, createCtx.Err(), context.Canceled, "Create's context ended when it returned")
		})
	}
}

func TestInvalidate(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) { cfg.Create = g.create })
			assert.False(t, c.Invalidate(1), "absent key")
			ch := goGet(c, context.Background(), 1)
			synctest.Wait()
			assert.False(t, c.Invalidate(1), "a key being created is not ready")
			g.proceed <- nil
			first := (<-ch).c
			require.NotNil(t, first)
			assert.True(t, c.Invalidate(1))
			assert.EqualValues(t, 1, first.released.Load(), "released by Invalidate, before it returned")
			assert.False(t, c.Invalidate(1), "nothing left to drop")
			_, ok := c.Load(1)
			assert.False(t, ok)
			ch = goGet(c, context.Background(), 1)
			synctest.Wait()
			g.proceed <- nil
			second := (<-ch).c
			assert.NotSame(t, first, second, "recreated after invalidation")
			assert.Zero(t, second.released.Load())
		})
	})
}

func TestCompareAndInvalidate(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		c := newCache(t, l, hash, nil)
		old, err := c.Get(context.Background(), 1)
		require.NoError(t, err)
		require.True(t, c.CompareAndInvalidate(1, old))
		current, err := c.Get(context.Background(), 1)
		require.NoError(t, err)
		// A late failure report about the old endpoint does not remove its replacement.
		assert.False(t, c.CompareAndInvalidate(1, old))
		v, ok := c.Load(1)
		assert.True(t, ok)
		assert.Same(t, current, v)
		assert.Zero(t, current.released.Load())
		assert.False(t, c.CompareAndInvalidate(2, old), "absent key")
		assert.True(t, c.CompareAndInvalidate(1, current))
	})
}

func TestCompareAndInvalidateIncomparablePanicsLikeSyncMap(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, []byte]{
		Create: func(context.Context, int) ([]byte, error) { return []byte("x"), nil },
	})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Get(context.Background(), 1)
	require.NoError(t, err)
	assert.Panics(t, func() { c.CompareAndInvalidate(1, []byte("x")) })
	_, ok := c.Load(1)
	assert.True(t, ok, "the panic changed nothing")
}

func TestReleaseMayCallBackIntoTheCache(t *testing.T) {
	var c *epcache.Cache[int, int]
	var released []int
	c, err := epcache.New(epcache.Config[int, int]{
		Create: func(_ context.Context, k int) (int, error) { return k * 10, nil },
		Release: func(k, v int) {
			released = append(released, v)
			c.Load(k)
			c.Invalidate(k + 1) // may release another value, reentrantly
			if _, err := c.Get(context.Background(), k+100); err != nil && !errors.Is(err, epcache.ErrClosed) {
				panic(err)
			}
		},
	})
	require.NoError(t, err)
	for k := range 3 {
		_, err := c.Get(context.Background(), k)
		require.NoError(t, err)
	}
	require.True(t, c.Invalidate(0))
	// Release of 0 invalidated 1 from inside Release, whose Release invalidated 2.
	assert.Equal(t, []int{0, 10, 20}, released)
	require.NoError(t, c.Close())
	st := c.Stats()
	assert.Equal(t, st.Creates, st.Releases)
	assert.Zero(t, st.Live)
}

func TestAllAndLen(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) { cfg.Create = g.create })
			for k := range 20 {
				ch := goGet(c, context.Background(), k)
				synctest.Wait()
				g.proceed <- nil
				require.NoError(t, (<-ch).err)
			}
			pending := goGet(c, context.Background(), 99) // being created: not ready
			synctest.Wait()
			c.Invalidate(3)
			seen := map[int]bool{}
			for k, v := range c.All() {
				assert.Equal(t, k, v.key)
				assert.False(t, seen[k], "no key twice")
				seen[k] = true
			}
			assert.Len(t, seen, 19)
			assert.False(t, seen[3])
			assert.False(t, seen[99])
			assert.Equal(t, 19, c.Len())
			n := 0
			for range c.All() {
				n++
				break
			}
			assert.Equal(t, 1, n, "All stops when the loop does")
			g.proceed <- nil
			require.NoError(t, (<-pending).err)
			assert.Equal(t, 20, c.Len())
		})
	})
}

func TestClose(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) { cfg.Create = g.create })
			for k := range 5 {
				ch := goGet(c, context.Background(), k)
				synctest.Wait()
				g.proceed <- nil
				require.NoError(t, (<-ch).err)
			}
			// A caller that can leave: its creation runs on a goroutine of
			// its own, and the caller waits for it like any other.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			waiting := goGet(c, ctx, 42)
			synctest.Wait()
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			synctest.Wait()
			assert.ErrorIs(t, (<-waiting).err, epcache.ErrClosed, "a waiting caller is answered by Close")
			select {
			case <-closed:
				t.Fatal("Close returned while a creation was in flight")
			default:
			}
			_, err := c.Get(context.Background(), 1)
			assert.ErrorIs(t, err, epcache.ErrClosed, "even a hit, once Close has begun")
			_, ok := c.Load(1)
			assert.False(t, ok)
			g.proceed <- nil // the creation finishes after Close began: its value is released
			require.NoError(t, <-closed)
			assert.NoError(t, c.Close(), "a second Close returns nil")
			for range c.All() {
				t.Fatal("All after Close")
			}
			assert.Zero(t, c.Len())
			assert.False(t, c.Invalidate(1))
			// checkClosed (cleanup) asserts all 6 values were released exactly once.
		})
	})
}

// A caller that cannot leave runs Create itself (see TestWhereCreateRuns):
// Close answers the callers waiting on that creation at once, cancels the
// creation's context, and the caller running Create gets ErrClosed once
// Create returns; the value it made is released.
func TestCloseDuringCreationOnCallerGoroutine(t *testing.T) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) {
			l := newLedger()
			g := newGated(l)
			var cause error
			c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
				cfg.Create = func(ctx context.Context, key int) (*conn, error) {
					v, err := g.create(ctx, key)
					cause = context.Cause(ctx)
					return v, err
				}
			})
			creating := goGetTracked(c, context.Background(), 42)
			<-g.started
			waiting := goGet(c, context.Background(), 42)
			synctest.Wait()
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			synctest.Wait()
			assert.ErrorIs(t, (<-waiting).err, epcache.ErrClosed, "a waiting caller is answered by Close")
			select {
			case <-creating:
				t.Fatal("the caller running Create returned before Create did")
			case <-closed:
				t.Fatal("Close returned while a creation was in flight")
			default:
			}
			g.proceed <- nil
			r := <-creating
			assert.True(t, r.returned)
			assert.ErrorIs(t, r.err, epcache.ErrClosed)
			assert.ErrorIs(t, cause, epcache.ErrClosed, "Close cancelled the creation's context")
			require.NoError(t, <-closed)
			assert.EqualValues(t, 1, c.Stats().Releases, "the value made during Close was released")
		})
	})
}

func TestCloseCancelsCreationContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger()
		cause := make(chan error, 1)
		c, err := epcache.New(epcache.Config[int, *conn]{
			Release: l.release,
			Create: func(ctx context.Context, key int) (*conn, error) {
				<-ctx.Done()
				cause <- context.Cause(ctx)
				return l.newConn(key), nil // a value made anyway must be released
			},
		})
		require.NoError(t, err)
		ch := goGet(c, context.Background(), 1)
		synctest.Wait()
		require.NoError(t, c.Close())
		assert.ErrorIs(t, <-cause, epcache.ErrClosed)
		assert.ErrorIs(t, (<-ch).err, epcache.ErrClosed)
		l.checkClosed(t, c)
	})
}

func TestCloseWaitsForRunningRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inRelease, finish := make(chan struct{}), make(chan struct{})
		c, err := epcache.New(epcache.Config[int, int]{
			Create: func(_ context.Context, k int) (int, error) { return k, nil },
			Release: func(k, v int) {
				if k == 1 {
					close(inRelease)
					<-finish
				}
			},
		})
		require.NoError(t, err)
		_, err = c.Get(context.Background(), 1)
		require.NoError(t, err)
		go c.Invalidate(1)
		<-inRelease
		closed := make(chan struct{})
		go func() { c.Close(); close(closed) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while a Release was running")
		default:
		}
		close(finish)
		<-closed
		assert.EqualValues(t, 1, c.Stats().Releases)
	})
}

func TestReleasePanics(t *testing.T) {
	t.Run("in Close: reported, the rest still released", func(t *testing.T) {
		var mu sync.Mutex
		released := map[int]int{}
		c, err := epcache.New(epcache.Config[int, int]{
			Create: func(_ context.Context, k int) (int, error) { return k, nil },
			Release: func(k, v int) {
				mu.Lock()
				released[k]++
				mu.Unlock()
				if k%3 == 0 {
					panic(fmt.Sprintf("cannot close endpoint %d", k))
				}
			},
		})
		require.NoError(t, err)
		for k := range 10 {
			_, err := c.Get(context.Background(), k)
			require.NoError(t, err)
		}
		err = c.Close()
		require.Error(t, err)
		var pe *epcache.PanicError
		assert.ErrorAs(t, err, &pe)
		assert.Contains(t, err.Error(), "cannot close endpoint 3")
		assert.Contains(t, err.Error(), "Release of key 9")
		for k := range 10 {
			assert.Equal(t, 1, released[k], "key %d", k)
		}
		st := c.Stats()
		assert.EqualValues(t, 10, st.Releases)
		assert.EqualValues(t, 4, st.ReleasePanics)
		assert.Zero(t, st.Live)
	})
	t.Run("in Invalidate: propagates, the cache stays usable", func(t *testing.T) {
		c, err := epcache.New(epcache.Config[int, int]{
			Create:  func(_ context.Context, k int) (int, error) { return k, nil },
			Release: func(k, v int) { panic("boom") },
		})
		require.NoError(t, err)
		_, err = c.Get(context.Background(), 1)
		require.NoError(t, err)
		assert.PanicsWithValue(t, "boom", func() { c.Invalidate(1) })
		_, ok := c.Load(1)
		assert.False(t, ok)
		v, err := c.Get(context.Background(), 1)
		require.NoError(t, err)
		assert.Equal(t, 1, v)
		assert.Error(t, c.Close(), "Close's own Release of the new value panics too")
		st := c.Stats()
		assert.EqualValues(t, 2, st.Releases)
		assert.Zero(t, st.Live)
	})
}

// Struct keys (job, rank, node) and pointer keys take the maphash path.
func TestStructAndPointerKeys(t *testing.T) {
	type peer struct {
		Job  uint32
		Rank int
		Node string
	}
	c, err := epcache.New(epcache.Config[peer, string]{
		Create: func(_ context.Context, p peer) (string, error) {
			return fmt.Sprintf("%d/%d@%s", p.Job, p.Rank, p.Node), nil
		},
	})
	require.NoError(t, err)
	defer c.Close()
	for i := range 100 {
		v, err := c.Get(context.Background(), peer{7, i, fmt.Sprint("n", i%4)})
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("7/%d@n%d", i, i%4), v)
	}
	assert.Equal(t, 100, c.Len())
	v, ok := c.Load(peer{7, 5, "n1"})
	assert.True(t, ok)
	assert.Equal(t, "7/5@n1", v)

	type node struct{ name string }
	a, b := &node{"a"}, &node{"a"}
	pc, err := epcache.New(epcache.Config[*node, string]{
		Create: func(_ context.Context, n *node) (string, error) { return n.name, nil },
	})
	require.NoError(t, err)
	defer pc.Close()
	_, err = pc.Get(context.Background(), a)
	require.NoError(t, err)
	_, ok = pc.Load(b)
	assert.False(t, ok, "pointer keys compare by identity")
	_, ok = pc.Load(a)
	assert.True(t, ok)
}
