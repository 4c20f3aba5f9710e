package epcache_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
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

// The fault-injection matrix. Every case asserts three properties:
//
//   - no deadlock: the case runs in a synctest bubble, which fails the test
//     when every goroutine in it is blocked for good, instead of hanging;
//   - no goroutine leak: synctest.Test returns only once every goroutine the
//     case started (creations, waiters, timers) has exited, and goleak checks
//     the whole package in TestMain;
//   - Releases == Creates at the end: newCache's cleanup closes the cache and
//     has the ledger check that every value Create returned was released
//     exactly once, that no two Creates of a key overlapped, and that Stats
//     agree (Creates == Releases == values made, Live == 0).
//
// Cases that exist elsewhere are not repeated here:
//
//	fault                                    test
//	Create panics                            TestPanicInCreate
//	Create calls runtime.Goexit              TestGoexitInCreate
//	Create hangs past CreateTimeout          TestCreateTimeoutCancelsCreation
//	Create ignores its context (timeout)     TestCreateTimeoutWithCreateIgnoringContext
//	Create ignores its context (Close)       TestClose
//	Create fails after k successes           TestFaultCreateFailsAfterKSuccesses
//	callers cancel in a storm                TestFaultCancelStorm
//	Close during a storm of hits             TestStress
//	Close during a storm of creations        TestFaultCloseDuringCreationStorm
//	Release calls back (Invalidate, Close)   TestReleaseMayCallBackIntoTheCache
//	Release calls back (late creation)       TestFaultReleaseReentersFromLateRelease
//	Release panics (Invalidate, Close)       TestReleasePanics
//	Release panics (late creation, CAI)      TestFaultReleasePanics
//	Release calls Goexit (late, Close)       TestGoexitInLateRelease, TestGoexitInReleaseDuringClose
//	Release calls Goexit (Invalidate, CAI)   TestFaultReleaseGoexitInInvalidate
//	Release is slow (Close waits)            TestCloseWaitsForRunningRelease
//	Release is slow (nothing else waits)     TestFaultSlowRelease
//	leases held across Invalidate, CAI,      TestFaultLeases (here), TestLeaseAndOfferStress
//	  Close, with Release panicking or
//	  calling back
//	Offer racing creations and Invalidate    TestOfferAnswersACreationInFlight, TestLeaseAndOfferStress

// faultCase runs body in a synctest bubble for every hash variant.
func faultCase(t *testing.T, body func(t *testing.T, hash func(int) uint64)) {
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		synctest.Test(t, func(t *testing.T) { body(t, hash) })
	})
}

