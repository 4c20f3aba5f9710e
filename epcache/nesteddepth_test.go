package epcache_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/require"
)

// stackDepth calls f with about n more bytes of the stack in use.
//
//go:noinline
func stackDepth(n int, f func()) {
	var pad [1024]byte
	if n <= len(pad) {
		f()
		return
	}
	stackDepth(n-len(pad), f)
	runtime.KeepAlive(&pad)
}

func intCache(t *testing.T) *epcache.Cache[int, int] {
	c, err := epcache.New(epcache.Config[int, int]{
		Create: func(_ context.Context, k int) (int, error) { return k, nil },
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Acquire's doc: "A value leased from one P at a time never grows: one
// goroutine holding several leases of it at once". One goroutine holds a
// lease across one move to another P (a blocking send), then takes and
// ends nested leases from a deeper call (a helper a few frames down, 24
// KiB of stack below): one goroutine, one P at a time, one move, no lines.
func TestNestedFromDeeperAfterOneMoveDoesNotGrow(t *testing.T) {
	for _, procs := range []int{2, 4, 8} {
		t.Run(fmt.Sprint("GOMAXPROCS", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			c := intCache(t)
			ctx := context.Background()
			const depth = 24 << 10
			// Warm: the value, its lease table, and this stack at depth.
			for range 2 {
				l, err := c.Acquire(ctx, 1)
				require.NoError(t, err)
				l.Release()
				stackDepth(depth, func() {
					l, err := c.Acquire(ctx, 1)
					require.NoError(t, err)
					l.Release()
				})
			}
			outer, err := c.Acquire(ctx, 1)
			require.NoError(t, err)
			p0 := currentP()
			p1 := moveOffP(t, p0)
			for range 64 {
				stackDepth(depth, func() {
					inner, err := c.Acquire(ctx, 1)
					if err != nil {
						panic(err)
					}
					inner.Release()
				})
			}
			moved := currentP() != p1
			outer.Release()
			if moved {
				t.Skip("moved again")
			}
			require.Zero(t, epcache.LeaseLines(c, 1),
				"one goroutine, one move (P %d to P %d) while holding a lease, 64 nested leases from 24 KiB deeper: the value grew lease lines", p0, p1)
		})
	}
}

// The same promise, with the goroutine moving while it holds its outer
// lease, once per outer lease (a lease held across a blocking send, a
// nested lease in it after the send): one goroutine, one P at a time. It
// counts the value's lines, not bytes: moving off a P lets other
// goroutines of the test binary run and allocate.
func TestNestedAfterAMovePerHoldDoesNotGrow(t *testing.T) {
	for _, procs := range []int{2, 4, 8} {
		t.Run(fmt.Sprint("GOMAXPROCS", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			c := intCache(t)
			ctx := context.Background()
			l, err := c.Acquire(ctx, 1)
			require.NoError(t, err)
			l.Release()
			moves := 0
			for range 64 {
				outer, err := c.Acquire(ctx, 1)
				require.NoError(t, err)
				p := currentP()
				if moveOffP(t, p) != p {
					moves++
				}
				inner, err := c.Acquire(ctx, 1)
				require.NoError(t, err)
				inner.Release()
				outer.Release()
			}
			require.Zero(t, epcache.LeaseLines(c, 1),
				"one goroutine, 64 outer leases each held across a move (%d moves) with one nested lease: the value grew lease lines", moves)
		})
	}
}
