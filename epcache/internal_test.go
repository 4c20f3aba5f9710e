package epcache

import (
	"testing"
	"unsafe"
)

func TestStripeIsPaddedTo128Bytes(t *testing.T) {
	if got := unsafe.Sizeof(stripe{}); got != 128 {
		t.Fatalf("stripe is %d bytes; want 128", got)
	}
}
