package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// getAndUse is what a cache without leases offers a sender: Get, then use.
type getAndUse[K comparable] struct{ Cache[K] }

func (g getAndUse[K]) Lease(ctx context.Context, key K, f func(*Endpoint)) error {
	ep, err := g.Get(ctx, key)
	if err != nil {
		return err
	}
	f(ep)
	return nil
}

// An Invalidate that comes while an endpoint is used: every Leaser releases
// it only after the use, exactly once; Get-then-use releases it under the
// use, and the ledger counts that. The interleaving is forced (the
// Invalidate runs inside the use), so nothing here depends on timing.
func TestLeasersNeverReleaseUnderAUse(t *testing.T) {
	leasers := map[string]func(Env[uint64]) Leaser[uint64]{
		"getAndUse": func(env Env[uint64]) Leaser[uint64] { return getAndUse[uint64]{newMutex(env)} },
	}
	for _, im := range Impls {
		if !im.Leases {
			continue
		}
		leasers[im.Name] = func(env Env[uint64]) Leaser[uint64] {
			c, err := New(im.Name, env)
			require.NoError(t, err)
			return c.(Leaser[uint64])
		}
	}
	for name, mk := range leasers {
		t.Run(name, func(t *testing.T) {
			l := NewLedger(1, MustCost("none"), 0)
			c := mk(Env[uint64]{
				Create:  func(ctx context.Context, k uint64) (*Endpoint, error) { return l.Create(ctx, int(k)) },
				Release: func(_ uint64, ep *Endpoint) { l.Release(ep) },
				Peers:   1,
			})
			var inUse bool
			err := c.Lease(context.Background(), 0, func(ep *Endpoint) {
				ep.using.Add(1)
				assert.True(t, c.Invalidate(0))
				inUse = l.Counts().Releases != 0
				ep.using.Add(-1)
			})
			require.NoError(t, err)
			require.NoError(t, c.Close())
			counts := l.Counts()
			assert.EqualValues(t, 1, counts.Creates)
			assert.EqualValues(t, 1, counts.Releases, "released exactly once")
			if name == "getAndUse" {
				assert.True(t, inUse, "released during the use")
				assert.EqualValues(t, 1, counts.ReleasedInUse, "the ledger counts it")
				return
			}
			assert.False(t, inUse, "released during the use")
			assert.Zero(t, counts.ReleasedInUse)
		})
	}
}
