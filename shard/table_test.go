package shard_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTable[K comparable, V any](t testing.TB, opt shard.Options[K]) *shard.Table[K, V] {
	tb, err := shard.New[K, V](opt)
	require.NoError(t, err)
	return tb
}

// publish claims key's Empty slot and publishes v, as a creator would.
func publish[K comparable, V any](t testing.TB, tb *shard.Table[K, V], key K, v V) *shard.Slot[K, V] {
	t.Helper()
	s := tb.LoadOrInsert(key)
	claim, f, ok := s.Claim(s.State(), nil)
	require.True(t, ok, "claim of %v", key)
	require.NotNil(t, f)
	require.True(t, tb.Publish(s, claim, v))
	return s
}

var hashes = map[string]func(int) uint64{
	"seeded":    nil,
	"zero":      func(int) uint64 { return 0 },
	"truncated": func(k int) uint64 { return uint64(k % 5) },
}

func TestNewRejectsBadShards(t *testing.T) {
	_, err := shard.New[int, int](shard.Options[int]{Shards: -1})
	assert.EqualError(t, err, "shard: Shards is -1; want 0 (default) or a positive count")
	_, err = shard.New[int, int](shard.Options[int]{Shards: shard.MaxShards + 1})
	assert.ErrorContains(t, err, "want at most 65536")
	_, err = shard.New[int, int](shard.Options[int]{Shards: 3})
	assert.NoError(t, err, "rounded up to 4")
}

func TestInsertLookupGrow(t *testing.T) {
	for name, hash := range hashes {
		t.Run("hash="+name, func(t *testing.T) {
			n := 20000
			if hash != nil {
				n = 1500 // one collision chain: quadratic
			}
			tb := newTable[int, int](t, shard.Options[int]{Shards: 4, Hash: hash})
			slots := make([]*shard.Slot[int, int], n)
			for k := range n {
				assert.Nil(t, tb.Lookup(k))
				slots[k] = publish(t, tb, k, k*2)
			}
			for k := range n {
				s := tb.Lookup(k)
				require.Same(t, slots[k], s, "a slot keeps its address through growth")
				v, ok := tb.Load(k)
				require.True(t, ok)
				require.Equal(t, 2*k, v)
				assert.Same(t, s, tb.LoadOrInsert(k))
				assert.Equal(t, k, s.Key())
			}
			_, ok := tb.Load(-1)
			assert.False(t, ok)
			count := 0
			for s := range tb.All() {
				count++
				assert.Equal(t, shard.Ready, s.State().Status())
			}
			assert.Equal(t, n, count)
		})
	}
}

