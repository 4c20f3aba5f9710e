package epcache_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
)

type rvVal struct {
	key      int
	id       int64
	released atomic.Int32
	leases   atomic.Int32
}

type rvBook struct {
	max      int64
	alive    atomic.Int64 // created, not yet released
	running  atomic.Int64 // Creates running
	peak     atomic.Int64
	ids      atomic.Int64
	created  atomic.Int64
	releases atomic.Int64
	mu       sync.Mutex
	errs     []string
	all      sync.Map // id -> *rvVal

	slowCreate bool
}

func (b *rvBook) fail(format string, args ...any) {
	b.mu.Lock()
	if len(b.errs) < 20 {
		b.errs = append(b.errs, fmt.Sprintf(format, args...))
	}
	b.mu.Unlock()
}

func (b *rvBook) check(where string) {
	n := b.alive.Load() + b.running.Load()
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if b.max > 0 && n > b.max {
		b.fail("%s: alive %d + running %d = %d > MaxEntries %d", where, b.alive.Load(), b.running.Load(), n, b.max)
	}
}

func (b *rvBook) config(maxEntries int, slowRelease bool) epcache.Config[int, *rvVal] {
	return epcache.Config[int, *rvVal]{
		MaxEntries: maxEntries,
		Create: func(ctx context.Context, k int) (*rvVal, error) {
			b.alive.Add(1) // alive counts creations running and values alive
			b.check("Create")
			if rand.IntN(4) == 0 {
				runtime.Gosched()
			}
			if b.slowCreate && rand.IntN(4) == 0 {
				time.Sleep(time.Duration(rand.IntN(400)) * time.Microsecond)
			}
			if rand.IntN(50) == 0 {
				b.alive.Add(-1)
				return nil, errors.New("flaky")
			}
			v := &rvVal{key: k, id: b.ids.Add(1)}
			b.created.Add(1)
			b.all.Store(v.id, v)
			return v, nil
		},
		Release: func(k int, v *rvVal) {
			if v.released.Add(1) != 1 {
				b.fail("value %d of key %d released twice", v.id, k)
			}
			if n := v.leases.Load(); n != 0 {
				b.fail("value %d of key %d released while %d leases hold it", v.id, k, n)
			}
			if slowRelease && rand.IntN(3) == 0 {
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			}
			b.releases.Add(1)
			b.alive.Add(-1)
		},
	}
}

func rvEnvInt(name string, def int) int {
	if s := os.Getenv(name); s != "" {
		n, _ := strconv.Atoi(s)
		return n
	}
	return def
}

// MaxEntries: "bounds at every instant the values created and not
// yet released plus the creations running"; Release "exactly once for every
// value Create returned"; "A value a Lease holds is never released before
// the lease ends"; and with nothing held for long, a waiter with a long
// context is served (no unit of room is lost). Random Get, Acquire (held a
// little, sometimes nested), Invalidate, CompareAndInvalidate, Offer, and
// short contexts, on a cache of 4 values for 24 keys.
func TestStressRoomUnderEveryOperation(t *testing.T) {
	if !*long {
		t.Skip("a campaign of seconds whose long contexts assume a machine not starved: make stress runs it")
	}
	procs := []int{1, 2, 4, 8}
	dur := time.Duration(rvEnvInt("RV_MS", 1500)) * time.Millisecond
	for _, p := range procs {
		t.Run(fmt.Sprintf("GOMAXPROCS%d", p), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(p))
			rvRoomStress(t, 4, 24, 32, dur/time.Duration(len(procs)), 0)
		})
	}
}

// The same with IdleTimeout (idle removal racing leases and evictions), and
// with idle removal alone, at a hot key's leases from every worker.
func TestStressRoomWithIdleRemoval(t *testing.T) {
	if !*long {
		t.Skip("a campaign of seconds whose long contexts assume a machine not starved: make stress runs it")
	}
	dur := time.Duration(rvEnvInt("RV_MS", 1500)) * time.Millisecond
	for _, p := range []int{1, 2, 4, 8} {
		for _, maxEntries := range []int{0, 4} {
			t.Run(fmt.Sprintf("GOMAXPROCS%d/max%d", p, maxEntries), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(p))
				rvRoomStress(t, maxEntries, 24, 32, dur/8, time.Millisecond)
			})
		}
	}
}

// The same with room for most keys, so that Offers succeed and race
// creations, Invalidates and evictions.
func TestStressRoomWithOffers(t *testing.T) {
	if !*long {
		t.Skip("a campaign of seconds whose long contexts assume a machine not starved: make stress runs it")
	}
	dur := time.Duration(rvEnvInt("RV_MS", 1500)) * time.Millisecond
	for _, p := range []int{1, 2, 4, 8} {
		t.Run(fmt.Sprintf("GOMAXPROCS%d", p), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(p))
			rvRoomStress(t, 20, 24, 32, dur/4, 0)
		})
	}
}

