package shard_test

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
)

// TestGrowthNeverBlocksReaders has a writer insert and publish hundreds of
// thousands of keys into a table of one shard, whose array is therefore
// rebuilt again and again under the shard's mutex, while readers Load keys
// that are present. No Load may miss. That no Load waits for a rebuild is
// shown without a clock by TestReadersDoNotLock (a Load completes while the
// shard's mutex is held); the times are logged, never asserted, since a
// descheduled reader on a busy 2-core machine would make any bound flaky.
// Halfway through, the writer waits until every reader has made a Load
// since it got there: each reader reads the grown table however late the
// scheduler starts it, and goes on reading while the writer grows it more.
//
// Under the race detector it adds 100,000 keys: the detector frees the
// shadow of each replaced array in one long call that cannot be preempted.
func TestGrowthNeverBlocksReaders(t *testing.T) {
	writes := 300_000
	switch {
	case testing.Short():
		writes = 20_000
	case raceEnabled:
		writes = 100_000
	}
	growTableWhileReading(t, writes)
}

// growTableWhileReading runs TestGrowthNeverBlocksReaders, logging the
// slowest Load and the slowest insertion (a rebuild).
func growTableWhileReading(t *testing.T, writes int) {
	var slowestWrite time.Duration
	const present = 1024
	tb := newTable[int, int](t, shard.Options[int]{Shards: 1})
	for k := range present {
		publish(t, tb, k, k)
	}
	var stop, halfway atomic.Bool
	var wg, readHalfway sync.WaitGroup
	type readerStats struct {
		reads, misses int
		worst         time.Duration
	}
	readers := make([]readerStats, max(1, runtime.GOMAXPROCS(0)-1))
	readHalfway.Add(len(readers))
	for i := range readers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 10))
			rs := &readers[i]
			waiting := true // the writer waits for a Load of ours begun halfway
			for !stop.Load() {
				begunHalfway := halfway.Load()
				k := r.IntN(present)
				t0 := time.Now()
				v, ok := tb.Load(k)
				d := time.Since(t0)
				rs.reads++
				rs.worst = max(rs.worst, d)
				if !ok || v != k {
					rs.misses++
				}
				if waiting && begunHalfway {
					waiting = false
					readHalfway.Done()
				}
			}
		})
	}
	start := time.Now()
	for k := present; k < present+writes; k++ {
		if k == present+writes/2 {
			halfway.Store(true)
			readHalfway.Wait()
		}
		t0 := time.Now()
		s := tb.LoadOrInsert(k)
		slowestWrite = max(slowestWrite, time.Since(t0))
		claim, _, ok := s.Claim(nil, nil)
		if !ok || !tb.Publish(s, claim, k) {
			t.Fatalf("publish of key %d", k)
		}
	}
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	for i, rs := range readers {
		t.Logf("reader %d: %d Loads while %d keys were added in %v (slowest insertion, a rebuild: %v); slowest Load %v",
			i, rs.reads, writes, elapsed.Round(time.Millisecond), slowestWrite, rs.worst)
		assert.Positive(t, rs.reads)
		assert.Zero(t, rs.misses, "reader %d missed a present key", i)
	}
}
