package bench

import (
	"fmt"
	"math/rand"
)

// keySet is the P keys of one workload, and the way back from a key to its
// peer number.
type keySet[K comparable] struct {
	keys []K
	peer func(K) int
}

// Uint64Keys returns the keys of peers 0 to peers-1 as uint64s: dense
// ranks, the array comparator's index.
func Uint64Keys(peers int) []uint64 { return uint64Keys(peers).keys }

// StringKeys returns the keys of peers 0 to peers-1 as peer names.
func StringKeys(peers int) []string { return stringKeys(peers).keys }

func uint64Keys(peers int) keySet[uint64] {
	keys := make([]uint64, peers)
	for i := range keys {
		keys[i] = uint64(i)
	}
	return keySet[uint64]{keys: keys, peer: func(k uint64) int { return int(k) }}
}

// stringKeys are peer names as a job launcher would write them: 16 to 21
// bytes.
func stringKeys(peers int) keySet[string] {
	keys := make([]string, peers)
	index := make(map[string]int, peers)
	for i := range keys {
		keys[i] = fmt.Sprintf("node-%04d:rank-%d", i/64, i)
		index[keys[i]] = i
	}
	return keySet[string]{keys: keys, peer: func(k string) int { return index[k] }}
}

// seqLen is the length of each goroutine's precomputed access sequence: long
// enough to defeat the branch predictor and, at a million peers, the caches;
// short enough (256 KiB a goroutine) to stay out of the measurement.
const seqLen = 1 << 16

// SeqMask indexes an access sequence: seq[i&SeqMask].
const SeqMask = seqLen - 1

// AccessSequence is accessSequence, for go test benchmarks.
func AccessSequence(dist string, peers int, seed uint64) []uint32 {
	return accessSequence(dist, peers, seed)
}

// accessSequence returns seqLen peer numbers drawn from dist ("uniform" or
// "zipf", s = 1.01 over peer numbers, so low numbers are hot).
func accessSequence(dist string, peers int, seed uint64) []uint32 {
	r := rand.New(rand.NewSource(int64(seed)))
	seq := make([]uint32, seqLen)
	var next func() uint32
	switch dist {
	case "zipf":
		z := rand.NewZipf(r, 1.01, 1, uint64(peers-1))
		next = func() uint32 { return uint32(z.Uint64()) }
	default:
		next = func() uint32 { return uint32(r.Intn(peers)) }
	}
	for i := range seq {
		seq[i] = next()
	}
	return seq
}