func TestStateMachine(t *testing.T) {
	tb := newTable[string, int](t, shard.Options[string]{})
	s := tb.LoadOrInsert("peer")
	assert.Equal(t, shard.Empty, s.State().Status())
	_, ok := s.Load()
	assert.False(t, ok)

	claim, f, ok := s.Claim(nil, nil)
	require.True(t, ok)
	assert.Equal(t, shard.Creating, s.State().Status())
	assert.Same(t, f, s.State().Flight())
	_, _, ok = s.Claim(nil, nil)
	assert.False(t, ok, "a second claim of one slot fails")
	_, _, ok = s.Claim(claim, nil)
	assert.False(t, ok, "a Creating state cannot be claimed")
	_, ok = tb.Invalidate(s)
	assert.False(t, ok, "a Creating slot is not invalidated")

	require.True(t, f.TryResolve())
	assert.False(t, f.TryResolve(), "a flight is resolved once")
	require.True(t, tb.Publish(s, claim, 7))
	f.Finish(7, nil, time.Time{})
	assert.Equal(t, shard.Creating, claim.Status(), "a stale snapshot of a successful claim is not a failure")
	<-f.Done()
	v, err := f.Result()
	assert.Equal(t, 7, v)
	assert.NoError(t, err)
	assert.Equal(t, shard.Ready, s.State().Status())
	assert.Equal(t, 7, s.Value())
	assert.Nil(t, s.State().Flight())
	v, ok = s.Load()
	assert.True(t, ok)
	assert.Equal(t, 7, v)

	_, ok = tb.InvalidateIf(s, func(v int) bool { return v == 8 })
	assert.False(t, ok)
	v, ok = tb.InvalidateIf(s, func(v int) bool { return v == 7 })
	assert.True(t, ok)
	assert.Equal(t, 7, v)
	assert.Equal(t, shard.Dead, s.State().Status(), "a slot holds one value in its life")
	_, _, ok = s.Claim(nil, nil)
	assert.False(t, ok, "a Dead slot cannot be claimed")
	_, ok = tb.Invalidate(s)
	assert.False(t, ok)

	// The key has a fresh slot for its second value.
	fresh := tb.LoadOrInsert("peer")
	require.NotSame(t, s, fresh)
	assert.Same(t, fresh, tb.Lookup("peer"), "Invalidate put the fresh slot in the cell")
	s = fresh
	claim, _, ok = s.Claim(nil, nil)
	require.True(t, ok)
	require.True(t, tb.Publish(s, claim, 9))
	v, ok = tb.Invalidate(s)
	assert.True(t, ok)
	assert.Equal(t, 9, v)
	s = tb.LoadOrInsert("peer")

	// Failure, remembered, then claimed again or forgotten.
	claim, _, ok = s.Claim(nil, nil)
	require.True(t, ok)
	boom := errors.New("boom")
	until := time.Now().Add(time.Hour)
	failed := shard.NewFailure[int](boom, until)
	require.True(t, s.Settle(claim, failed))
	assert.Equal(t, shard.Failed, s.State().Status())
	_, err = s.State().Flight().Result()
	assert.Same(t, boom, err)
	assert.Equal(t, until, s.State().Flight().Until())
	assert.False(t, s.Forget(claim), "stale state")
	assert.True(t, s.Forget(failed))
	assert.Equal(t, shard.Empty, s.State().Status())
	claim, _, ok = s.Claim(nil, nil)
	require.True(t, ok)
	require.True(t, s.Settle(claim, failed))
	_, _, ok = s.Claim(failed, nil)
	assert.True(t, ok, "a Failed state can be claimed")

	assert.Equal(t, "sealed", shard.Sealed.String())
	assert.Equal(t, "invalid", shard.Status(99).String())
}

func TestSeal(t *testing.T) {
	tb := newTable[int, string](t, shard.Options[int]{Shards: 2})
	for k := range 100 {
		publish(t, tb, k, fmt.Sprint(k))
	}
	tb.LoadOrInsert(1000) // Empty: not reported
	creating := tb.LoadOrInsert(2000)
	_, _, ok := creating.Claim(nil, nil)
	require.True(t, ok)
	seen := map[int]shard.Status{}
	require.NoError(t, tb.Seal(func(s *shard.Slot[int, string], old *shard.State[string]) {
		seen[s.Key()] = old.Status()
		if old.Status() == shard.Ready {
			assert.Equal(t, fmt.Sprint(s.Key()), s.Value())
		}
	}))
	assert.Len(t, seen, 101)
	assert.Equal(t, shard.Creating, seen[2000])
	for k := range 100 {
		assert.Equal(t, shard.Ready, seen[k])
		_, ok := tb.Load(k)
		assert.False(t, ok)
		assert.Nil(t, tb.Lookup(k), "sealed slots leave the table, and their values with them")
		assert.Equal(t, shard.Sealed, tb.LoadOrInsert(k).State().Status())
	}
	s := tb.LoadOrInsert(5000)
	assert.Equal(t, shard.Sealed, s.State().Status(), "slots inserted after Seal are born sealed")
	_, _, ok = s.Claim(s.State(), nil)
	assert.False(t, ok)
	assert.ErrorIs(t, tb.Seal(func(*shard.Slot[int, string], *shard.State[string]) {}), shard.ErrSealed)
}

