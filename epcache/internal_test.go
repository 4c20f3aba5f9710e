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

// The frequency sketch counts, saturates at 15, halves every thirty times
// its capacity, and tells a recurring key from a one-off.
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
	for i := range uint64(9000) { // ninety times the capacity: a halving, or three
		s.add(i * 0x9e3779b97f4a7c15)
	}
	if got := s.estimate(a); got > 8 {
		t.Fatalf("estimate %d after a halving; want at most 8", got)
	}
}

// A key's four counters lie in one cache line of the sketch, in four words
// of their own.
func TestSketchCountersShareALine(t *testing.T) {
	s := newSketch(1000)
	for h := range uint64(10_000) {
		h *= 0x2545f4914f6cdd1d
		var words [4]int
		for i := range 4 {
			w, _ := s.counter(h, i)
			words[i] = int((uintptr(unsafe.Pointer(w)) - uintptr(unsafe.Pointer(&s.words[0]))) / 8)
		}
		for i := range 4 {
			if words[i]/8 != words[0]/8 {
				t.Fatalf("hash %#x: counters in words %v, not in one block of eight", h, words)
			}
			for j := range i {
				if words[i] == words[j] {
					t.Fatalf("hash %#x: counters %d and %d share word %d", h, i, j, words[i])
				}
			}
		}
	}
	if uintptr(unsafe.Pointer(&s.words[0]))%64 != 0 {
		t.Fatalf("the sketch's words start at %p, not on a cache line", &s.words[0])
	}
}

// estimate reads the counters add writes: the least of the four that
// counter finds, for any hash and any counts.
func TestSketchEstimateReadsTheCountersAddWrites(t *testing.T) {
	s := newSketch(1000)
	for h := range uint64(20_000) {
		s.add(h * 0x2545f4914f6cdd1d % 7919 * 0x9e3779b97f4a7c15)
	}
	for h := range uint64(20_000) {
		h *= 0x2545f4914f6cdd1d
		least := uint64(15)
		for i := range 4 {
			w, shift := s.counter(h, i)
			least = min(least, w.Load()>>shift&15)
		}
		if got := s.estimate(h); got != int(least) {
			t.Fatalf("hash %#x: estimate %d; its counters' least is %d", h, got, least)
		}
	}
}