// A Create that fails for good after k successes (a peer that ran out of
// connection slots), in a storm of Gets and Invalidates, plain, with
// retries, and with the error remembered. The value a failing Create returns
// beside its error is dropped and never released.
func TestFaultCreateFailsAfterKSuccesses(t *testing.T) {
	const k, goroutines, ops, keys = 5, 16, 40, 8
	errExhausted := errors.New("peer out of connection slots")
	for _, mode := range []string{"plain", "retry", "errorttl"} {
		t.Run("mode="+mode, func(t *testing.T) {
			faultCase(t, func(t *testing.T, hash func(int) uint64) {
				l := newLedger()
				var calls atomic.Int32
				var mu sync.Mutex
				var dropped []*conn
				c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
					cfg.Create = func(_ context.Context, key int) (*conn, error) {
						l.enter(key)
						defer l.leave(key)
						time.Sleep(time.Millisecond) // callers pile up meanwhile
						if calls.Add(1) <= k {
							return l.newConn(key), nil
						}
						half := &conn{key: key, gen: -1}
						mu.Lock()
						dropped = append(dropped, half)
						mu.Unlock()
						return half, errExhausted
					}
					switch mode {
					case "retry":
						cfg.Retry = epcache.Backoff(time.Millisecond, 4*time.Millisecond, 3, nil)
					case "errorttl":
						cfg.ErrorTTL = 10 * time.Millisecond
					}
				})
				var wg sync.WaitGroup
				var values, failures atomic.Int32
				for g := range goroutines {
					wg.Go(func() {
						r := rand.New(rand.NewPCG(uint64(g), 1))
						for range ops {
							key := r.IntN(keys)
							switch p := r.IntN(10); {
							case p < 7:
								v, err := c.Get(context.Background(), key)
								switch {
								case err == nil:
									values.Add(1)
									assert.Equal(t, key, v.key)
								case errors.Is(err, errExhausted):
									failures.Add(1)
								default:
									t.Errorf("Get(%d): %v", key, err)
								}
							case p < 9:
								c.Invalidate(key)
							default:
								if v, ok := c.Load(key); ok {
									c.CompareAndInvalidate(key, v)
								}
							}
							time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
						}
					})
				}
				wg.Wait()
				st := c.Stats()
				assert.EqualValues(t, k, st.Creates, "only the first k creations made a value")
				assert.Positive(t, values.Load())
				assert.Positive(t, failures.Load())
				assert.Positive(t, st.CreateErrors)
				switch mode {
				case "retry":
					assert.Greater(t, st.Attempts, st.Creates+st.CreateErrors, "failed creations were retried")
				case "errorttl":
					assert.Positive(t, st.ErrorHits, "remembered failures were answered without a Create")
				}
				require.NoError(t, c.Close())
				mu.Lock()
				defer mu.Unlock()
				assert.NotEmpty(t, dropped)
				for _, d := range dropped {
					assert.Zero(t, d.released.Load(), "a value returned with an error is dropped, not released")
				}
			})
		})
	}
}

// Callers leave in a storm: each Get has its own deadline or is cancelled
// before or during the call, while creations take longer than most
// deadlines. Each caller gets a value of its key or exactly its ctx.Err();
// creations whose callers all left still finish and keep their value.
func TestFaultCancelStorm(t *testing.T) {
	const goroutines, rounds, keys = 32, 20, 4
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.Create = func(_ context.Context, key int) (*conn, error) {
				l.enter(key)
				defer l.leave(key)
				time.Sleep(10 * time.Millisecond)
				return l.newConn(key), nil
			}
		})
		var wg sync.WaitGroup
		var values, left atomic.Int32
		for g := range goroutines {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(g), 2))
				for range rounds {
					key := r.IntN(keys)
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(15))*time.Millisecond)
					switch r.IntN(3) {
					case 0:
						cancel() // gone before the call
					case 1:
						time.AfterFunc(time.Duration(r.IntN(12))*time.Millisecond, cancel) // gone during it
					}
					v, err := c.Get(ctx, key)
					switch {
					case err == nil:
						values.Add(1)
						assert.Equal(t, key, v.key)
					case err == ctx.Err():
						left.Add(1) // ctx.Err() itself, unwrapped
					default:
						t.Errorf("Get(%d): %v; want a value or %v", key, err, ctx.Err())
					}
					cancel()
					if r.IntN(4) == 0 {
						c.Invalidate(key)
					}
				}
			})
		}
		wg.Wait()
		synctest.Wait() // creations whose callers all left have finished
		st := c.Stats()
		assert.Positive(t, values.Load())
		assert.Positive(t, left.Load())
		assert.Positive(t, st.Cancels, "callers left while waiting")
		assert.Zero(t, st.CreateErrors, "no creation failed because its callers left")
		for key := range keys {
			if _, ok := c.Load(key); !ok {
				v, err := c.Get(context.Background(), key) // a creation, not a leftover error
				require.NoError(t, err)
				assert.Equal(t, key, v.key)
			}
		}
	})
}

