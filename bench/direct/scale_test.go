package direct_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/internal/fixture"

	"github.com/epcache/epcache/epcache"
	xsync4 "github.com/puzpuzpuz/xsync/v4"
	"github.com/stretchr/testify/require"
)

// BenchmarkMillionPeers fills a cache with a million peers in a storm and
// reports the heap it keeps per entry (B/entry, the values themselves not
// counted) beside xsync v4's Map holding the same pointers; ns/peer is the
// storm's wall time per peer. The target is epcache's B/entry ≤ xsync4's.
func BenchmarkMillionPeers(b *testing.B) {
	eps := peers(millionPeers)
	b.Run("impl=epcache", func(b *testing.B) {
		for range b.N {
			c, err := epcache.New(epcache.Config[int, *endpoint]{
				Create: func(_ context.Context, k int) (*endpoint, error) { return &eps[k], nil },
			})
			require.NoError(b, err)
			var took time.Duration
			grew := fixture.HeapGrowth(func() {
				start := time.Now()
				fixture.StormFill(c, millionPeers, 64)
				took = time.Since(start)
			})
			b.ReportMetric(float64(grew)/millionPeers, "B/entry")
			b.ReportMetric(float64(took)/millionPeers, "ns/peer")
			require.NoError(b, c.Close())
		}
	})
	b.Run("impl=xsync4", func(b *testing.B) {
		for range b.N {
			m := xsync4.NewMap[int, *endpoint]()
			var took time.Duration
			grew := fixture.HeapGrowth(func() {
				start := time.Now()
				var wg sync.WaitGroup
				const goroutines = 64
				for g := range goroutines {
					wg.Go(func() {
						for k := g % (goroutines / 2); k < millionPeers; k += goroutines / 2 {
							m.LoadOrStore(k, &eps[k])
						}
					})
				}
				wg.Wait()
				took = time.Since(start)
			})
			runtime.KeepAlive(m)
			b.ReportMetric(float64(grew)/millionPeers, "B/entry")
			b.ReportMetric(float64(took)/millionPeers, "ns/peer")
		}
	})
}
