package epcache_test

import (
	"context"
	"strconv"
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
