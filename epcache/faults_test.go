package epcache_test

import (
	"context"
	"errors"
	"fmt"
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
//
// With MaxEntries and IdleTimeout, the cases at the end of this file, each
// of which also checks that all the room comes back:
//
//	Release panics, Goexit (eviction)        TestFaultReleaseFailsInEviction
//	Release panics, Goexit (idle sweep)      TestFaultReleaseFailsInIdleSweep,
//	                                         TestFaultGoexitInIdleSweepDelaysNoOtherRemoval
//	Create fails holding room (error,        TestFaultFailedCreationGivesRoomBack
//	  retries, panic, Goexit, timeout)
//	CreateTimeout with MaxEntries            TestFaultCreateTimeoutHoldsRoomUntilCreateReturns
//	Close while creations wait for room      TestFaultCloseWhileCreationsWaitForRoom, TestCloseWakesRoomWaiters
//	Offer racing evictions                   TestFaultOfferRacesEviction
//	waits for room that never end; a lease   room_race_test.go
//	  of a value already evicted

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
						half := newConn(key, -1)
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
// ends its last lease (a Lease.Release, which gets the panic, or an
// Acquire that leaves after Close) or gives it up unleased (Invalidate,
// Close).
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
								// An Acquire whose creation ends after
								// Close has returned ends the lease its
								// creator took for it, the value's last,
								// and so releases the value itself: it
								// gets Release's panic, as Close has
								// returned and cannot report it.
								var a epcache.Lease[int, *conn]
								var err error
								acquired := false
								recovering(func() {
									a, err = c.Acquire(context.Background(), k)
									acquired = true
								})
								if !acquired {
									// Only once Close has returned.
									_, err := c.Get(context.Background(), k)
									assert.ErrorIs(t, err, epcache.ErrClosed, "an Acquire got Release's panic before Close returned")
									continue
								}
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
								// A lease held across Close for certain,
								// beside the others' that may be.
								held, herr := c.Acquire(context.Background(), 0)
								assert.NoError(t, herr)
								err := c.Close()
								if mode != "panicking" {
									assert.NoError(t, err)
								}
								if herr == nil {
									assert.Positive(t, c.Stats().Lingering, "the value of a lease held across Close lingers")
									assert.Zero(t, held.Value().released.Load(), "released under a lease by Close")
									recovering(held.Release)
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
					// Every third value made panics: at least one did, in
					// a lease's end, an Invalidate or Close.
					assert.Positive(t, st.ReleasePanics, "no Release panicked")
					assert.LessOrEqual(t, uint64(panics.Load()), st.ReleasePanics, "panics reached the Releases of leases and Invalidates")
				}
			})
		})
	}
}

// The fault matrix under MaxEntries and IdleTimeout. Each case also checks
// that the room comes back: Stats.Room is 0 once Close has returned and no
// lease is held (roomBack), beside newCache's ledger check.

// roomBack closes c and checks that every unit of room came back.
func roomBack(t *testing.T, c *epcache.Cache[int, *conn]) error {
	t.Helper()
	err := c.Close()
	st := c.Stats()
	assert.Zero(t, st.Room, "room still taken after Close, with no lease held: %+v", st)
	assert.Zero(t, st.Lingering)
	return err
}

