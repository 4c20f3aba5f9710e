package epcache_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epcache/epcache/internal/fixture"

	"github.com/epcache/epcache/epcache"
)

// endpoint stands for a connection: values are pointers, as in a real
// messaging layer.
type endpoint struct{ peer int }

// BenchmarkIdleSweep measures what IdleTimeout costs beside the hit, per
// value held: an idle sweep (each sweep ages every value a step, and comes
// every IdleTimeout/4), and the first Get of each value after it, which an
// aged value sends down the slow path once to make it young again (hit-aged,
// beside hit-young, the same Gets with no sweep between). MaxEntries is set
// too, so that the slow path counts the use for eviction, as it does in a
// cache with both. The sweeps run here, on one goroutine, not on the timer:
// IdleTimeout is an hour.
func BenchmarkIdleSweep(b *testing.B) {
	for _, peers := range []int{1024, 65536} {
		keys := fixture.UintKeys(peers)
		eps := make([]*endpoint, len(keys))
		for i := range eps {
			eps[i] = &endpoint{peer: i}
		}
		ctx := context.Background()
		lifecycle := func(cfg *epcache.Config[uint64, *endpoint]) {
			cfg.IdleTimeout, cfg.MaxEntries = time.Hour, len(keys)
		}
		getAll := func(b *testing.B, c *epcache.Cache[uint64, *endpoint]) { // b: the running benchmark's, for Fatal
			for _, k := range keys {
				if _, err := c.Get(ctx, k); err != nil {
					b.Fatal(err)
				}
			}
		}
		perValue := func(b *testing.B) {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(keys)), "ns/value")
		}
		name := func(part string) string { return "impl=epcache/part=" + part + "/peers=" + strconv.Itoa(peers) }
		b.Run(name("sweep"), func(b *testing.B) {
			c := fixture.FilledCache(b, keys, eps, lifecycle)
			for b.Loop() {
				epcache.SweepNow(c)
				b.StopTimer()
				getAll(b, c) // young again, or the sweeps would expire them
				b.StartTimer()
			}
			perValue(b)
		})
		b.Run(name("hit-aged"), func(b *testing.B) {
			c := fixture.FilledCache(b, keys, eps, lifecycle)
			for b.Loop() {
				b.StopTimer()
				epcache.SweepNow(c)
				b.StartTimer()
				getAll(b, c)
			}
			perValue(b)
		})
		b.Run(name("hit-young"), func(b *testing.B) {
			c := fixture.FilledCache(b, keys, eps, lifecycle)
			for b.Loop() {
				getAll(b, c)
			}
			perValue(b)
		})
	}
}

// BenchmarkLeasedRemoval measures what giving up a leased value costs:
// Invalidate of a value a lease holds (which marks every ticket of the
// value gone and counts those held), the lease's end that then releases it,
// and Close of a cache whose every value is leased, per value. A value
// whose leases grew lines of tickets (several goroutines leasing it at
// once) has more tickets to mark: lines=grown. At a million leased values
// Close is a million such removals, no more (peers=1000000).
func BenchmarkLeasedRemoval(b *testing.B) {
	ctx := context.Background()
	for _, grown := range []bool{false, true} {
		lines := map[bool]string{false: "none", true: "grown"}[grown]
		// acquire leases key, and with grown makes its value's lease
		// table grow lines first: leases that find its first ticket held.
		acquire := func(b *testing.B, c *epcache.Cache[uint64, *endpoint], k uint64) epcache.Lease[uint64, *endpoint] {
			l, err := c.Acquire(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			if grown {
				for range 16 {
					m, _ := c.Acquire(ctx, k)
					m.Release()
				}
			}
			return l
		}
		newCache := func(b *testing.B) *epcache.Cache[uint64, *endpoint] {
			c, err := epcache.New(epcache.Config[uint64, *endpoint]{
				Create:  func(_ context.Context, k uint64) (*endpoint, error) { return &endpoint{peer: int(k)}, nil },
				Release: func(uint64, *endpoint) {},
			})
			if err != nil {
				b.Fatal(err)
			}
			return c
		}
		b.Run("op=invalidate/lines="+lines, func(b *testing.B) {
			c := newCache(b)
			defer c.Close()
			leases := make([]epcache.Lease[uint64, *endpoint], b.N)
			for i := range leases {
				leases[i] = acquire(b, c, uint64(i))
			}
			b.ResetTimer()
			for i := range leases {
				c.Invalidate(uint64(i))
				leases[i].Release() // the last lease: releases the value
			}
		})
		for _, peers := range []int{1000, 1_000_000} {
			b.Run("op=close/lines="+lines+"/peers="+strconv.Itoa(peers), func(b *testing.B) {
				if grown && peers > 1000 {
					b.Skip("a million values with grown lines: a gigabyte of lines")
				}
				for range b.N {
					b.StopTimer()
					c := newCache(b)
					leases := make([]epcache.Lease[uint64, *endpoint], peers)
					for i := range leases {
						leases[i] = acquire(b, c, uint64(i))
					}
					b.StartTimer()
					c.Close()
					for _, l := range leases {
						l.Release()
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*peers), "ns/value")
			})
		}
	}
}

// BenchmarkMissUnderCap measures a lease under MaxEntries when most keys
// the cache is asked for are not held: the miss path, its wait for room
// and the eviction that makes it, with a Create that costs nothing, so
// that what is timed is the cache's own work. 100,000 peers asked for by a
// Zipf distribution (s 1.01) under a cap of 1,000, as epbench's hotset,
// from one goroutine (ctx background: Create runs on the caller) and from
// 64 (ctx cancellable: Create runs on a goroutine of its own, and its
// context is looked at, as a dial's is). b.N leases; the fraction that
// missed is reported as miss/op.
func BenchmarkMissUnderCap(b *testing.B) {
	const peers, capacity = 100_000, 1000
	newCache := func(b *testing.B) *epcache.Cache[uint64, *endpoint] {
		c, err := epcache.New(epcache.Config[uint64, *endpoint]{
			MaxEntries: capacity,
			Create: func(ctx context.Context, k uint64) (*endpoint, error) {
				if ctx.Err() != nil { // a Create that looks at its context
					return nil, ctx.Err()
				}
				return &endpoint{peer: int(k)}, nil
			},
			Release: func(uint64, *endpoint) {},
		})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	for _, g := range []int{1, 64} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
			c := newCache(b)
			defer c.Close()
			ctx := context.Background()
			if g > 1 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			seqs := make([][]uint64, g)
			for i := range seqs {
				seqs[i] = zipfKeys(uint64(i+1), peers, 1<<16)
			}
			b.ResetTimer()
			cpu0 := processCPU()
			var wg sync.WaitGroup
			per := b.N / g
			for i := range g {
				wg.Go(func() {
					keys := seqs[i]
					for n := range per + boolInt(i < b.N%g) {
						l, err := c.Acquire(ctx, keys[n%len(keys)])
						if err != nil {
							b.Error(err)
							return
						}
						l.Release()
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			st := c.Stats()
			b.ReportMetric(float64(st.Creates)/float64(b.N), "miss/op")
		})
	}
}

// zipfKeys returns n keys below peers drawn from a Zipf distribution with
// s 1.01, seeded by seed.
func zipfKeys(seed uint64, peers, n int) []uint64 {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, 0)), 1.01, 1, uint64(peers-1))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = z.Uint64()
	}
	return keys
}

// processCPU returns the CPU time this process has used, user and
// system, in nanoseconds: on a machine other work shares, the time a
// benchmark's operations took on the CPU, which its wall time is not.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