// Empty slots, and remembered failures that have expired, leave the table
// when their shard's array is rebuilt; slots that hold a value, a creation,
// a failure still answered or a timed-out creation still running stay, at
// the same address.
func TestCompactionDropsOnlyEmptySlots(t *testing.T) {
	tb := newTable[int, int](t, shard.Options[int]{Shards: 1})
	kept := map[int]*shard.Slot[int, int]{}
	var dropped []*shard.Slot[int, int]
	for k := range 6 {
		if k%2 == 0 {
			kept[k] = publish(t, tb, k, k)
		} else {
			dropped = append(dropped, tb.LoadOrInsert(k))
		}
	}
	claimed := tb.LoadOrInsert(100)
	_, _, ok := claimed.Claim(nil, nil)
	require.True(t, ok)
	kept[100] = claimed
	fail := func(k int, until time.Time) *shard.Slot[int, int] {
		s := tb.LoadOrInsert(k)
		claim, _, ok := s.Claim(nil, nil)
		require.True(t, ok)
		require.True(t, s.Settle(claim, shard.NewFailure[int](errors.New("refused"), until)))
		return s
	}
	dropped = append(dropped, fail(101, time.Now().Add(-time.Millisecond)))
	kept[102] = fail(102, time.Now().Add(time.Hour))
	abandoned := tb.LoadOrInsert(103) // a timed-out creation still running
	_, f, ok := abandoned.Claim(nil, nil)
	require.True(t, ok)
	require.True(t, f.TryResolve())
	f.Finish(0, errors.New("timed out"), time.Time{})
	kept[103] = abandoned
	for k := 200; k < 200+1000; k++ {
		publish(t, tb, k, k)
	}
	for k, s := range kept {
		assert.Same(t, s, tb.Lookup(k), "key %d", k)
	}
	for _, s := range dropped {
		assert.Equal(t, shard.Dead, s.State().Status())
		_, _, ok := s.Claim(nil, nil)
		assert.False(t, ok, "a Dead slot cannot be claimed")
		fresh := tb.LoadOrInsert(s.Key())
		assert.NotSame(t, s, fresh, "the key gets a new slot")
		assert.Equal(t, shard.Empty, fresh.State().Status())
	}
	// An array mostly of Empty slots shrinks when rebuilt.
	tb2 := newTable[int, int](t, shard.Options[int]{Shards: 1})
	for k := range 10000 {
		publish(t, tb2, k, k)
	}
	big := tb2.Cells(0)
	for k := range 10000 {
		_, ok := tb2.Invalidate(tb2.Lookup(k))
		require.True(t, ok)
	}
	for k := 10000; k < 10000+big; k++ {
		tb2.LoadOrInsert(k)
	}
	assert.Less(t, tb2.Cells(0), big, "Empty slots were dropped, not copied")
}

// Readers never take the shard lock: a Load of a present key, a Lookup of an
// absent one, and a Claim complete while the shard's mutex is held (as it is
// while the shard grows).
func TestReadersDoNotLock(t *testing.T) {
	tb := newTable[string, int](t, shard.Options[string]{Shards: 1})
	publish(t, tb, "a", 1)
	b := tb.LoadOrInsert("b")
	unlock := tb.LockShardOf("a")
	done := make(chan struct{})
	go func() {
		defer close(done)
		v, ok := tb.Load("a")
		assert.True(t, ok)
		assert.Equal(t, 1, v)
		assert.Nil(t, tb.Lookup("zzz"))
		claim, _, ok := b.Claim(nil, nil)
		assert.True(t, ok, "claiming never locks")
		assert.True(t, tb.Publish(b, claim, 2))
	}()
	<-done // would deadlock if any of them locked
	unlock()
}

