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

// The frequency sketch counts, saturates at 15, halves every ten times its
// capacity, and tells a recurring key from a one-off.
func TestSketch(t *testing.T) {
	s := newSketch(100)
	const a, b = 0x1234567, 0x7654321
	if got := s.estimate(a); got != 0 {
		t.Fatalf("estimate of a key never added: %d", got)
	}
	for range 3 {
		s.add(a)
	}
	s.add(b)
	if ea, eb := s.estimate(a), s.estimate(b); ea != 3 || eb != 1 {
		t.Fatalf("estimates %d, %d; want 3, 1", ea, eb)
	}
	for range 20 {
		s.add(a)
	}
	if got := s.estimate(a); got != 15 {
		t.Fatalf("estimate %d after 23 adds; want it saturated at 15", got)
	}
	for i := range uint64(1000) { // ten times the capacity: one halving
		s.add(i * 0x9e3779b97f4a7c15)
	}
	if got := s.estimate(a); got > 8 {
		t.Fatalf("estimate %d after a halving; want at most 8", got)
	}
}
