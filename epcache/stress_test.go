package epcache_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStress runs 64 goroutines over 1,024 keys with random Get, Load,
// Invalidate and CompareAndInvalidate, against a Create that sometimes fails
// and sometimes yields. When half of them have done their share, the cache is
// closed while the other half are still going.
// The ledger asserts that no two Creates of a key ever overlapped and that
// every created value was released exactly once; goleak (TestMain) that no
// goroutine is left.
func TestStress(t *testing.T) {
	const goroutines, keys = 64, 1024
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		ops := 3000
		if hash != nil {
			ops = 300 // every lookup walks one long collision chain
		}
		if testing.Short() {
			ops /= 10
		}
		l := newLedger()
		errFlaky := errors.New("flaky peer")
		c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
			cfg.Create = func(ctx context.Context, key int) (*conn, error) {
				l.enter(key)
				defer l.leave(key)
				runtime.Gosched() // widen the window for a second creator
				if rand.IntN(20) == 0 {
					return nil, errFlaky
				}
				return l.newConn(key), nil
			}
		})
		var wg, firstHalf sync.WaitGroup
		var failures sync.Map
		for g := range goroutines {
			wg.Add(1)
			finite := g%2 == 0
			if finite {
				firstHalf.Add(1)
			}
			go func() {
				defer wg.Done()
				if finite {
					defer firstHalf.Done()
				}
				r := rand.New(rand.NewPCG(uint64(g), 1))
				for i := 0; i < ops || !finite; i++ {
					key := r.IntN(keys)
					switch op := r.IntN(100); {
					case op < 70:
						v, err := c.Get(context.Background(), key)
						switch {
						case errors.Is(err, epcache.ErrClosed):
							return
						case err != nil && !errors.Is(err, errFlaky):
							failures.Store(err.Error(), true)
						case err == nil && (v == nil || v.key != key):
							failures.Store("Get returned another key's value", true)
						}
					case op < 85:
						if v, ok := c.Load(key); ok && v.key != key {
							failures.Store("Load returned another key's value", true)
						}
					case op < 93:
						c.Invalidate(key)
					default:
						if v, ok := c.Load(key); ok {
							c.CompareAndInvalidate(key, v)
						}
					}
				}
			}()
		}
		// The other half stop only when Get says ErrClosed.
		firstHalf.Wait()
		require.NoError(t, c.Close())
		wg.Wait()
		failures.Range(func(k, _ any) bool { t.Error(k); return true })
		st := c.Stats()
		assert.Positive(t, st.Waits, "the storm should make callers wait on each other")
		assert.Positive(t, st.Releases)
		t.Logf("%+v", st)
		// newCache's cleanup closes again (a no-op) and checks the ledger.
	})
}
