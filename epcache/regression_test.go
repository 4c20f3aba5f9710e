package epcache_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

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
		const M = 3348 // the next insertion rebuilds (shard's TestRebuildPointOfOneShard)
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
		case <-time.After(5 * time.Second):
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
func TestGoexitInLateRelease(t *testing.T) {
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
	if _, err := c.Get(context.Background(), 1); err == nil {
		t.Fatal("want a timeout")
	}
	close(unblock)
	<-released
	time.Sleep(50 * time.Millisecond)
	if _, err := c.Get(context.Background(), 1); err != nil {
		t.Errorf("Get after the stuck Create returned: %v (Create calls: %d)", err, calls.Load())
	}
	released = make(chan struct{}) // Close releases the second value: Goexit again
	err = c.Close()
	if err == nil || !strings.Contains(err.Error(), "Release of key 1 called runtime.Goexit") {
		t.Errorf("Close: %v; want both Goexits reported", err)
	}
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
