//go:build epcache_slowdemo

package epcache

import "sync/atomic"

// This file exists for one demonstration: that make bench-ci fails on a
// build whose evictions cost more (make bench-ci BENCHTAGS=epcache_slowdemo).
// No other build has it; theirs is slowdemo_off.go's no-op.

// slowdemoSlots is how many values of the clock each eviction's extra
// scan reads the lease count of. 128 cost epbench's hotset 47 % more CPU
// per operation at GOMAXPROCS 1 (epcache ÷ otter, medians of 60
// interleaved pairs, 1.92 against 1.30); 80 cost it 33 to 45 % (1.61 to
// 1.75 against the baseline's 1.21, four runs of bench-ci): about twice
// bench-ci's margin of 15 %, so that the demonstration fails however the
// noise of a busy machine moves the medians.
const slowdemoSlots = 80

// slowdemoSink keeps the scan's reads from being dropped.
var slowdemoSink atomic.Int64

// slowdemo walks slowdemoSlots values from the hand and counts their
// leases, changing nothing. The caller holds room.handMu.
func (c *Cache[K, V]) slowdemo() {
	h := &c.room.hand
	n := 0
	for i := range min(slowdemoSlots, len(h.slots)) {
		if s := h.slots[(h.pos+i)%len(h.slots)].Slot(); s != nil {
			n += s.Leased()
		}
	}
	slowdemoSink.Add(int64(n))
}
