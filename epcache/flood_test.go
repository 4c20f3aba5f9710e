package epcache_test

import (
	"context"
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Why string keys are not hashed with xxhash (see shard/hash.go): XXH64 has
// no secret, and its full 64-bit collisions can be computed directly, so
// that a seed mixed in afterwards (as the table mixes a Config.Hash) cannot
// separate them. For a 16-byte input XXH64 is
//
//	h = seed + PRIME5 + 16
//	for each 8-byte little-endian lane k: h ^= round(0, k); h = rotl(h, 27)·PRIME1 + PRIME4
//	return avalanche(h)
//
// with round(0, k) = rotl(k·PRIME2, 31)·PRIME1. Every step of a lane is
// invertible (the primes are odd, so they have inverses mod 2^64), so for
// any first lane the second can be solved for to reach any chosen state
// before the avalanche, and so any chosen hash.

const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
)

// inverse returns the multiplicative inverse of an odd x mod 2^64 (Newton's
// iteration: each step doubles the number of correct low bits).
func inverse(x uint64) uint64 {
	y := x // correct to 3 bits for odd x
	for range 5 {
		y *= 2 - x*y
	}
	return y
}

// xxh64Collisions returns n distinct 16-byte keys that all have one
// xxhash.Sum64 value (seed 0): the first lane is the key's index, the
// second is solved for so that the state before the avalanche is target.
func xxh64Collisions(n int, target uint64) []string {
	inv1, inv2 := inverse(xxPrime1), inverse(xxPrime2)
	keys := make([]string, n)
	for i := range keys {
		lane1 := uint64(i)
		h := xxPrime5 + 16
		h ^= bits.RotateLeft64(lane1*xxPrime2, 31) * xxPrime1
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
		// target = rotl(h ^ r, 27)·PRIME1 + PRIME4, where r = round(0, lane2).
		r := bits.RotateLeft64((target-xxPrime4)*inv1, -27) ^ h
		lane2 := bits.RotateLeft64(r*inv1, -31) * inv2
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], lane1)
		binary.LittleEndian.PutUint64(b[8:], lane2)
		keys[i] = string(b[:])
	}
	return keys
}

// randomKeys returns n random 16-byte keys, the control group.
func randomKeys(n int, r *rand.Rand) []string {
	keys := make([]string, n)
	for i := range keys {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], r.Uint64())
		binary.LittleEndian.PutUint64(b[8:], r.Uint64())
		keys[i] = string(b[:])
	}
	return keys
}

// TestXXH64Collisions shows that many distinct keys share one XXH64 value,
// that a table whose Hash is xxhash keeps them in full collision although it
// mixes every hash with a seed of its own, and that the default string hash
// (seeded hash/maphash) tells them apart. A cache over xxhash stays correct
// on them, only slow (see BenchmarkFloodXXH64).
func TestXXH64Collisions(t *testing.T) {
	n := 1000
	if testing.Short() || raceEnabled {
		n = 200 // every insertion walks the one chain: quadratic
	}
	keys := xxh64Collisions(n, 0x5eed)
	distinct := map[string]bool{}
	for _, k := range keys {
		require.Len(t, k, 16)
		distinct[k] = true
	}
	require.Len(t, distinct, n, "the keys are distinct")
	want := xxhash.Sum64String(keys[0])
	for _, k := range keys {
		require.Equal(t, want, xxhash.Sum64String(k), "key %x", k)
		require.Equal(t, want, xxhash.Sum64([]byte(k)), "key %x", k)
	}

	seeded, err := shard.New[string, int](shard.Options[string]{Hash: xxhash.Sum64String})
	require.NoError(t, err)
	builtin, err := shard.New[string, int](shard.Options[string]{})
	require.NoError(t, err)
	tableHashes, builtinHashes := map[uint64]bool{}, map[uint64]bool{}
	for _, k := range keys {
		tableHashes[seeded.Hash(k)] = true
		builtinHashes[builtin.Hash(k)] = true
	}
	assert.Len(t, tableHashes, 1, "the table's seed does not undo a full collision of its Hash")
	assert.Len(t, builtinHashes, n, "the default string hash separates the keys")

	c, err := epcache.New(epcache.Config[string, int]{
		Hash:   xxhash.Sum64String,
		Create: func(_ context.Context, k string) (int, error) { return int(binary.LittleEndian.Uint64([]byte(k))), nil },
	})
	require.NoError(t, err)
	defer c.Close()
	for i, k := range keys {
		v, err := c.Get(context.Background(), k)
		require.NoError(t, err)
		require.Equal(t, i, v)
	}
	for i, k := range keys {
		v, ok := c.Load(k)
		require.True(t, ok)
		require.Equal(t, i, v)
	}
	assert.Equal(t, n, c.Len())
}

// BenchmarkFloodXXH64 measures Get of 1,000 ready keys that share one XXH64
// value against 1,000 random keys, with Config.Hash set to
// xxhash.Sum64String (hash=xxhash: the colliding keys walk one chain of
// about 500 cells) and with the default seeded hash (hash=default: both
// sets cost the same).
func BenchmarkFloodXXH64(b *testing.B) {
	const n = 1000
	sets := []struct {
		name string
		keys []string
	}{
		{"colliding", xxh64Collisions(n, 0x5eed)},
		{"random", randomKeys(n, rand.New(rand.NewPCG(5, 6)))},
	}
	for _, hash := range []struct {
		name string
		fn   func(string) uint64
	}{{"xxhash", xxhash.Sum64String}, {"default", nil}} {
		for _, set := range sets {
			b.Run("hash="+hash.name+"/keys="+set.name, func(b *testing.B) {
				c, err := epcache.New(epcache.Config[string, int]{
					Hash:   hash.fn,
					Create: func(context.Context, string) (int, error) { return 1, nil },
				})
				require.NoError(b, err)
				defer c.Close()
				for _, k := range set.keys {
					_, err := c.Get(context.Background(), k)
					require.NoError(b, err)
				}
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if _, err := c.Get(ctx, set.keys[i%n]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
