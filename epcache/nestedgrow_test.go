package epcache_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	_ "unsafe"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/require"
)

//go:linkname linkedProcPin runtime.procPin
func linkedProcPin() int

//go:linkname linkedProcUnpin runtime.procUnpin
func linkedProcUnpin()

func currentP() int {
	p := linkedProcPin()
	linkedProcUnpin()
	return p
}

func moveOffP(t *testing.T, from int) int {
	t.Helper()
	for i := 0; i < 200000; i++ {
		if p := currentP(); p != from {
			return p
		}
		if i%2 == 0 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Microsecond)
		}
	}
	t.Fatalf("never moved off P %d", from)
	return -1
}

// Acquire's doc: "A value leased from one P at a time never grows:
// one goroutine holding several leases of it at once, or goroutines taking
// turns on one P." One goroutine holds a lease across a blocking call (it
// moves to another P meanwhile, as a goroutine blocked in a send does),
// then takes and ends nested leases of the same value on its new P: the
// value is leased from one P at a time, and must not grow lines (1 KiB at
// GOMAXPROCS 2), so the nested leases allocate nothing.
func TestALeaseHeldAcrossAMoveThenNestedDoesNotGrow(t *testing.T) {
	for _, procs := range []int{2, 4, 8} {
		t.Run(fmt.Sprint("GOMAXPROCS", procs), func(t *testing.T) { heldAcrossMove(t, procs) })
	}
}

func heldAcrossMove(t *testing.T, procs int) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	c, err := epcache.New(epcache.Config[int, int]{
		Create: func(_ context.Context, k int) (int, error) { return k, nil },
	})
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	// Warm the value's lease table.
	l, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	l.Release()

	outer, err := c.Acquire(ctx, 1) // held across the "blocking send"
	require.NoError(t, err)
	p0 := currentP()
	p1 := moveOffP(t, p0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 64 {
		inner, err := c.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		inner.Release()
	}
	runtime.ReadMemStats(&after)
	outer.Release()
	if currentP() != p1 {
		t.Skip("moved again")
	}
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<10),
		"64 nested leases by one goroutine on one P (%d, after its outer lease was taken on P %d) allocated %d bytes: the value grew lease lines", p1, p0, after.TotalAlloc-before.TotalAlloc)
}

// the same promise, with no move of the leasing goroutine at all.
// The Acquire that creates a value gets a lease its creator took for it
// (Create runs on a goroutine of its own when the Acquire's context can
// end). If that creator ran on another P, every nested lease the claimer
// takes while it holds that first lease counts as another core's: one
// goroutine on one P grows the value's lines.
func TestAClaimersLeaseThenNestedDoesNotGrow(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	var claimerP atomic.Int64
	c, err := epcache.New(epcache.Config[int, int]{
		Create: func(_ context.Context, k int) (int, error) {
			moveOffP(t, int(claimerP.Load())) // the creator runs on the other P
			return k, nil
		},
	})
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background()) // a context that can end: Create on its own goroutine
	defer cancel()
	claimerP.Store(int64(currentP()))
	outer, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	p := currentP()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 64 {
		inner, err := c.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		inner.Release()
	}
	runtime.ReadMemStats(&after)
	moved := currentP() != p
	outer.Release()
	if moved {
		t.Skip("the claimer moved")
	}
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<10),
		"64 nested leases by the claimer, on P %d throughout, inside the lease its creator took for it, allocated %d bytes: the value grew lease lines", p, after.TotalAlloc-before.TotalAlloc)
}