// An eviction's Release runs on the goroutine of the Get that waits for
// room and evicted the value when that Get's context never ends, and on a
// goroutine of its own otherwise. One that panics is recovered there: the
// Get goes on as if it had returned. One that calls runtime.Goexit ends the
// goroutine it runs on: the Get's (and nothing else: the key's claim is
// given up, and the next Get of it creates it), or its own (the Get goes
// on). Either way the room still comes back, the value counts as released,
// and Close reports the failure, beside its own.
func TestFaultReleaseFailsInEviction(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		leavable bool // the Gets' context can end
	}{{"panic", true}, {"goexit", true}, {"panic", false}, {"goexit", false}} {
		mode := tc.mode
		t.Run(fmt.Sprintf("release=%s/leavable=%t", mode, tc.leavable), func(t *testing.T) {
			faultCase(t, func(t *testing.T, hash func(int) uint64) {
				l := newLedger()
				var m meter
				create, release := metered(l, &m)
				c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
					cfg.MaxEntries, cfg.Create = 2, create
					cfg.Release = func(k int, v *conn) {
						release(k, v)
						if k < 3 { // keys 1 and 2: one is evicted, the other released by Close
							if mode == "panic" {
								panic("endpoint " + v.String() + " would not close")
							}
							runtime.Goexit()
						}
					}
				})
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.leavable {
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
				}
				defer cancel()
				// get calls Get on a goroutine of its own, and reports
				// whether it returned (not: a runtime.Goexit ended it).
				get := func(k int) (returned bool, err error) {
					done := make(chan struct{})
					go func() {
						defer close(done)
						_, err = c.Get(ctx, k)
						returned = true
					}()
					<-done
					return returned, err
				}
				for k := 1; k <= 2; k++ {
					returned, err := get(k)
					require.True(t, returned)
					require.NoError(t, err)
				}
				returned, err := get(3) // evicts key 1 or 2, and runs its Release
				if mode == "panic" || tc.leavable {
					require.True(t, returned, "the panic of the Release its eviction ran reached the Get")
					require.NoError(t, err, "Get(3): the room of the failed Release never came back")
				} else {
					require.False(t, returned, "the Release its eviction ran called runtime.Goexit, and the Get returned")
					returned, err = get(3) // the claim was given up: this Get creates the key
					require.True(t, returned)
					require.NoError(t, err, "Get(3) after the Goexit: the room of the failed Release never came back")
				}
				synctest.Wait()
				st := c.Stats()
				assert.EqualValues(t, 1, st.Evictions)
				assert.EqualValues(t, 1, st.Releases)
				assert.EqualValues(t, 2, st.Room)
				assert.LessOrEqual(t, m.peak.Load(), int64(2))
				if mode == "panic" {
					assert.EqualValues(t, 1, st.ReleasePanics)
				}
				// The cache goes on: another eviction, of key 3 or of key 1's
				// or 2's survivor (whose Release may end this Get too).
				for range 2 {
					if returned, err = get(4); returned {
						break
					}
				}
				require.True(t, returned)
				require.NoError(t, err)
				synctest.Wait()
				err = roomBack(t, c)
				want := "panicked"
				if mode == "goexit" {
					want = "called runtime.Goexit"
				}
				require.Error(t, err, "Close reports the failed Releases")
				assert.Equal(t, 2, strings.Count(err.Error(), "epcache: Release of key"), "one for the eviction, one for Close's own: %v", err)
				if mode == "panic" {
					var pe *epcache.PanicError
					assert.ErrorAs(t, err, &pe)
					assert.Contains(t, err.Error(), "would not close")
				} else {
					assert.Contains(t, err.Error(), want)
				}
				assert.LessOrEqual(t, m.peak.Load(), int64(2))
			})
		})
	}
}

