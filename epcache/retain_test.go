package epcache_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// payload is a value the tests below hold only weakly, so that a
// collection shows whether the cache still holds it.
type payload struct {
	key int
	_   [56]byte
}

// reachable counts the values of ws that survive a full collection.
func reachable(ws []weak.Pointer[payload]) int {
	runtime.GC()
	runtime.GC()
	n := 0
	for _, w := range ws {
		if w.Value() != nil {
			n++
		}
	}
	return n
}

// Once the cache has given a value up and its Release has returned, the
// cache keeps no reference to it, with MaxEntries and IdleTimeout as
// without: a transport whose peers come and go must not keep every
// connection it ever made. Nor does what the cache keeps for eviction grow
// with the values that came and went. A closed cache that its owner keeps
// holds none of the values it released.
func TestReleasedValuesAreNotKept(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		maxEntries int
		idle       time.Duration
		// run makes values, gives them up, and returns weak pointers to
		// every value released.
		run func(t *testing.T, c *epcache.Cache[int, *payload]) []weak.Pointer[payload]
	}{
		{"Invalidate, MaxEntries never reached", 1000, 0, func(t *testing.T, c *epcache.Cache[int, *payload]) []weak.Pointer[payload] {
			var ws []weak.Pointer[payload]
			for k := range 2000 {
				v, err := c.Get(ctx, k)
				require.NoError(t, err)
				ws = append(ws, weak.Make(v))
				require.True(t, c.Invalidate(k))
			}
			return ws
		}},
		{"Invalidate, no MaxEntries", 0, 0, func(t *testing.T, c *epcache.Cache[int, *payload]) []weak.Pointer[payload] {
			var ws []weak.Pointer[payload]
			for k := range 2000 {
				v, err := c.Get(ctx, k)
				require.NoError(t, err)
				ws = append(ws, weak.Make(v))
				require.True(t, c.Invalidate(k))
			}
			return ws
		}},
		{"idle removal, MaxEntries never reached", 1000, time.Hour, func(t *testing.T, c *epcache.Cache[int, *payload]) []weak.Pointer[payload] {
			var ws []weak.Pointer[payload]
			for k := range 1000 {
				v, err := c.Get(ctx, k)
				require.NoError(t, err)
				ws = append(ws, weak.Make(v))
			}
			for range shard.IdleSteps + 1 {
				epcache.SweepNow(c)
			}
			require.Zero(t, c.Len(), "the sweeps removed every value")
			// An idle removal's Release runs on a goroutine of its own.
			for deadline := time.Now().Add(hang); c.Stats().Releases < 1000; time.Sleep(time.Millisecond) {
				require.True(t, time.Now().Before(deadline), "the idle values' Releases never returned: %+v", c.Stats())
			}
			return ws
		}},
		{"eviction", 4, 0, func(t *testing.T, c *epcache.Cache[int, *payload]) []weak.Pointer[payload] {
			var ws []weak.Pointer[payload]
			for k := range 2000 {
				v, err := c.Get(ctx, k)
				require.NoError(t, err)
				ws = append(ws, weak.Make(v))
			}
			// The last values are still held: those are not released.
			var released []weak.Pointer[payload]
			for k, w := range ws {
				if _, ok := c.Load(k); !ok {
					released = append(released, w)
				}
			}
			require.Len(t, released, 2000-4)
			return released
		}},
		{"churn of two keys under MaxEntries 4", 4, 0, func(t *testing.T, c *epcache.Cache[int, *payload]) []weak.Pointer[payload] {
			var ws []weak.Pointer[payload]
			rounds := 100_000
			if testing.Short() || raceEnabled {
				rounds = 10_000
			}
			for i := range rounds {
				k := i % 2
				v, err := c.Get(ctx, k)
				require.NoError(t, err)
				if i%100 == 0 {
					ws = append(ws, weak.Make(v))
				}
				require.True(t, c.Invalidate(k))
			}
			return ws
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var all []weak.Pointer[payload]
			c, err := epcache.New(epcache.Config[int, *payload]{
				Create: func(_ context.Context, k int) (*payload, error) {
					v := &payload{key: k}
					mu.Lock()
					all = append(all, weak.Make(v))
					mu.Unlock()
					return v, nil
				},
				MaxEntries:  tc.maxEntries,
				IdleTimeout: tc.idle,
			})
			require.NoError(t, err)
			ws := tc.run(t, c)
			assert.Zero(t, reachable(ws), "released values still reachable after a collection (%d released)", len(ws))
			if tc.maxEntries > 0 {
				// The handles of values gone: at most twice the room
				// taken plus two batches of freshly published ones.
				assert.LessOrEqual(t, epcache.ClockLen(c), 2*tc.maxEntries+2*64, "entries the eviction clock keeps")
			}
			require.NoError(t, c.Close())
			mu.Lock()
			defer mu.Unlock()
			assert.Zero(t, reachable(all), "values the closed cache still holds (%d made)", len(all))
			runtime.KeepAlive(c)
		})
	}
}