// Close comes while creations of every kind are in flight: fast, slow,
// waiting for their context, ignoring it for an hour, panicking, calling
// Goexit, some past CreateTimeout; other goroutines invalidate meanwhile.
// Every caller returns, Close waits for the creation that ignores its
// context, and every value made, before or after Close began, is released
// once.
func TestFaultCloseDuringCreationStorm(t *testing.T) {
	const goroutines, keys = 24, 48
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.CreateTimeout = 25 * time.Millisecond
			cfg.Create = func(ctx context.Context, key int) (*conn, error) {
				l.enter(key)
				defer l.leave(key)
				switch key % 6 {
				case 1:
					time.Sleep(15 * time.Millisecond)
				case 2:
					<-ctx.Done()
					return nil, ctx.Err()
				case 3:
					time.Sleep(time.Hour) // ignores ctx: Close waits, then releases
				case 4:
					time.Sleep(time.Millisecond)
					panic("create exploded")
				case 5:
					time.Sleep(time.Millisecond)
					runtime.Goexit()
				}
				return l.newConn(key), nil
			}
		})
		start := time.Now()
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(g), 3))
				for {
					key := r.IntN(keys)
					switch p := r.IntN(10); {
					case p < 6:
						v, err := c.Get(context.Background(), key)
						var pe *epcache.PanicError
						switch {
						case errors.Is(err, epcache.ErrClosed):
							return
						case err == nil:
							assert.Equal(t, key, v.key)
						case errors.Is(err, context.DeadlineExceeded), errors.As(err, &pe), errors.Is(err, epcache.ErrGoexit):
						default:
							t.Errorf("Get(%d): %v", key, err)
						}
					case p < 8:
						c.Invalidate(key)
					default:
						if v, ok := c.Load(key); ok {
							c.CompareAndInvalidate(key, v)
						}
					}
					time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
				}
			})
		}
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, c.Close())
		assert.GreaterOrEqual(t, time.Since(start), time.Hour, "Close waited for the Creates that ignore their context")
		wg.Wait()
		st := c.Stats()
		assert.Zero(t, st.Ready)
		assert.Positive(t, st.Creates)
		assert.Positive(t, st.CreateErrors)
	})
}

// A value made too late (after CreateTimeout answered its callers) is
// released on the creation's goroutine; that Release may use the cache: it
// recreates its own key, invalidates another and loads.
func TestFaultReleaseReentersFromLateRelease(t *testing.T) {
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		var c *epcache.Cache[int, *conn]
		var first, late atomic.Bool
		reentered := make(chan *conn, 1)
		c = newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.CreateTimeout = time.Second
			cfg.Create = func(_ context.Context, key int) (*conn, error) {
				l.enter(key)
				defer l.leave(key)
				if key == 1 && first.CompareAndSwap(false, true) {
					time.Sleep(2 * time.Second) // ignores ctx
				}
				return l.newConn(key), nil
			}
			cfg.Release = func(key int, v *conn) {
				l.release(key, v)
				if key == 1 && late.CompareAndSwap(false, true) { // the late value
					v2, err := c.Get(context.Background(), 1)
					if assert.NoError(t, err) {
						assert.NotSame(t, v, v2)
					}
					assert.True(t, c.Invalidate(2))
					_, ok := c.Load(1)
					assert.True(t, ok)
					reentered <- v2
				}
			}
		})
		_, err := c.Get(context.Background(), 1)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		_, err = c.Get(context.Background(), 2)
		require.NoError(t, err)
		v2 := <-reentered // at 2s the late value is made and released
		v, ok := c.Load(1)
		assert.True(t, ok)
		assert.Same(t, v2, v, "the Release's Get published the key's new value")
		_, ok = c.Load(2)
		assert.False(t, ok, "the Release's Invalidate dropped key 2")
		assert.EqualValues(t, 2, c.Stats().Releases)
	})
}