// The Releases of an idle sweep run on a goroutine of the cache's (the
// sweep's, or one of their own). One that panics or calls runtime.Goexit
// stops no later sweep (a value used afterwards is removed on time), and
// Close reports it.
func TestFaultReleaseFailsInIdleSweep(t *testing.T) {
	const idle = time.Minute
	for _, mode := range []string{"panic", "goexit"} {
		t.Run("release="+mode, func(t *testing.T) {
			faultCase(t, func(t *testing.T, hash func(int) uint64) {
				l := newLedger()
				released := map[int]time.Time{}
				var mu sync.Mutex
				c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
					cfg.IdleTimeout = idle
					cfg.Release = func(k int, v *conn) {
						l.release(k, v)
						mu.Lock()
						released[k] = time.Now()
						mu.Unlock()
						if k == 1 {
							if mode == "panic" {
								panic("endpoint " + v.String() + " would not close")
							}
							runtime.Goexit()
						}
					}
				})
				start := time.Now()
				_, err := c.Get(context.Background(), 1)
				require.NoError(t, err)
				time.Sleep(idle * 5 / 4)
				synctest.Wait()
				assert.Zero(t, c.Len(), "key 1 was not removed idle")
				// The sweeps go on: a value used now is removed on time.
				_, err = c.Get(context.Background(), 2)
				require.NoError(t, err)
				used := time.Now()
				time.Sleep(idle * 3 / 2)
				synctest.Wait()
				mu.Lock()
				assert.Contains(t, released, 1)
				if assert.Contains(t, released, 2, "the sweeps stopped after the failed Release") {
					assert.LessOrEqual(t, released[2].Sub(used), idle*5/4)
					assert.GreaterOrEqual(t, released[2].Sub(used), idle)
				}
				assert.LessOrEqual(t, released[1].Sub(start), idle*5/4)
				mu.Unlock()
				st := c.Stats()
				assert.EqualValues(t, 2, st.IdleRemovals)
				err = roomBack(t, c)
				require.Error(t, err, "Close reports the failed Release")
				assert.Equal(t, 1, strings.Count(err.Error(), "epcache: Release of key 1"), err.Error())
			})
		})
	}
}

// A Release that calls runtime.Goexit in an idle sweep must not delay the
// other removals of that sweep: each value is removed between IdleTimeout
// and 5/4 of it after its last use, not a sweep later. (A Release run on
// the sweep's own goroutine ends the sweep there, and the values it had
// still to visit waited for the next one.)
func TestFaultGoexitInIdleSweepDelaysNoOtherRemoval(t *testing.T) {
	const idle, keys = time.Minute, 12
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		released := map[int]time.Time{}
		var mu sync.Mutex
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.IdleTimeout = idle
			cfg.Release = func(k int, v *conn) {
				l.release(k, v)
				mu.Lock()
				released[k] = time.Now()
				mu.Unlock()
				if k == 0 {
					runtime.Goexit()
				}
			}
		})
		start := time.Now()
		for k := range keys {
			_, err := c.Get(context.Background(), k)
			require.NoError(t, err)
		}
		time.Sleep(idle * 5 / 4)
		synctest.Wait()
		mu.Lock()
		for k := range keys {
			if assert.Contains(t, released, k, "key %d still held %v after its last use: the sweep that key 0's Release ended skipped it", k, time.Since(start)) {
				assert.LessOrEqual(t, released[k].Sub(start), idle*5/4, "key %d", k)
			}
		}
		mu.Unlock()
		err := roomBack(t, c)
		assert.ErrorContains(t, err, "epcache: Release of key 0 called runtime.Goexit")
	})
}

// Creations that fail while they hold room (an error after retries, a
// panic, runtime.Goexit, a CreateTimeout) give it back: a creation waiting
// for room gets it, and Stats.Room is 0 once all is done.
func TestFaultFailedCreationGivesRoomBack(t *testing.T) {
	for _, mode := range []string{"error", "retry", "panic", "goexit", "timeout"} {
		t.Run("create="+mode, func(t *testing.T) {
			faultCase(t, func(t *testing.T, hash func(int) uint64) {
				l := newLedger()
				errRefused := errors.New("refused")
				c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
					cfg.MaxEntries = 1
					cfg.CreateTimeout = time.Second
					cfg.Create = func(ctx context.Context, k int) (*conn, error) {
						l.enter(k)
						defer l.leave(k)
						time.Sleep(time.Millisecond) // the waiter queues meanwhile
						if k == 1 {
							switch mode {
							case "error", "retry":
								return nil, errRefused
							case "panic":
								panic("dial exploded")
							case "goexit":
								runtime.Goexit()
							case "timeout":
								<-ctx.Done()
								time.Sleep(time.Second) // returns late, with nothing
								return nil, ctx.Err()
							}
						}
						return l.newConn(k), nil
					}
					if mode == "retry" {
						cfg.Retry = epcache.Backoff(time.Millisecond, 4*time.Millisecond, 3, nil)
					}
				})
				bg := context.Background()
				failed := make(chan error, 1)
				go func() {
					_, err := c.Get(bg, 1) // takes the room, then fails
					failed <- err
				}()
				synctest.Wait()
				assert.EqualValues(t, 1, c.Stats().Room)
				ctx, cancel := context.WithTimeout(bg, time.Hour)
				defer cancel()
				v, err := c.Get(ctx, 2) // waits for key 1's room
				require.NoError(t, err, "the failed creation's room never came back")
				assert.Equal(t, 2, v.key)
				assert.Error(t, <-failed)
				synctest.Wait()
				st := c.Stats()
				assert.EqualValues(t, 1, st.Room, "key 2's value, and nothing of key 1")
				assert.EqualValues(t, 1, st.RoomWaits)
				assert.Zero(t, st.Evictions)
				require.NoError(t, roomBack(t, c))
			})
		})
	}
}

