package shard

import (
	"math"
	"runtime"
	"sync"
	"testing"
	"unsafe"
)

// Leases that reach a value's growth at once (each catching another hold
// of its first ticket from another P) make its lines once: one allocation
// per value, what the package comment says a grown value costs, however
// many leases race for it.
func TestLinesAreMadeOncePerValue(t *testing.T) {
	const procs, values, racers = 4, 2000, 4
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	lines := int(unsafe.Sizeof(leaseLine{})) * ceilPow2(linesPerP*procs)
	// The least of a few rounds: beside the lines, the racers' goroutines
	// allocate a few hundred bytes, and the runtime now and then more for
	// itself; a value's lines made twice is lines more.
	extra := math.MaxInt
	for range 3 {
		tables := make([]*leaseTable, values)
		for i := range tables {
			tables[i] = new(leaseTable)
			tables[i].contended.Store(growAfter - 1)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var start, wg sync.WaitGroup
		start.Add(1)
		for r := range racers {
			wg.Go(func() {
				// A hold of its own (generation r+1) on P 1, caught from P 0.
				w := uint64(ticketHeld|ticketFresh) | pidBits[uint64](1) | identityHint(uint64(r+1)) | uint64(r+1)
				start.Wait()
				for _, tb := range tables {
					tb.caught(w, pidBits[uint64](0))
				}
			})
		}
		start.Done()
		wg.Wait()
		runtime.ReadMemStats(&after)
		for i, tb := range tables {
			if tb.lines.Load() == nil {
				t.Fatalf("value %d: no lines after %d pieces of evidence", i, growAfter-1+racers)
			}
		}
		extra = min(extra, int(after.TotalAlloc-before.TotalAlloc)-values*lines)
	}
	if extra >= lines {
		t.Errorf("%d values grown by %d leases each at once: %d bytes allocated beyond one set of lines each (%d bytes), %.2f sets more per value", values, racers, extra, lines, float64(extra)/float64(values*lines))
	}
}
