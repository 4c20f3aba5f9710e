package epcache_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/internal/fixture"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const millionPeers = 1_000_000

// peers returns n endpoints, allocated up front so that the heap growth of
// a fill counts the structure that holds them, not the values.
func peers(n int) []endpoint {
	eps := make([]endpoint, n)
	for i := range eps {
		eps[i].peer = i
	}
	return eps
}

// TestMillionPeers connects one rank to a million peers in a storm of 64
// goroutines (each peer asked for by two at once), then checks that every
// peer was created exactly once and reads back, that every value is released
// exactly once at Close, and measures the heap kept per entry: at a
// million peers, no more than maxBytesPerEntry. Under the race detector it
// uses 100,000 peers, and only reports the memory, unless -long is set.
func TestMillionPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("a million peers: skipped with -short")
	}
	n := millionPeers
	if raceEnabled && !*long {
		n = 100_000
	}
	eps := peers(n)
	released := make([]atomic.Int32, n)
	var creates atomic.Int64
	c, err := epcache.New(epcache.Config[int, *endpoint]{
		Create: func(_ context.Context, k int) (*endpoint, error) {
			creates.Add(1)
			return &eps[k], nil
		},
		Release: func(k int, v *endpoint) {
			if v != &eps[k] {
				panic("Release of another key's value")
			}
			released[k].Add(1)
		},
	})
	require.NoError(t, err)
	start := time.Now()
	grew := fixture.HeapGrowth(func() { fixture.StormFill(c, n, 64) })
	elapsed := time.Since(start)
	st := c.Stats()
	require.EqualValues(t, n, creates.Load(), "one Create per peer")
	require.EqualValues(t, n, st.Creates)
	require.Equal(t, n, c.Len())
	for k := range n {
		v, ok := c.Load(k)
		if !ok || v != &eps[k] {
			t.Fatalf("Load(%d) = %v, %t", k, v, ok)
		}
	}
	perEntry := float64(grew) / float64(n)
	t.Logf("%d peers ready in %v (%d Gets waited on another's creation): %.1f B/entry",
		n, elapsed.Round(time.Millisecond), st.Waits, perEntry)

	require.NoError(t, c.Close())
	for k := range released {
		if n := released[k].Load(); n != 1 {
			t.Fatalf("peer %d released %d times", k, n)
		}
	}
	st = c.Stats()
	assert.EqualValues(t, n, st.Releases)
	assert.Zero(t, st.Live)
	if n == millionPeers { // at 100,000 the table is at another point of its growth
		assert.LessOrEqual(t, perEntry, maxBytesPerEntry, "heap kept per entry at a million peers")
	}
}

// maxBytesPerEntry bounds the heap a million ready peers keep beyond their
// values: slots, arrays and shards, 44-46 bytes an entry by
// BenchmarkMillionPeers (bench/direct), which measures xsync v4's Map
// holding the same pointers beside it at 50.
const maxBytesPerEntry = 48.0

// TestGrowthNeverBlocksReaders has a writer insert hundreds of thousands of
// new peers into a cache of one shard, so that its array is rebuilt many
// times, the last rebuilds copying a hundred thousand slots and more, while
// readers Load and Get peers that are present. No read may miss. That no
// read waits for a rebuild is shown without a clock in package shard
// (TestReadersDoNotLock: reads complete while the shard's mutex is held) and
// by TestHitPathMakesNoCalls (a hit calls nothing, so it cannot lock); the
// times are logged, never asserted, since a descheduled reader on a busy
// 2-core machine would make any bound flaky.
//
// Under the race detector it adds 100,000 peers: at 300,000 the detector's
// own work for goroutines (each creation runs on one) and for freed arrays
// makes the test slow for no added evidence.
func TestGrowthNeverBlocksReaders(t *testing.T) {
	writes := 300_000
	switch {
	case testing.Short():
		writes = 20_000
	case raceEnabled:
		writes = 100_000
	}
	growWhileReading(t, writes)
}

// growWhileReading runs TestGrowthNeverBlocksReaders, logging the slowest
// read and the slowest insertion (a rebuild).
func growWhileReading(t *testing.T, writes int) {
	var slowestWrite time.Duration
	const present = 1024
	c, err := epcache.New(epcache.Config[int, *endpoint]{
		Shards: 1,
		Create: func(_ context.Context, k int) (*endpoint, error) { return &endpoint{peer: k}, nil },
	})
	require.NoError(t, err)
	defer c.Close()
	for k := range present {
		_, err := c.Get(context.Background(), k)
		require.NoError(t, err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	type readerStats struct {
		reads, misses int
		worst         time.Duration
	}
	readers := make([]readerStats, max(1, runtime.GOMAXPROCS(0)-1))
	// passes counts each reader's rounds: the writer starts once every
	// reader has made one, and stops them once every reader has made one
	// more after the last insertion, so that each read while the table
	// grew, however the goroutines were scheduled.
	passes := make([]atomic.Int64, len(readers))
	for i := range readers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 9))
			rs := &readers[i]
			for !stop.Load() {
				k := r.IntN(present)
				t0 := time.Now()
				v, ok := c.Load(k)
				g, err := c.Get(context.Background(), k)
				d := time.Since(t0)
				rs.reads += 2
				rs.worst = max(rs.worst, d)
				if !ok || v.peer != k || err != nil || g != v {
					rs.misses++
				}
				passes[i].Add(1)
			}
		})
	}
	require.True(t, waitForPasses(passes, 1), "the readers never started")
	start := time.Now()
	for k := present; k < present+writes; k++ {
		t0 := time.Now()
		if _, err := c.Get(context.Background(), k); err != nil {
			t.Fatal(err)
		}
		slowestWrite = max(slowestWrite, time.Since(t0))
	}
	elapsed := time.Since(start)
	readAfter := waitForPasses(passes, 1)
	stop.Store(true)
	wg.Wait()
	require.True(t, readAfter, "the readers stopped while the table grew")
	assert.Equal(t, present+writes, c.Len())
	for i, rs := range readers {
		t.Logf("reader %d: %d reads while %d peers were added in %v (slowest insertion, a rebuild: %v); slowest Load+Get %v",
			i, rs.reads, writes, elapsed.Round(time.Millisecond), slowestWrite, rs.worst)
		assert.Positive(t, rs.reads)
		assert.Zero(t, rs.misses, "reader %d missed a present key", i)
	}
}

