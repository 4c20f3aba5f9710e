//go:build ucx

package bench_test

import (
	"context"
	"slices"
	"testing"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUCXStorm runs ucxstorm, real UCX endpoints between P workers, through
// every comparator at a size that keeps the race-detector run short (16
// peers × 4 goroutines, as TestEveryComparatorIsCorrect sizes tcpstorm):
// every pair gets an endpoint, nothing leaks (every endpoint created is
// closed with ucp_ep_close_nbx, and the process has as many descriptors
// open afterwards as before), and the exactly-once comparators create one
// endpoint per pair and direction.
func TestUCXStorm(t *testing.T) {
	require.True(t, slices.Contains(bench.Workloads, "ucxstorm"), "built with -tags ucx: ucxstorm is a workload")
	for _, im := range bench.Impls {
		t.Run(im.Name, func(t *testing.T) {
			s := bench.Spec{
				Workload: "ucxstorm", Impl: im.Name, Keys: "uint64", Dist: "uniform",
				Peers: 16, Goroutines: 4, Cost: "none", Seed: 1,
			}
			r, err := bench.Run(context.Background(), s)
			require.NoError(t, err)
			assert.Empty(t, r.Failure)
			assert.Zero(t, r.Leaked)
			assert.Zero(t, r.Errors)
			assert.Equal(t, r.Creates, r.Releases)
			assert.EqualValues(t, s.Peers*(s.Peers-1), r.Distinct, "every pair connected")
			if r.FDsBefore >= 0 {
				assert.Equal(t, r.FDsBefore, r.FDsAfter, "every socket closed")
			}
			if im.ExactlyOnce {
				assert.EqualValues(t, s.Peers*(s.Peers-1), r.Creates, "one endpoint per pair and direction")
				assert.Zero(t, r.Duplicates)
			}
			t.Logf("%s: %v to completion, %d endpoints created, %d duplicates, %d leaked", im.Name, r.Completion, r.Creates, r.Duplicates, r.Leaked)
		})
	}
}