// A Release that panics: in Invalidate and CompareAndInvalidate the panic
// reaches the caller; in the release of a late value (on a creation's
// goroutine) it is recovered and reported by Close. Nothing else is lost:
// every other value is still released at Close, and the cache stays usable.
func TestFaultReleasePanics(t *testing.T) {
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		var first atomic.Bool
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.CreateTimeout = time.Second
			cfg.Create = func(_ context.Context, key int) (*conn, error) {
				l.enter(key)
				defer l.leave(key)
				if key == 1 && first.CompareAndSwap(false, true) {
					time.Sleep(2 * time.Second)
				}
				return l.newConn(key), nil
			}
			cfg.Release = func(key int, v *conn) {
				l.release(key, v)
				if key < 3 {
					panic("endpoint " + v.String() + " would not close")
				}
			}
		})
		_, err := c.Get(context.Background(), 1)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		for key := 3; key < 10; key++ {
			_, err := c.Get(context.Background(), key)
			require.NoError(t, err)
		}
		v, err := c.Get(context.Background(), 2)
		require.NoError(t, err)
		assert.PanicsWithValue(t, "endpoint "+v.String()+" would not close", func() { c.Invalidate(2) })
		v, err = c.Get(context.Background(), 2)
		require.NoError(t, err, "the cache stays usable")
		assert.PanicsWithValue(t, "endpoint "+v.String()+" would not close", func() { c.CompareAndInvalidate(2, v) })
		time.Sleep(2 * time.Second) // the late value of key 1 is made, then its Release panics
		synctest.Wait()
		st := c.Stats()
		assert.EqualValues(t, 3, st.ReleasePanics)
		assert.Equal(t, st.Creates, st.Releases+uint64(st.Ready))
		err = c.Close()
		var pe *epcache.PanicError
		require.ErrorAs(t, err, &pe, "Close reports the panic of the late release")
		assert.Contains(t, err.Error(), "Release of key 1")
		assert.Regexp(t, `endpoint conn\(key=1 gen=\d+\) would not close`, err.Error())
		assert.Equal(t, 1, strings.Count(err.Error(), "epcache: Release of key"), "only the panic nobody else saw is reported")
		// newCache's cleanup: every value, keys 3..9 at Close included, was released once.
	})
}

// A Release that calls runtime.Goexit from Invalidate or CompareAndInvalidate
// ends the calling goroutine, as any function it calls could; the value
// counts as released, the cache is left consistent, and Close does not wait
// for an invalidation that will never finish.
func TestFaultReleaseGoexitInInvalidate(t *testing.T) {
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.Release = func(key int, v *conn) {
				l.release(key, v)
				if v.gen <= 2 {
					runtime.Goexit()
				}
			}
		})
		for _, cai := range []bool{false, true} {
			v, err := c.Get(context.Background(), 1)
			require.NoError(t, err)
			done := make(chan struct{})
			returned := false
			go func() {
				defer close(done)
				if cai {
					c.CompareAndInvalidate(1, v)
				} else {
					c.Invalidate(1)
				}
				returned = true
			}()
			<-done
			assert.False(t, returned, "Goexit ended the invalidating goroutine")
			assert.EqualValues(t, 1, v.released.Load())
			_, ok := c.Load(1)
			assert.False(t, ok)
		}
		v, err := c.Get(context.Background(), 1)
		require.NoError(t, err, "the key is created anew")
		assert.EqualValues(t, 3, v.gen)
		st := c.Stats()
		assert.EqualValues(t, 2, st.Releases)
		assert.Zero(t, st.ReleasePanics, "a Goexit is not a panic")
	})
}

