package dskitbench_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/epcache/epcache/transport/grpcpool/dskitbench"
)

func TestMain(m *testing.M) {
	dskitbench.MaybeServe() // scenario 7 re-runs this binary as its server process
	os.Exit(m.Run())
}

// TestScenariosRunAndKeepEpcachesGuarantees runs every scenario at the
// Quick sizes, so that none rots, and checks the figures that are
// guarantees rather than speeds: no call failed because grpcpool closed its
// connection (1, 4), the replacement survives a late report (3), the
// descriptor bound (7), one dial per growth step and no failed call under
// MaxStreamsPerConn (8). (How many dials a scenario takes, or whether a call
// failed for being slow, depends on the machine: those are measured, not
// asserted; grpcpool's own tests assert one dial per address.)
func TestScenariosRunAndKeepEpcachesGuarantees(t *testing.T) {
	cfg := dskitbench.Quick
	for _, s := range dskitbench.Scenarios {
		t.Run("scenario="+s.ID, func(t *testing.T) {
			if s.ID == "6" && testing.Short() {
				t.Skip("benchmarks: not in -short")
			}
			tb, err := s.Measure(cfg)
			if err != nil {
				t.Fatal(err)
			}
			tb.Write(t.Output())
			ep := tb.Data["epcache"]
			switch s.ID {
			case "1":
				if ep["closed_by_pool"] != 0 || ep["calls"] == 0 {
					t.Errorf("epcache: %v calls, %v closed by the pool; want some, and 0", ep["calls"], ep["closed_by_pool"])
				}
			case "3":
				if ep["survived"] != ep["rounds"] || ep["old_closed_by_pool"]+ep["new_closed_by_pool"] != 0 {
					t.Errorf("epcache: %v", ep)
				}
			case "4":
				if ep["closed_by_pool"] != 0 {
					t.Errorf("epcache: %v calls closed by the pool", ep["closed_by_pool"])
				}
			case "8":
				sl := cfg.StreamLimit
				gp := tb.Data[fmt.Sprintf("grpcpool, MaxStreamsPerConn %d", sl.Streams)]
				if want := (sl.Callers + sl.Streams - 1) / sl.Streams; gp["failed"] != 0 || gp["dials"] > float64(want) {
					t.Errorf("grpcpool with MaxStreamsPerConn: %v calls failed, %v dials; want 0 and at most %d (each growth step dialed once)", gp["failed"], gp["dials"], want)
				}
			case "7":
				if ep["peak_sockets_dialer"] > float64(cfg.BudgetMaxConns) || ep["peak_sockets_proc"] > float64(cfg.BudgetMaxConns) {
					t.Errorf("epcache: peak %v sockets (dialer), %v (/proc); want at most %d", ep["peak_sockets_dialer"], ep["peak_sockets_proc"], cfg.BudgetMaxConns)
				}
			}
		})
	}
}
