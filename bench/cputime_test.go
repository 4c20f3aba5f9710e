//go:build unix

package bench_test

import (
	"context"
	"testing"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Where the process's CPU time can be read, a run reports it per
// operation; Run leaves the pair and the spin ratio, epbench's, unset.
func TestRunsReportCPUPerOperation(t *testing.T) {
	for _, w := range []string{"hit", "storm", "churn", "lease", "hotset"} {
		t.Run(w, func(t *testing.T) {
			s := spec(w, "epcache", "uint64")
			if w == "storm" {
				s.Cost = "sleep:100us"
			}
			r, err := bench.Run(context.Background(), s)
			require.NoError(t, err)
			require.Empty(t, r.Failure)
			assert.Positive(t, r.CPUPerOp, "CPU per operation")
			assert.Zero(t, r.Pair)
			assert.Zero(t, r.SpinRatio)
		})
	}
}