// CreateTimeout and MaxEntries: a creation answered by its timeout whose
// Create runs on still holds its room, so that values alive plus creations
// running never exceed the cap; the room comes back when Create returns,
// and the value it returns late is released.
func TestFaultCreateTimeoutHoldsRoomUntilCreateReturns(t *testing.T) {
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		var m meter
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.MaxEntries, cfg.CreateTimeout = 1, time.Second
			cfg.Create = func(_ context.Context, k int) (*conn, error) {
				m.add()
				l.enter(k)
				defer l.leave(k)
				if k == 1 {
					time.Sleep(10 * time.Second) // ignores its context
				}
				return l.newConn(k), nil
			}
			cfg.Release = func(k int, v *conn) {
				l.release(k, v)
				m.done()
			}
		})
		bg := context.Background()
		start := time.Now()
		_, err := c.Get(bg, 1)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.EqualValues(t, 1, c.Stats().Room, "the timed-out Create still runs")
		ctx, cancel := context.WithTimeout(bg, 5*time.Second)
		_, err = c.Get(ctx, 2)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "a creation found room while the timed-out one ran")
		assert.ErrorContains(t, err, "no room")
		v, err := c.Get(bg, 2) // waits until key 1's Create returns, 10s in
		require.NoError(t, err)
		assert.Equal(t, 2, v.key)
		assert.GreaterOrEqual(t, time.Since(start), 10*time.Second)
		synctest.Wait()
		assert.LessOrEqual(t, m.peak.Load(), int64(1), "values alive plus creations exceeded MaxEntries")
		st := c.Stats()
		assert.EqualValues(t, 2, st.Creates)
		assert.EqualValues(t, 1, st.Releases, "the late value of key 1 is released")
		assert.EqualValues(t, 1, st.Room)
		require.NoError(t, roomBack(t, c))
	})
}

