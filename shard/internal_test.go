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