// Many goroutines insert, claim and publish distinct keys while others read
// keys published earlier: readers never miss, no claim is lost to
// compaction, and every key ends with exactly the value its claimer published.
func TestConcurrentGrowthAndClaims(t *testing.T) {
	for name, hash := range hashes {
		t.Run("hash="+name, func(t *testing.T) {
			writers, perWriter := 8, 2000
			if hash != nil {
				perWriter = 150
			}
			if testing.Short() {
				perWriter /= 10
			}
			tb := newTable[int, int](t, shard.Options[int]{Shards: 2, Hash: hash})
			const base = 1 << 30
			for k := range 64 {
				publish(t, tb, base+k, k)
			}
			var stop atomic.Bool
			var readers, wg sync.WaitGroup
			var misses atomic.Int64
			for r := range 4 {
				readers.Add(1)
				go func() {
					defer readers.Done()
					for i := r; !stop.Load(); i++ {
						if v, ok := tb.Load(base + i%64); !ok || v != i%64 {
							misses.Add(1)
						}
					}
				}()
			}
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perWriter {
						k := w*perWriter + i
						for {
							s := tb.LoadOrInsert(k)
							claim, _, ok := s.Claim(nil, nil)
							if !ok {
								// Only compaction can take an Empty slot from its sole claimer.
								if st := s.State().Status(); st != shard.Dead {
									t.Errorf("claim of key %d lost to a slot in state %v", k, st)
									return
								}
								continue
							}
							if k%3 == 0 {
								s.Settle(claim, nil) // leave it Empty: compaction fodder
							} else if !tb.Publish(s, claim, k) {
								t.Errorf("publish of key %d failed", k)
							}
							break
						}
					}
				}()
			}
			wg.Wait()
			stop.Store(true)
			readers.Wait()
			assert.Zero(t, misses.Load(), "a reader missed a published key during growth")
			for k := range writers * perWriter {
				v, ok := tb.Load(k)
				if k%3 == 0 {
					assert.False(t, ok, "key %d", k)
				} else if assert.True(t, ok, "key %d", k) {
					assert.Equal(t, k, v)
				}
			}
		})
	}
}

func TestHashKinds(t *testing.T) {
	type rank uint16
	type name string
	type peer struct {
		Job  uint32
		Rank int
		Node string
	}
	checkHash(t, []int8{-128, -1, 0, 1, 127})
	checkHash(t, []rank{0, 1, 2, 65535})
	checkHash(t, []uint64{0, 1, math.MaxUint64, 1 << 63})
	checkHash(t, []uintptr{0, 1, 2})
	checkHash(t, []name{"", "a", "b", "node-1:rank-2"})
	checkHash(t, []peer{{1, 2, "x"}, {1, 3, "x"}, {2, 2, "x"}, {1, 2, "y"}})
	checkHash(t, []*int{new(int), new(int)})
	checkHash(t, [][2]int{{1, 2}, {2, 1}})
	checkHash(t, []any{1, "1", 1.0, peer{}})
	checkHash(t, []float64{1.5, -2, math.Inf(1)})

	// +0 and -0 are equal keys: they must share a slot.
	tb := newTable[float64, int](t, shard.Options[float64]{})
	publish(t, tb, 0.0, 1)
	v, ok := tb.Load(math.Copysign(0, -1))
	assert.True(t, ok)
	assert.Equal(t, 1, v)
}

// checkHash asserts that keys hash equal to themselves, that distinct keys do
// not collide, and that two tables hash the same key differently (per-table
// seeds).
func checkHash[K comparable](t *testing.T, keys []K) {
	t.Helper()
	a := newTable[K, int](t, shard.Options[K]{})
	b := newTable[K, int](t, shard.Options[K]{})
	seen := map[uint64]K{}
	for i, k := range keys {
		h := a.Hash(k)
		assert.Equal(t, h, a.Hash(k), "%T %v: hash is deterministic", k, k)
		if prev, dup := seen[h]; dup {
			t.Errorf("%T: %v and %v collide", k, prev, k)
		}
		seen[h] = k
		assert.NotEqual(t, h, b.Hash(k), "%T %v: two tables, two seeds", k, k)
		publish(t, a, k, i)
	}
	for i, k := range keys {
		v, ok := a.Load(k)
		assert.True(t, ok, "%T %v", k, k)
		assert.Equal(t, i, v)
	}
}

