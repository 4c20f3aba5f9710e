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
	"weak"

	"github.com/epcache/epcache/internal/fixture"

	"github.com/epcache/epcache/epcache"
)

type bigEndpoint struct {
	_ [1 << 20]byte // big enough that keeping it by mistake shows
}

// Regression: a slot used to keep its first value in a State embedded in the
// slot, which Invalidate could not clear (a reader may still hold it), so a
// released endpoint stayed reachable for as long as the key lived.
func TestReleasedValueIsNotRetained(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, *bigEndpoint]{
		Create: func(context.Context, int) (*bigEndpoint, error) { return new(bigEndpoint), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v1, err := c.Get(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	w1 := weak.Make(v1)
	if !c.Invalidate(1) {
		t.Fatal("invalidate")
	}
	v1 = nil
	v2, err := c.Get(context.Background(), 1) // replacement: the slot stays live
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		runtime.GC()
	}
	if w1.Value() != nil {
		t.Errorf("the released first value of key 1 is still reachable after Invalidate and GC")
	}
	// Control: the second value lives in a heap State and is collected.
	w2 := weak.Make(v2)
	if !c.Invalidate(1) {
		t.Fatal("invalidate")
	}
	v2 = nil
	if _, err := c.Get(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		runtime.GC()
	}
	if w2.Value() != nil {
		t.Errorf("control: the second value is retained too")
	}
}

// blockingCtx stalls the first Err call, which getSlow makes after its
// closed check and before LoadOrInsert: it lets the test hold a Get in that
// window while Close runs.
type blockingCtx struct {
	context.Context
	once    sync.Once
	entered chan struct{}
	proceed chan struct{}
}

func (b *blockingCtx) Err() error {
	b.once.Do(func() { close(b.entered); <-b.proceed })
	return b.Context.Err()
}

var sealRebuildHung atomic.Bool // one spinning goroutine per process is enough

// Regression: a Get that passed getSlow's closed check before Close inserted
// its key while Close was sealing; the insertion's rebuild raced with Seal
// and spun forever (see shard's TestSealDuringRebuild). The Get must return
// ErrClosed.
func TestGetRacingClose(t *testing.T) {
	if sealRebuildHung.Load() {
		t.Skip("already failed in this process")
	}
	trials := 30
	if testing.Short() {
		trials = 3
	}
	for trial := range trials {
		const M = 3566 // the next insertion rebuilds (shard's TestRebuildPointOfOneShard)
		var stallKey atomic.Int64
		stallKey.Store(-1)
		stalled := make(chan struct{})
		delay := time.Duration(rand.N(200)) * time.Microsecond
		c, err := epcache.New(epcache.Config[int, *int]{
			Shards: 1,
			Create: func(_ context.Context, k int) (*int, error) { return &k, nil },
			Release: func(k int, _ *int) {
				if int64(k) == stallKey.Load() {
					close(stalled)
					for start := time.Now(); time.Since(start) < delay; {
					}
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		for k := range M {
			if _, err := c.Get(context.Background(), k); err != nil {
				t.Fatal(err)
			}
		}
		first := -1
		for k := range c.All() {
			first = k // the first slot in array order: Seal stalls on it
			break
		}
		for k := range M {
			if k != first {
				c.Invalidate(k) // Empty slots, still in the array
			}
		}
		stallKey.Store(int64(first))
		bctx := &blockingCtx{Context: context.Background(), entered: make(chan struct{}), proceed: make(chan struct{})}
		getDone := make(chan error, 1)
		go func() {
			_, err := c.Get(bctx, M+1)
			getDone <- err
		}()
		<-bctx.entered // the Get passed the closed check
		closeDone := make(chan struct{})
		go func() { defer close(closeDone); c.Close() }()
		<-stalled // Seal phase 2 has begun
		close(bctx.proceed)
		select {
		case err := <-getDone:
			if err != epcache.ErrClosed {
				t.Fatalf("Get: %v", err)
			}
		case <-time.After(hang):
			sealRebuildHung.Store(true)
			t.Fatalf("trial %d (delay %v): a Get racing Close never returned (rebuild spins on an over-full array)", trial, delay)
		}
		<-closeDone
	}
}

// Regression: a Release that calls runtime.Goexit while the creation
// goroutine releases a value that finished after CreateTimeout used to skip
// settling the slot, which then answered the stale timeout error forever.
// The slot is settled before the release now, and Close reports the Goexit.
//
// It runs in a synctest bubble: the second creation, which has the same
// CreateTimeout, returns at once on the fake clock, however slow the
// machine.
func TestGoexitInLateRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		unblock := make(chan struct{})
		released := make(chan struct{})
		c, err := epcache.New(epcache.Config[int, *int]{
			CreateTimeout: 10 * time.Millisecond,
			Create: func(_ context.Context, k int) (*int, error) {
				if calls.Add(1) == 1 {
					<-unblock // ignores ctx
				}
				return &k, nil
			},
			Release: func(int, *int) {
				close(released)
				runtime.Goexit()
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(context.Background(), 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get: %v; want the CreateTimeout", err)
		}
		close(unblock)
		<-released
		synctest.Wait() // the creation's goroutine has ended, in its Release
		if _, err := c.Get(context.Background(), 1); err != nil {
			t.Errorf("Get after the stuck Create returned: %v (Create calls: %d)", err, calls.Load())
		}
		released = make(chan struct{}) // Close releases the second value: Goexit again
		err = c.Close()
		if err == nil || !strings.Contains(err.Error(), "Release of key 1 called runtime.Goexit") {
			t.Errorf("Close: %v; want both Goexits reported", err)
		}
	})
}

// A Release that calls runtime.Goexit during Close ends only the goroutine
// that ran it: Close still releases every other value and returns.
func TestGoexitInReleaseDuringClose(t *testing.T) {
	var released atomic.Int32
	c, err := epcache.New(epcache.Config[int, int]{
		Create: func(_ context.Context, k int) (int, error) { return k, nil },
		Release: func(k, _ int) {
			released.Add(1)
			if k%10 == 3 {
				runtime.Goexit()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range 100 {
		if _, err := c.Get(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	err = c.Close()
	if err == nil || !strings.Contains(err.Error(), "called runtime.Goexit") {
		t.Errorf("Close: %v; want the Goexits reported", err)
	}
	if n := released.Load(); n != 100 {
		t.Errorf("%d values released; want all 100", n)
	}
	if st := c.Stats(); st.Releases != 100 || st.Live != 0 {
		t.Errorf("Stats %+v; want 100 releases, none live", st)
	}
}

// Regression (issue 14, 2): with Retry, every attempt got the one context of
// the whole creation, so whatever attempt 1 bound to its ctx kept running
// through the backoff and the later attempts. Each attempt's ctx now ends
// when that attempt returns, and the creation's own when Create last
// returns; both before any caller hears of the outcome.
func TestEachAttemptsContextEndsWithIt(t *testing.T) {
	for _, leavable := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			var (
				n     atomic.Int32
				first context.Context
				last  context.Context
			)
			afterFirstReturn := make(chan error, 1)
			c, err := epcache.New(epcache.Config[int, int]{
				Create: func(ctx context.Context, k int) (int, error) {
					if n.Add(1) == 1 {
						first = ctx
						return 0, errors.New("not yet")
					}
					afterFirstReturn <- first.Err()
					last = ctx
					return k, nil
				},
				Retry: func(int, error) (time.Duration, bool) { return 20 * time.Millisecond, true },
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			if leavable { // Create runs on a goroutine of its own
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			v, err := c.Get(ctx, 5)
			if err != nil || v != 5 {
				t.Fatalf("Get = %d, %v", v, err)
			}
			if err := <-afterFirstReturn; !errors.Is(err, context.Canceled) {
				t.Errorf("attempt 1's ctx after it returned: Err() = %v; want context.Canceled", err)
			}
			if err := last.Err(); !errors.Is(err, context.Canceled) {
				t.Errorf("attempt 2's ctx once Get returned: Err() = %v; want context.Canceled", err)
			}
		})
	}
}

// Regression (issue 14, 3): Invalidate moved the slot to Dead and took the
// value before it called Config.Hash again to find the cell; a Hash that
// panicked on that call left the value out of the cache and never released.
// Whichever call of Hash panics now, the value is either still held (and
// released by Close) or released by Invalidate: exactly once either way.
func TestPanickingHashDuringInvalidateLosesNothing(t *testing.T) {
	for panicAt := 1; panicAt <= 3; panicAt++ {
		var calls atomic.Int32 // armed: calls until the panic
		var released atomic.Int32
		c, err := epcache.New(epcache.Config[int, *conn]{
			Create:  func(_ context.Context, k int) (*conn, error) { return newConn(k, 0), nil },
			Release: func(int, *conn) { released.Add(1) },
			Hash: func(k int) uint64 {
				if calls.Add(-1) == 0 {
					panic("hash")
				}
				return uint64(k)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		calls.Store(1 << 30)
		if _, err := c.Get(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		calls.Store(int32(panicAt))
		invalidated, panicked := func() (ok, panicked bool) {
			defer func() { panicked = recover() != nil }()
			return c.Invalidate(1), false
		}()
		calls.Store(1 << 30)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		st := c.Stats()
		if released.Load() != 1 || st.Releases != 1 || st.Live != 0 || st.Ready != 0 {
			t.Errorf("Hash panicking at call %d of Invalidate (panicked %t, invalidated %t): %d Releases, Stats %+v; want the value released exactly once",
				panicAt, panicked, invalidated, released.Load(), st)
		}
	}
}

// Regression (issue 14, 1): a remembered failure stayed in its slot after its
// ErrorTTL passed, and a rebuild reclaimed only Empty slots, so every
// distinct key that ever failed kept its slot, state and error for the life
// of the cache (255 B a key; 1,327 B when Create panicked, a *PanicError
// keeping a whole stack). An expired failure now costs nothing once its
// shard next rebuilds: here, after n other keys have failed and been
// forgotten, the heap a cache keeps is the same whether the first n
// failures were remembered or not.
func TestExpiredFailuresAreReclaimed(t *testing.T) {
	n := 20_000
	if testing.Short() || raceEnabled {
		n = 5_000
	}
	errDead := errors.New("dead peer")
	kept := func(ttl time.Duration, panics bool) float64 {
		c, err := epcache.New(epcache.Config[int, *conn]{
			ErrorTTL: ttl,
			Create: func(context.Context, int) (*conn, error) {
				if panics {
					panic(errDead)
				}
				return nil, errDead
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		grew := fixture.HeapGrowth(func() {
			for k := range n {
				if _, err := c.Get(context.Background(), k); !errors.Is(err, errDead) {
					t.Fatalf("Get(%d): %v", k, err)
				}
			}
			time.Sleep(2 * ttl) // every failure expires
			// n other keys fail, and are forgotten at once: Empty slots,
			// which the rebuilds they cause drop with the expired failures.
			for k := n; k < 2*n; k++ {
				c.Get(context.Background(), k)
				c.Forget(k)
			}
		})
		runtime.KeepAlive(c)
		return float64(grew) / float64(n)
	}
	for _, panics := range []bool{false, true} {
		none := kept(0, panics)
		expired := kept(time.Millisecond, panics)
		t.Logf("Create panics: %t; heap kept per failed key: %.1f B with failures not remembered, %.1f B with ErrorTTL 1ms, expired",
			panics, none, expired)
		if expired-none > 16 {
			t.Errorf("Create panics: %t: %.1f B a key kept by expired failures; want about 0", panics, expired-none)
		}
	}
}
