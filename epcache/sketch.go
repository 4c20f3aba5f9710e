package epcache

import (
	"math/rand/v2"
	"sync/atomic"
)

// sketch estimates how often each key was asked for lately: a count-min
// sketch of 4-bit counters, sixteen to a word, halved every time it has
// counted thirty times the cap (Einziger, Friedman and Manes, 2017;
// Caffeine's and otter's frequency sketch, which halve at ten times: they
// count every access, and this one about one in two). Eviction under
// MaxEntries uses it to choose, among a few values the clock hand found
// unused, the one asked for least often: a peer that is asked for once and
// never again makes room before one that comes back.
//
// It counts only what reaches the slow path: misses, waits, and the first
// use of a value after the clock hand or a sweep passed it. A hit on a
// young value writes nothing, here too; a value used between two passes
// of the hand counts once per pass, which is what tells a recurring peer
// from a one-off.
type sketch struct {
	words   []atomic.Uint64
	mask    uint64 // len(words)-1
	added   atomic.Int64
	period  int64 // halve every period additions
	halving atomic.Bool
}

func newSketch(capacity int) *sketch {
	n := uint64(1)
	for n < uint64(capacity) && n < 1<<24 {
		n <<= 1
	}
	n = max(n, 8)
	// A period of 30 times the cap: shorter, the sketch forgets the hot
	// peers between two passes of the hand; much longer, its 4-bit
	// counters saturate and stop telling peers apart. The hit ratio it
	// gives is what epbench -workload hotset reports (Zipf 1.01 over
	// 100,000 keys, cap 1,000), where 30 measured best.
	return &sketch{words: make([]atomic.Uint64, n), mask: n - 1, period: 30 * int64(max(capacity, 8))}
}

// counter returns the word and the shift of the i-th counter of h. A
// key's four counters lie in one block of eight words, a cache line (the
// words' array is at least 64 bytes and a power of two, so its allocation
// starts on a 64-byte boundary), each in a word of two that are its own:
// an add or an estimate touches one line, not four, as Caffeine's sketch
// does since version 3.
func (s *sketch) counter(h uint64, i int) (*atomic.Uint64, uint) {
	x := h * 0x9e3779b97f4a7c15
	block := (x >> 32) & s.mask &^ 7
	y := (x ^ x>>29) >> (8 * i) // 8 bits for each counter
	return &s.words[block+2*uint64(i)+y&1], uint(y>>1&15) * 4
}

// add counts one request for the key whose hash is h.
func (s *sketch) add(h uint64) {
	grew := false
	for i := range 4 {
		w, shift := s.counter(h, i)
		for {
			old := w.Load()
			if old>>shift&15 == 15 {
				break
			}
			if w.CompareAndSwap(old, old+1<<shift) {
				grew = true
				break
			}
		}
	}
	// One add in sixteen counts sixteen, so that the adds of every core do
	// not write one word: the halving comes when expected, give or take.
	if grew && rand.Uint32()%16 == 0 && s.added.Add(16) >= s.period && s.halving.CompareAndSwap(false, true) {
		s.halve()
	}
}

// halve ages every counter by half, so that the sketch follows what is
// asked for now. Concurrent adds may be halved or not: an estimate.
func (s *sketch) halve() {
	defer s.halving.Store(false)
	for i := range s.words {
		w := &s.words[i]
		for {
			old := w.Load()
			if w.CompareAndSwap(old, old>>1&0x7777777777777777) {
				break
			}
		}
	}
	s.added.Store(s.added.Load() / 2)
}

// estimate is how often the key whose hash is h was counted: the least of
// its counters. It is counter's arithmetic done once for the four, with
// one bounds check for the block: eviction asks it of every candidate.
func (s *sketch) estimate(h uint64) int {
	x := h * 0x9e3779b97f4a7c15
	block := (x >> 32) & s.mask &^ 7
	b := (*[8]atomic.Uint64)(s.words[block : block+8 : block+8])
	y := x ^ x>>29
	// Unrolled: counter i is in word 2i or 2i+1 (bit 8i of y), at the
	// shift four times bits 8i+1 to 8i+4 of y.
	c0 := b[y&1].Load() >> (y >> 1 & 15 * 4) & 15
	c1 := b[2|y>>8&1].Load() >> (y >> 9 & 15 * 4) & 15
	c2 := b[4|y>>16&1].Load() >> (y >> 17 & 15 * 4) & 15
	c3 := b[6|y>>24&1].Load() >> (y >> 25 & 15 * 4) & 15
	return int(min(c0, c1, c2, c3))
}