// The same with CreateTimeout, Retry and Creates that outlast it: late values
// are released, and a timed-out Create still counts.
func TestStressRoomWithTimeouts(t *testing.T) {
	if !*long {
		t.Skip("a campaign of seconds whose long contexts assume a machine not starved: make stress runs it")
	}
	dur := time.Duration(rvEnvInt("RV_MS", 1500)) * time.Millisecond
	for _, p := range []int{1, 2, 4, 8} {
		t.Run(fmt.Sprintf("GOMAXPROCS%d", p), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(p))
			rvRoomStressWith(t, 4, 24, 32, dur/4, 0, func(b *rvBook, cfg *epcache.Config[int, *rvVal]) {
				b.slowCreate = true
				cfg.CreateTimeout = 200 * time.Microsecond
				cfg.Retry = func(n int, _ error) (time.Duration, bool) { return 10 * time.Microsecond, n < 3 }
			})
		})
	}
}

func rvRoomStress(t *testing.T, maxEntries, keys, workers int, dur, idle time.Duration) {
	rvRoomStressWith(t, maxEntries, keys, workers, dur, idle, nil)
}

func rvRoomStressWith(t *testing.T, maxEntries, keys, workers int, dur, idle time.Duration, tweak func(*rvBook, *epcache.Config[int, *rvVal])) {
	b := &rvBook{max: int64(maxEntries)}
	cfg := b.config(maxEntries, true)
	cfg.IdleTimeout = idle
	if tweak != nil {
		tweak(b, &cfg)
	}
	c, err := epcache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var longFails atomic.Int64
	var lastLongErr atomic.Value
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for !stop.Load() {
				k := r.IntN(keys)
				if r.IntN(3) == 0 {
					k = 0 // hot: leased from every core, its lines grow
				}
				switch op := r.IntN(20); {
				case op < 8: // Acquire, hold briefly
					long := r.IntN(4) == 0
					var ctx context.Context
					var cancel context.CancelFunc
					if long {
						ctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
					} else if r.IntN(3) == 0 {
						ctx, cancel = context.WithCancel(context.Background())
					} else {
						ctx, cancel = context.WithTimeout(context.Background(), time.Duration(r.IntN(300))*time.Microsecond)
					}
					l, err := c.Acquire(ctx, k)
					cancel()
					if err != nil {
						if long && !errors.Is(err, epcache.ErrClosed) && !errors.Is(err, epcache.ErrCreateTimeout) && err.Error() != "flaky" {
							longFails.Add(1)
							lastLongErr.Store(err.Error())
						}
						continue
					}
					v := l.Value()
					v.leases.Add(1)
					if v.released.Load() != 0 {
						b.fail("Acquire returned released value %d", v.id)
					}
					if r.IntN(4) == 0 {
						l2, err := c.Acquire(context.Background(), k)
						if err == nil {
							v2 := l2.Value()
							v2.leases.Add(1)
							runtime.Gosched()
							v2.leases.Add(-1)
							l2.Release()
						}
					}
					if r.IntN(2) == 0 {
						time.Sleep(time.Duration(r.IntN(100)) * time.Microsecond)
					}
					if v.released.Load() != 0 {
						b.fail("value %d released under its lease", v.id)
					}
					v.leases.Add(-1)
					l.Release()
				case op < 12: // Get with background ctx (creation inline)
					_, _ = c.Get(context.Background(), k)
				case op < 14:
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(200))*time.Microsecond)
					_, _ = c.Get(ctx, k)
					cancel()
				case op < 16:
					c.Invalidate(k)
				case op < 17:
					if v, ok := c.Load(k); ok {
						c.CompareAndInvalidate(k, v)
					}
				case op < 19:
					v := &rvVal{key: k, id: b.ids.Add(1)}
					b.all.Store(v.id, v)
					if !c.Offer(k, v) {
						b.all.Delete(v.id)
					} else {
						b.alive.Add(1) // its Release may have come first: alive dips, never overshoots
						b.created.Add(1)
					}
				default:
					runtime.Gosched()
				}
			}
		})
	}
	time.Sleep(dur)
	stop.Store(true)
	wg.Wait()
	st := c.Stats()
	if st.Lingering != 0 {
		t.Errorf("lingering %d with no lease held", st.Lingering)
	}
	if maxEntries > 0 && idle == 0 && st.Room != b.alive.Load() {
		t.Errorf("before Close: Stats.Room %d, alive %d (Len %d)", st.Room, b.alive.Load(), c.Len())
	}
	if maxEntries > 0 {
		// After the storm: the cache full, a fresh Get for a new key must be
		// served at once (evicting), not wait.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		for k := keys; k < keys+2*maxEntries; k++ {
			if _, err := c.Get(ctx, k); err != nil && err.Error() != "flaky" && !errors.Is(err, epcache.ErrCreateTimeout) {
				t.Errorf("after the storm, Get(%d): %v (Room %d)", k, err, c.Stats().Room)
				break
			}
		}
		cancel()
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if b.alive.Load() != 0 {
		t.Errorf("after Close: %d values alive (created %d, released %d)", b.alive.Load(), b.created.Load(), b.releases.Load())
	}
	b.all.Range(func(_, x any) bool {
		v := x.(*rvVal)
		if n := v.released.Load(); n != 1 {
			t.Errorf("value %d of key %d released %d times", v.id, v.key, n)
		}
		return true
	})
	if n := longFails.Load(); n > 0 {
		t.Errorf("%d Acquires with a 3 s context failed though no lease is held for more than ~1 ms; last: %v", n, lastLongErr.Load())
	}
	for _, e := range b.errs {
		t.Error(e)
	}
	t.Logf("offers %d; created %d, released %d, peak %d, stats %+v", st.Offers, b.created.Load(), b.releases.Load(), b.peak.Load(), st)
}