// Close comes while creations wait for room (every value leased, some
// creations in flight, their waiters behind them): every Get returns, with
// a value or ErrClosed, no Create starts after Close, and once the leases
// end every value has been released and all the room is back.
func TestFaultCloseWhileCreationsWaitForRoom(t *testing.T) {
	const maxEntries, waiters = 2, 12
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		var m meter
		create, release := metered(l, &m)
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.MaxEntries, cfg.Release = maxEntries, release
			cfg.Create = func(ctx context.Context, k int) (*conn, error) {
				time.Sleep(time.Millisecond)
				return create(ctx, k)
			}
		})
		bg := context.Background()
		var leases []epcache.Lease[int, *conn]
		for k := range maxEntries {
			a, err := c.Acquire(bg, k)
			require.NoError(t, err)
			leases = append(leases, a)
		}
		var wg sync.WaitGroup
		var closed, got atomic.Int32
		for i := range waiters {
			wg.Go(func() {
				k := maxEntries + i%4 // three Gets of each key: a claimer and its waiters
				v, err := c.Get(bg, k)
				switch {
				case errors.Is(err, epcache.ErrClosed):
					closed.Add(1)
				case err == nil:
					got.Add(1)
					assert.Equal(t, k, v.key)
				default:
					t.Errorf("Get(%d): %v", k, err)
				}
			})
		}
		synctest.Wait()
		assert.EqualValues(t, 4, c.Stats().RoomWaits, "one claimer of each key waits for room")
		leases[0].Release() // one unit: one creation runs when Close comes
		time.Sleep(time.Microsecond)
		require.NoError(t, c.Close())
		wg.Wait()
		assert.EqualValues(t, waiters, closed.Load()+got.Load())
		assert.Positive(t, closed.Load())
		calls := 0
		for k := maxEntries; k < maxEntries+4; k++ {
			calls += l.callsFor(k)
		}
		assert.LessOrEqual(t, calls, 1, "Creates started after Close")
		assert.EqualValues(t, 1, c.Stats().Room, "the value still leased")
		leases[1].Release()
		assert.Zero(t, c.Stats().Room)
		assert.LessOrEqual(t, m.peak.Load(), int64(maxEntries))
		assert.Zero(t, m.live.Load())
	})
}

// Offers race evictions: goroutines offer values for keys while others
// create keys in a full cache, whose evictions take the offered values or
// make room for them. An Offer stores its value only when there is room and
// the key holds nothing; the cap holds throughout; every value the cache
// took is released once, and every value it refused stays the caller's.
func TestFaultOfferRacesEviction(t *testing.T) {
	const maxEntries, keys, goroutines, ops = 3, 8, 8, 60
	faultCase(t, func(t *testing.T, hash func(int) uint64) {
		l := newLedger()
		var m meter
		create, release := metered(l, &m)
		var releasedLeased atomic.Int32
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.MaxEntries, cfg.Create = maxEntries, create
			cfg.Release = func(k int, v *conn) {
				if v.leases.Load() != 0 {
					releasedLeased.Add(1)
				}
				release(k, v)
			}
		})
		var wg sync.WaitGroup
		var offered, refused atomic.Int32
		// One Offer stored and one refused whatever the interleaving
		// below: how many more of each it makes is up to the scheduler.
		first := l.newConn(0)
		require.True(t, c.Offer(0, first))
		m.add()
		offered.Add(1)
		again := l.newConn(0)
		require.False(t, c.Offer(0, again), "an Offer for a key that holds a value")
		refused.Add(1)
		l.keepBack(again)
		for g := range goroutines {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(g), 13))
				for range ops {
					k := r.IntN(keys)
					switch r.IntN(3) {
					case 0:
						v := l.newConn(k)
						if c.Offer(k, v) {
							m.add() // counted from the Offer's return, as the meter says
							offered.Add(1)
						} else {
							refused.Add(1)
							l.keepBack(v)
						}
					case 1:
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(3))*time.Millisecond)
						a, err := c.Acquire(ctx, k)
						cancel()
						if err == nil {
							v := a.Value()
							v.leases.Add(1)
							time.Sleep(time.Duration(r.IntN(2)) * time.Millisecond)
							v.leases.Add(-1)
							a.Release()
						}
					default:
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(3))*time.Millisecond)
						_, _ = c.Get(ctx, k)
						cancel()
					}
				}
			})
		}
		wg.Wait()
		synctest.Wait()
		st := c.Stats()
		assert.EqualValues(t, offered.Load(), st.Offers)
		t.Logf("%d offers stored, %d refused, %d evictions", offered.Load(), refused.Load(), st.Evictions)
		assert.LessOrEqual(t, m.peak.Load(), int64(maxEntries), "values alive plus creations exceeded MaxEntries")
		assert.Zero(t, releasedLeased.Load(), "values released while leased")
		require.NoError(t, roomBack(t, c))
	})
}
