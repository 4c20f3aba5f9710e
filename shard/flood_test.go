package shard_test

import (
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hash flooding: an attacker who knows a table's hash picks keys that all
// land in one shard and one cell, so that every lookup walks one long probe
// chain. Here the attacker knows the seed of one table (attacked), as it
// would if the seed were fixed, and crafts integer keys against it with
// nothing but the exported Table.Hash. The same keys fed to a table with a
// seed of its own (every table draws one) spread like random keys.

const floodShards = 8

// A layout is one way a table may split a hash into a shard and a home
// cell. The attacker knows the code, so the test knows the layouts the
// table has used, and finds the one in force from the order in which All
// yields slots (shard by shard, cell by cell): see layoutOf.
type layout struct {
	name string
	pos  func(h uint64, cells int) uint64     // shard and home cell, in All's order
	sig  func(h uint64, cellBits uint) uint64 // what keys that share a shard and a home have in common
}

var layouts = []layout{
	{
		name: "shard from bits 40 up, home from the low bits",
		pos: func(h uint64, cells int) uint64 {
			return (h>>40)&(floodShards-1)<<40 | h&uint64(cells-1)
		},
		sig: func(h uint64, cellBits uint) uint64 {
			return (h>>40)&(floodShards-1)<<cellBits | h&(1<<cellBits-1)
		},
	},
	{
		// Groups of seven slots, filled in order of arrival: All yields
		// them group by group, so only the group orders them.
		name: "shard from the low bits, home group from the high bits",
		pos: func(h uint64, slots int) uint64 {
			hi, _ := bits.Mul64(h, uint64(slots/7))
			return h&(floodShards-1)<<40 | hi
		},
		sig: func(h uint64, cellBits uint) uint64 {
			return h&(floodShards-1)<<cellBits | h>>(64-cellBits)
		},
	},
	{
		name: "shard from the low bits, home from the high bits",
		pos: func(h uint64, cells int) uint64 {
			hi, _ := bits.Mul64(h, uint64(cells))
			return h&(floodShards-1)<<40 | hi
		},
		sig: func(h uint64, cellBits uint) uint64 {
			return h&(floodShards-1)<<cellBits | h>>(64-cellBits)
		},
	},
}

// layoutOf finds the layout the table's code uses: All yields slots in the
// order of their shard and home cell, give or take those that probing
// displaced, under the right layout only.
func layoutOf(t testing.TB) layout {
	tb := floodTable(t, nil)
	r := rand.New(rand.NewPCG(7, 8))
	for range 512 {
		publish(t, tb, r.Uint64(), 0)
	}
	best, bestOrdered, runnerUp := layout{}, 0.0, 0.0
	for _, l := range layouts {
		ordered, pairs := 0, 0
		prev := uint64(0)
		for s := range tb.All() {
			pos := l.pos(tb.Hash(s.Key()), tb.Cells(s.Key()))
			if pairs > 0 && pos >= prev {
				ordered++
			}
			prev = pos
			pairs++
		}
		f := float64(ordered) / float64(pairs-1)
		t.Logf("layout %q: %.2f of All's neighbours in order", l.name, f)
		if f > bestOrdered {
			best, bestOrdered, runnerUp = l, f, bestOrdered
		} else {
			runnerUp = max(runnerUp, f)
		}
	}
	// Under an unrelated layout about half the neighbours are in order; a
	// finer or coarser split of the same bits orders more of them, but far
	// fewer than the layout in force.
	require.True(t, bestOrdered > 0.9 && bestOrdered-runnerUp > 0.2, "no known layout explains the order of All: teach the flood tests the table's new one")
	return best
}

// craftCollisions returns n distinct integer keys whose hashes under tb
// share a shard and, in every array of up to 2^cellBits cells, a home
// cell (or two neighbours). It costs about n·floodShards·2^cellBits hashes.
func craftCollisions(tb *shard.Table[uint64, int], l layout, n int, cellBits uint, r *rand.Rand) []uint64 {
	k := r.Uint64()
	want := l.sig(tb.Hash(k), cellBits)
	keys := []uint64{k}
	for len(keys) < n {
		k++
		if l.sig(tb.Hash(k), cellBits) == want {
			keys = append(keys, k)
		}
	}
	return keys
}

func floodTable(t testing.TB, hash func(uint64) uint64) *shard.Table[uint64, int] {
	return newTable[uint64, int](t, shard.Options[uint64]{Shards: floodShards, Hash: hash})
}

// fill publishes keys[i] → i and checks that every one reads back.
func fill(t testing.TB, tb *shard.Table[uint64, int], keys []uint64) {
	for i, k := range keys {
		publish(t, tb, k, i)
	}
	for i, k := range keys {
		v, ok := tb.Load(k)
		require.True(t, ok, "key %d", k)
		require.Equal(t, i, v)
	}
}

// runs counts the maximal runs of keys of set in the order All yields
// them: keys that share a shard and a home cell make one run (two if it
// wraps around the array), keys spread among others make many.
func runs(tb *shard.Table[uint64, int], set []uint64) int {
	in := map[uint64]bool{}
	for _, k := range set {
		in[k] = true
	}
	n, inRun := 0, false
	for s := range tb.All() {
		if in[s.Key()] && !inRun {
			n++
		}
		inRun = in[s.Key()]
	}
	return n
}

// TestFloodCraftedKeysSpreadUnderAnotherSeed crafts keys that collide in
// shard and cell under one table's seed, and shows that a second table's
// seed spreads them as it would random keys: the seed, not the keys,
// decides where they go. Both tables answer correctly.
func TestFloodCraftedKeysSpreadUnderAnotherSeed(t *testing.T) {
	n := 256
	if testing.Short() {
		n = 64
	}
	const cellBits = 9 // a home shared in every array up to 512 cells
	l := layoutOf(t)
	r := rand.New(rand.NewPCG(1, 2))
	attacked := floodTable(t, nil)
	keys := craftCollisions(attacked, l, n, cellBits, r)
	random := make([]uint64, n)
	for i := range random {
		random[i] = r.Uint64()
	}
	fresh := floodTable(t, nil)
	for _, tb := range []*shard.Table[uint64, int]{attacked, fresh} {
		fill(t, tb, keys)
		fill(t, tb, random)
	}
	assert.LessOrEqual(t, runs(attacked, keys), 2, "under the attacked seed (%s) the crafted keys make one probe chain", l.name)
	assert.Greater(t, runs(fresh, keys), n/4, "under a fresh seed the crafted keys spread among random ones")
}

// BenchmarkFlood measures Load of 1,000 keys crafted against one table's
// seed. Under a fresh seed (table=fresh-seed) they cost what random keys do:
// the sub-benchmark also times random keys on a same-sized table and
// reports the ratio as x-random, which stays below 2. Under the attacked
// seed (table=attacked) every Load walks a chain of about 500 cells; a
// table whose hash always returns 0 (hash=zero) is as slow, and still
// correct.
func BenchmarkFlood(b *testing.B) {
	const n = 1000
	r := rand.New(rand.NewPCG(3, 4))
	attacked := floodTable(b, nil)
	crafted := craftCollisions(attacked, layoutOf(b), n, 11, r) // one home in every array up to 2,048 cells
	fill(b, attacked, crafted)
	random := make([]uint64, n)
	for i := range random {
		random[i] = r.Uint64()
	}
	fresh := floodTable(b, nil)
	fill(b, fresh, crafted)
	control := floodTable(b, nil)
	fill(b, control, random)
	zero := floodTable(b, func(uint64) uint64 { return 0 })
	fill(b, zero, random)

	b.Run("keys=crafted/table=fresh-seed", func(b *testing.B) {
		crafted := loadLoop(b, fresh, crafted)
		b.StopTimer()
		start := time.Now()
		loadLoop(b, control, random)
		b.ReportMetric(float64(crafted)/float64(time.Since(start)), "x-random")
	})
	b.Run("keys=random/table=fresh-seed", func(b *testing.B) { loadLoop(b, control, random) })
	b.Run("keys=crafted/table=attacked", func(b *testing.B) { loadLoop(b, attacked, crafted) })
	b.Run("keys=random/hash=zero", func(b *testing.B) { loadLoop(b, zero, random) })
}

// loadLoop Loads keys round-robin b.N times and returns how long it took.
func loadLoop(b *testing.B, tb *shard.Table[uint64, int], keys []uint64) time.Duration {
	b.ReportAllocs()
	start := time.Now()
	for i := range b.N {
		if _, ok := tb.Load(keys[i%len(keys)]); !ok {
			b.Fatal("miss")
		}
	}
	return time.Since(start)
}
