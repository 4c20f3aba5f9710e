package shard

import (
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