// TestMillionPeersSweepWithoutStoppingReaders fills a cache with IdleTimeout
// set with a million peers, keeps 1,024 of them in use from reader
// goroutines, and lets the others go idle: a sweep walks the million and
// removes all but the 1,024 while the readers go on.
//
// Nothing in it depends on how fast the machine is. IdleTimeout is an hour,
// so its timer never fires during the test, and the test runs the sweeps
// itself (SweepNow). Before each sweep it waits until every reader has made
// two whole passes over the hot peers since the last one, so each hot peer
// is used between any two sweeps, whatever their durations: the first
// IdleSteps sweeps must remove nothing, and the next exactly the idle peers.
// That a sweep does not stop the readers is shown without a clock: the
// sweep hashes each key it removes (InvalidateState hashes before it
// removes), and Config.Hash, a quarter, a half and three quarters of the way
// through the idle peers, waits until every reader has made two more passes.
// A sweep that stopped the readers would wait for ever; the wait's limit
// only detects such a hang. Every read is a hit of the right value, and
// every value created is released exactly once: the idle ones by the sweep,
// the hot ones by Close. Under the race detector it uses 100,000 peers,
// unless -long is set.
func TestMillionPeersSweepWithoutStoppingReaders(t *testing.T) {
	if testing.Short() {
		t.Skip("a million peers: skipped with -short")
	}
	n := millionPeers
	if raceEnabled && !*long {
		n = 100_000
	}
	const hot = 1024
	eps := peers(n)
	passes := make([]atomic.Int64, max(1, runtime.GOMAXPROCS(0)-1)) // each reader's passes over the hot peers
	var (
		bad, created, released atomic.Int64
		hashed                 atomic.Int64 // idle peers hashed: once the fill is over, only a removal hashes one
		filled                 atomic.Bool
		paused                 atomic.Int32 // the waits inside the sweep that the readers answered
		stalled                atomic.Bool  // a wait inside the sweep that they did not
	)
	quarter := int64(n-hot) / 4
	c, err := epcache.New(epcache.Config[int, *endpoint]{
		IdleTimeout: time.Hour, // never passes during the test: SweepNow runs the sweeps
		Create: func(_ context.Context, k int) (*endpoint, error) {
			created.Add(1)
			return &eps[k], nil
		},
		Release: func(k int, v *endpoint) {
			if v != &eps[k] {
				panic("Release of another key's value")
			}
			released.Add(1)
		},
		Hash: func(k int) uint64 {
			if k >= hot && filled.Load() {
				if i := hashed.Add(1); i%quarter == 0 && i < 4*quarter {
					if waitForPasses(passes, 2) {
						paused.Add(1)
					} else {
						stalled.Store(true)
					}
				}
			}
			return uint64(k) // the cache mixes it with its seed
		},
	})
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	for k := range n {
		if _, err := c.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	require.Equal(t, n, c.Len())
	require.EqualValues(t, n, created.Load(), "one Create per peer")
	filled.Store(true)

	var stop atomic.Bool
	var wg sync.WaitGroup
	for r := range passes {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				k := i % hot
				if v, err := c.Get(ctx, k); err != nil || v != &eps[k] {
					bad.Add(1)
				}
				if k == hot-1 {
					passes[r].Add(1)
				}
			}
		})
	}
	for sweep := 1; sweep <= shard.IdleSteps+1; sweep++ {
		require.True(t, waitForPasses(passes, 2), "the readers made no progress before sweep %d", sweep)
		epcache.SweepNow(c)
		want := n
		if sweep == shard.IdleSteps+1 {
			want = hot // the idle peers have now stayed unused through IdleSteps sweeps
		}
		require.Equal(t, want, c.Len(), "peers held after sweep %d", sweep)
	}
	stop.Store(true)
	wg.Wait()
	assert.False(t, stalled.Load(), "the readers made no progress while the sweep was under way")
	assert.EqualValues(t, 3, paused.Load(), "the sweep waited for the readers at each quarter of the idle peers")
	for k := range hot {
		_, ok := c.Load(k)
		assert.True(t, ok, "peer %d, in use, was removed", k)
	}
	st := c.Stats()
	assert.EqualValues(t, n-hot, st.IdleRemovals)
	assert.Zero(t, bad.Load(), "reads that missed or returned another value")
	require.NoError(t, c.Close())
	assert.EqualValues(t, n, created.Load(), "no peer was created twice: none in use was removed")
	assert.EqualValues(t, n, released.Load(), "every value released once: the idle ones by the sweep, the rest by Close")
	t.Logf("%d peers: one sweep removed %d, waiting for the readers %d times on the way; %d hot peers kept",
		n, st.IdleRemovals, paused.Load(), hot)
}

// waitForPasses waits until each of the readers' pass counters has grown
// by k, polling, and reports false if one has not within hang.
func waitForPasses(passes []atomic.Int64, k int64) bool {
	from := make([]int64, len(passes))
	for i := range passes {
		from[i] = passes[i].Load()
	}
	deadline := time.Now().Add(hang)
	for i := range passes {
		for passes[i].Load() < from[i]+k {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(time.Millisecond)
		}
	}
	return true
}
