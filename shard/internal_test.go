package shard

import (
	"math"
	"runtime"
	"testing"
	"unsafe"
)

// Shards are padded so that no two of them share a pair of cache lines; this
// fails if a field is added without adjusting shardSize.
func TestShardIsPaddedTo128Bytes(t *testing.T) {
	if got := unsafe.Sizeof(shard[string, *int]{}); got != shardSize {
		t.Fatalf("shard is %d bytes but shardSize says %d", got, shardSize)
	}
	if got := unsafe.Sizeof(shardPadded[string, *int]{}); got != 128 {
		t.Fatalf("shardPadded is %d bytes; want 128", got)
	}
	if got := unsafe.Sizeof(shardPadded[[64]byte, [64]byte]{}); got != 128 {
		t.Fatalf("shardPadded is %d bytes for large types; want 128 (the shard holds no K or V)", got)
	}
}

// groupLayout is the layout of every group[K, V], which Get relies on, and
// a group is one cache line on 64-bit platforms.
func TestGroupLayout(t *testing.T) {
	check := func(size, offset uintptr) {
		t.Helper()
		if size != groupSize || offset != slotsOffset {
			t.Fatalf("group is %d bytes with its slots at %d; groupLayout says %d and %d", size, offset, groupSize, slotsOffset)
		}
	}
	check(unsafe.Sizeof(group[string, *int]{}), unsafe.Offsetof(group[string, *int]{}.slots))
	check(unsafe.Sizeof(group[[64]byte, [64]byte]{}), unsafe.Offsetof(group[[64]byte, [64]byte]{}.slots))
	if unsafe.Sizeof(uintptr(0)) == 8 && groupSize != 64 {
		t.Fatalf("a group is %d bytes; want one 64-byte cache line", groupSize)
	}
}

// TestLeaseTableOwnsItsLines pins the lease table's size to the allocation
// size class of 128-byte objects, which start on 128-byte boundaries: a
// smaller table shares its tickets' cache line with another value's, and
// leases of two peers on two Ps contend.
func TestLeaseTableOwnsItsLines(t *testing.T) {
	if n := unsafe.Sizeof(leaseTable{}); n != 128 {
		t.Fatalf("leaseTable is %d bytes, want 128", n)
	}
	if off := unsafe.Offsetof(leaseTable{}.tickets); off != 0 {
		t.Fatalf("the tickets start at byte %d, want 0", off)
	}
}

// A handle (16 bytes) is never the size of a slot of a key of up to 8
// bytes (32): were they one size class, the handles eviction makes as
// values are published would interleave with the slots in memory, and a
// hit on one of many peers would miss the cache more (BenchmarkHit's
// epcache-lifecycle at 65,536 peers, bench/direct, ran 30% slower so).
func TestHandleSizeClassIsNotASlots(t *testing.T) {
	if got := unsafe.Sizeof(Handle[uint64, *int]{}); got > 16 {
		t.Errorf("a Handle is %d bytes", got)
	}
	if h, s := unsafe.Sizeof(Handle[uint64, *int]{}), unsafe.Sizeof(Slot[uint64, *int]{}); h == s {
		t.Errorf("a Handle and a Slot of a uint64 key are both %d bytes", h)
	}
}

// A lease finds its P's first line by the mask kept in contended, which is
// the lines' own once grow made them and 0 (line 0, inside any lines) in
// the moment between; the count and the watch bit around it are left as
// they were.
func TestLineOfIsThePsFirstLine(t *testing.T) {
	for _, procs := range []int{1, 2, 3, 16, 64, 200} {
		tb := new(leaseTable)
		tb.contended.Store(contendedWatch | growAfter)
		n := min(ceilPow2(linesPerP*procs), maxLines)
		h := newLines(n)
		tb.lines.Store(h)
		for pid := range uint64(2*procs + 5) {
			if got := lineOf(tb, h, pid); got != lineAt(h, uint64(0)) {
				t.Fatalf("GOMAXPROCS %d, before the mask is stored: P %d gets line %d, want 0", procs, pid, lineIndex(h, got))
			}
		}
		tb.contended.Or(uint64(n-1) << contendedMaskShift)
		for pid := range uint64(2*procs + 5) {
			if got, want := lineOf(tb, h, pid), lineAt(h, pid*linesPerP); got != want {
				t.Fatalf("GOMAXPROCS %d: P %d gets line %d, want %d", procs, pid, lineIndex(h, got), lineIndex(h, want))
			}
		}
		if c := tb.contended.Load(); c&contendedCount != growAfter || c&contendedWatch == 0 {
			t.Fatalf("contended is %#x: the count or the watch bit changed", c)
		}
	}
	// grow stores the mask of the lines it made.
	tb := new(leaseTable)
	h := tb.grow()
	if got, want := tb.contended.Load()&contendedMask>>contendedMaskShift, h.mask.Load(); got != want {
		t.Fatalf("grow left mask %d in contended, its lines' is %d", got, want)
	}
}

func lineIndex(h, l *leaseLine) int {
	return int((uintptr(unsafe.Pointer(l)) - uintptr(unsafe.Pointer(h))) / unsafe.Sizeof(*h))
}

// A grown value costs what lease.go says, as the allocator counts it (size
// classes included): 128 bytes a line, lines a power of two, so that no
// allocation is rounded up, beside the 128-byte table.
func TestGrownTableMemory(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, c := range []struct{ procs, bytes int }{
		{2, 1 << 10}, {3, 2 << 10}, {4, 2 << 10}, {8, 4 << 10}, {16, 8 << 10}, {64, 8 << 10},
	} {
		runtime.GOMAXPROCS(c.procs)
		// The least of a few rounds: the runtime allocates now and then
		// for itself (after GOMAXPROCS changed, above all).
		got := math.MaxInt
		for range 5 {
			const n = 200
			tables := make([]*leaseTable, n)
			for i := range tables {
				tables[i] = new(leaseTable)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for _, tb := range tables {
				tb.grow()
			}
			runtime.ReadMemStats(&after)
			got = min(got, int(after.TotalAlloc-before.TotalAlloc)/n)
		}
		if got != c.bytes {
			t.Errorf("GOMAXPROCS %d: growing a value's lines allocates %d bytes, want %d", c.procs, got, c.bytes)
		}
		if got := unsafe.Sizeof(leaseTable{}); got != 128 {
			t.Errorf("a lease table is %d bytes, want 128", got)
		}
	}
}