// TestStringKeysCompareByContent checks Get's string comparison, which
// looks at lengths and data pointers before the bytes: a key found through
// another copy of its bytes hits, and prefixes of a stored key, which share
// its data pointer, are other keys. Thousands of keys of one length make
// tags match for keys that differ, so that bytes are compared too.
func TestStringKeysCompareByContent(t *testing.T) {
	tb := newTable[string, int](t, shard.Options[string]{})
	// Lookups that must hit use a live context and this miss, so that a
	// hit path that missed is seen: the miss of a NoMiss lookup looks the
	// key up again and would hide it.
	var missed []string
	tb.SetMiss(func(_ context.Context, k string) (int, error) {
		missed = append(missed, k)
		return 0, errors.New("missed")
	})
	ctx := context.Background()
	const stored = "tcp://host-7.cluster.local:50051"
	publish(t, tb, stored, -1)
	publish(t, tb, stored[:10], -2) // a prefix: same data pointer, other length
	const n = 5000
	for i := range n {
		publish(t, tb, fmt.Sprintf("peer-%05d", i), i)
	}
	for i := range n {
		v, err := tb.Get(ctx, strings.Clone(fmt.Sprintf("peer-%05d", i)))
		require.NoError(t, err)
		require.Equal(t, i, v)
	}
	// Every length up to 70: Get hashes 8 to 32 bytes itself, the rest
	// (and every insertion) with hashString: a hash of Get's own that
	// disagreed would miss. Keys of one repeated byte catch a wrong
	// secret or order; the prefixes of a string whose every 8-byte word
	// differs catch a word read at the wrong place too.
	const varied = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!#$%&()*+,"
	for n := range 71 {
		publish(t, tb, strings.Repeat("x", n), 10_000+n)
		if n > 0 { // "" is the first loop's
			publish(t, tb, varied[:n], 20_000+n)
		}
	}
	for n := range 71 {
		v, err := tb.Get(ctx, strings.Repeat("x", n))
		require.NoError(t, err, "%d bytes", n)
		require.Equal(t, 10_000+n, v)
		if n == 0 {
			continue
		}
		v, err = tb.Get(ctx, strings.Clone(varied[:n]))
		require.NoError(t, err, "%d bytes of %q", n, varied)
		require.Equal(t, 20_000+n, v)
	}
	for _, k := range []string{stored, strings.Clone(stored), string([]byte(stored))} {
		v, err := tb.Get(ctx, k)
		require.NoError(t, err)
		assert.Equal(t, -1, v)
	}
	v, err := tb.Get(ctx, strings.Clone(stored[:10]))
	require.NoError(t, err)
	assert.Equal(t, -2, v)
	require.Empty(t, missed, "Get's hit path did not find these keys")
	for _, k := range []string{stored[:11], stored[:len(stored)-1], strings.Replace(stored, "7", "8", 1), "peer-99999"} {
		_, err := tb.Get(shard.NoMiss, k)
		assert.Error(t, err, "%q is not a stored key", k)
	}
}

// An expired failure answers nobody: Forget leaves it and reports false,
// as it would once a rebuild had dropped the slot, so that what Forget
// reports does not depend on when a rebuild ran.
func TestForgetOfAnExpiredFailure(t *testing.T) {
	tb := newTable[string, int](t, shard.Options[string]{})
	s := tb.LoadOrInsert("peer")
	claim, _, ok := s.Claim(nil, nil)
	require.True(t, ok)
	expired := shard.NewFailure[int](errors.New("boom"), time.Now().Add(-time.Nanosecond))
	require.True(t, s.Settle(claim, expired))
	assert.False(t, s.Forget(expired), "an expired failure is not forgotten")
	_, _, ok = s.Claim(expired, nil)
	assert.True(t, ok, "the next caller creates, as if it had been")
}