// A slow Release delays only what must wait for it: its own caller and
// Close. Other keys are read, created and invalidated meanwhile, and the key
// itself is created anew at once (Invalidate's documented behaviour). A slow
// release of a late value holds up Close too, and nothing else.
func TestFaultSlowRelease(t *testing.T) {
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		var first atomic.Bool
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.CreateTimeout = time.Second
			cfg.Create = func(_ context.Context, key int) (*conn, error) {
				l.enter(key)
				defer l.leave(key)
				if key == 9 && first.CompareAndSwap(false, true) {
					time.Sleep(2 * time.Second)
				}
				return l.newConn(key), nil
			}
			cfg.Release = func(key int, v *conn) {
				if v.gen == 1 || key == 9 {
					time.Sleep(time.Hour) // closing this endpoint takes an hour
				}
				l.release(key, v)
			}
		})
		start := time.Now()
		v1, err := c.Get(context.Background(), 1)
		require.NoError(t, err)
		invalidated := make(chan struct{})
		go func() {
			defer close(invalidated)
			assert.True(t, c.Invalidate(1))
		}()
		synctest.Wait() // the Release of key 1 is under way
		v, err := c.Get(context.Background(), 1)
		require.NoError(t, err)
		assert.NotSame(t, v1, v, "key 1 is created anew while its old value is being released")
		for key := 2; key < 6; key++ {
			_, err := c.Get(context.Background(), key)
			require.NoError(t, err)
		}
		assert.True(t, c.Invalidate(3))
		assert.Equal(t, 4, c.Len())
		assert.Zero(t, time.Since(start), "nothing waited for the slow Release")
		_, err = c.Get(context.Background(), 9) // times out at 1s; its value comes at 2s, released until 1h2s
		require.ErrorIs(t, err, context.DeadlineExceeded)
		<-invalidated
		assert.Equal(t, time.Hour, time.Since(start), "Invalidate returned once its Release did")
		assert.EqualValues(t, 1, v1.released.Load())
		closeStart := time.Now()
		require.NoError(t, c.Close())
		assert.Equal(t, time.Hour+2*time.Second, time.Since(start), "Close waited for the late value's slow Release")
		assert.Equal(t, time.Duration(0), time.Since(closeStart)-2*time.Second, "and for nothing else")
	})
}

// Leases held across Invalidate, CompareAndInvalidate and Close, in a storm,
// while Release panics now and then, or calls back into the cache: no value
// is released while a lease holds it, each is released once, by whoever
// ends its last lease (a Lease.Release, which gets the panic) or gives it
// up unleased (Invalidate, Close).
func TestFaultLeases(t *testing.T) {
	const goroutines, ops, keys = 12, 40, 4
	for _, mode := range []string{"plain", "panicking", "reentrant"} {
		t.Run("release="+mode, func(t *testing.T) {
			faultCase(t, func(t *testing.T, hash func(int) uint64) {
				l := newLedger()
				var c *epcache.Cache[int, *conn]
				var leasedRelease, panics atomic.Int32
				c = newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
					cfg.Release = func(k int, v *conn) {
						if v.leases.Load() != 0 {
							leasedRelease.Add(1)
						}
						l.release(k, v)
						switch {
						case mode == "panicking" && v.gen%3 == 0:
							panic("release failed")
						case mode == "reentrant":
							c.Load(k)
							c.Invalidate((k + 1) % keys)
						}
					}
				})
				// recovering runs f, and counts a panic of Release.
				recovering := func(f func()) {
					defer func() {
						if r := recover(); r != nil {
							if r != "release failed" {
								panic(r)
							}
							panics.Add(1)
						}
					}()
					f()
				}
				var wg sync.WaitGroup
				for g := range goroutines {
					wg.Go(func() {
						r := rand.New(rand.NewPCG(uint64(g), 11))
						for i := range ops {
							k := r.IntN(keys)
							switch r.IntN(4) {
							case 0, 1:
								a, err := c.Acquire(context.Background(), k)
								if err != nil {
									assert.ErrorIs(t, err, epcache.ErrClosed)
									continue
								}
								v := a.Value()
								v.leases.Add(1)
								time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
								v.leases.Add(-1)
								recovering(a.Release)
							case 2:
								recovering(func() { c.Invalidate(k) })
							default:
								if v, ok := c.Load(k); ok {
									recovering(func() { c.CompareAndInvalidate(k, v) })
								}
							}
							if g == 0 && i == ops/2 {
								err := c.Close()
								if mode != "panicking" {
									assert.NoError(t, err)
								}
							}
						}
					})
				}
				wg.Wait()
				assert.Zero(t, leasedRelease.Load(), "released while leased")
				st := c.Stats()
				assert.Zero(t, st.Lingering, "every lease ended")
				if mode == "panicking" {
					assert.LessOrEqual(t, uint64(panics.Load()), st.ReleasePanics, "panics reached the Releases of leases and Invalidates")
				}
			})
		})
	}
}
