package bench_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
)

// The go test benchmarks run the workloads of package bench through the same
// Cache interface epbench uses, named so that benchstat can split them:
//
//	go test -run '^$' -bench . -cpu 1,2,4,8 -count 10 ./bench | tee new.txt
//	benchstat -col /impl new.txt

const benchPeers = 1024

// filled builds a comparator over a fresh ledger whose creations cost cost,
// with every peer's endpoint already created (at no cost).
func filled[K comparable](b *testing.B, impl string, keys []K, peer func(K) int, dense bool, cost string) (bench.Cache[K], *bench.Ledger) {
	b.Helper()
	l := bench.NewLedger(len(keys), bench.MustCost(cost), 0)
	l.SetFree(true)
	defer l.SetFree(false)
	env := bench.Env[K]{
		Create:  func(ctx context.Context, k K) (*bench.Endpoint, error) { return l.Create(ctx, peer(k)) },
		Release: func(_ K, ep *bench.Endpoint) { l.Release(ep) },
		Peers:   len(keys),
	}
	if dense {
		env.Index = peer
	}
	c, err := bench.New(impl, env)
	if err != nil {
		b.Skip(err)
	}
	for _, k := range keys {
		if _, err := c.Get(context.Background(), k); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		c.Close()
		if cs := l.Counts(); cs.Creates != cs.Releases || cs.DoubleReleases != 0 {
			b.Errorf("%s leaked: %+v", impl, cs)
		}
	})
	return c, l
}

var sink atomic.Pointer[bench.Endpoint]

// BenchmarkHit is the hit workload: every peer ready, 100% Get.
func BenchmarkHit(b *testing.B) {
	for _, keys := range []string{"uint64", "string"} {
		for _, dist := range []string{"uniform", "zipf"} {
			for _, im := range bench.Impls {
				name := fmt.Sprintf("impl=%s/keys=%s/dist=%s", im.Name, keys, dist)
				b.Run(name, func(b *testing.B) {
					if keys == "string" {
						benchSteady(b, im.Name, bench.StringKeys(benchPeers), false, dist, 0, 0)
					} else {
						benchSteady(b, im.Name, bench.Uint64Keys(benchPeers), true, dist, 0, 0)
					}
				})
			}
		}
	}
}

// BenchmarkChurn is mostly hits; 1% of the operations report the endpoint
// just obtained as failed, so the next Get re-creates it (at spin:20us).
func BenchmarkChurn(b *testing.B) {
	for _, im := range bench.Impls {
		b.Run("impl="+im.Name+"/churn=1%", func(b *testing.B) {
			benchSteady(b, im.Name, bench.Uint64Keys(benchPeers), true, "uniform", 0.01, 0)
		})
	}
}

// BenchmarkMixed is Gets at a read ratio, and Invalidates of random peers.
func BenchmarkMixed(b *testing.B) {
	for _, reads := range []float64{1, 0.99, 0.9} {
		for _, im := range bench.Impls {
			b.Run(fmt.Sprintf("impl=%s/reads=%g%%", im.Name, reads*100), func(b *testing.B) {
				benchSteady(b, im.Name, bench.Uint64Keys(benchPeers), true, "uniform", 0, 1-reads)
			})
		}
	}
}

func benchSteady[K comparable](b *testing.B, impl string, keys []K, dense bool, dist string, churn, writes float64) {
	index := make(map[K]int, len(keys))
	for i, k := range keys {
		index[k] = i
	}
	peer := func(k K) int { return index[k] }
	if u, ok := any(keys).([]uint64); ok && len(u) > 0 {
		peer = func(k K) int { return int(any(k).(uint64)) } // dense ranks: the key is the peer
	}
	c, l := filled(b, impl, keys, peer, dense, "spin:20us")
	seq := atomic.Uint64{}
	var errs atomic.Int64
	churnAt, writeAt := uint64(churn*math.MaxUint64), uint64(writes*math.MaxUint64)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := seq.Add(1)
		order := bench.AccessSequence(dist, len(keys), g)
		rng := rand.New(rand.NewPCG(g, 7))
		var last *bench.Endpoint
		for i := 0; pb.Next(); i++ {
			p := order[i&bench.SeqMask]
			key := keys[p]
			if writeAt != 0 && rng.Uint64() < writeAt {
				if c.Invalidate(key) {
					l.Invalidated(int(p))
				}
				continue
			}
			ep, err := c.Get(ctx, key)
			if err != nil || ep.Peer != int(p) {
				errs.Add(1)
				continue
			}
			if churnAt != 0 && rng.Uint64() < churnAt && c.Report(key, ep) {
				l.Invalidated(int(p))
			}
			last = ep
		}
		sink.Store(last)
	})
	b.StopTimer()
	if n := errs.Load(); n != 0 {
		b.Fatalf("%d Gets failed or returned another peer's endpoint", n)
	}
	cs := l.Counts()
	b.ReportMetric(float64(cs.Creates-benchPeers)/float64(b.N), "creates/op")
	b.ReportMetric(float64(cs.Duplicates), "duplicates")
}

// BenchmarkStorm is the startup storm of the issue: P = 1,024 peers, G = 64
// goroutines, sleep:1ms creations; one operation is one whole storm.
func BenchmarkStorm(b *testing.B) {
	for _, im := range bench.Impls {
		b.Run(fmt.Sprintf("impl=%s/peers=%d/goroutines=64/cost=sleep:1ms", im.Name, benchPeers), func(b *testing.B) {
			benchStorm(b, bench.Spec{Workload: "storm", Impl: im.Name, Keys: "uint64", Dist: "uniform",
				Peers: benchPeers, Goroutines: 64, Cost: "sleep:1ms"})
		})
	}
}

// BenchmarkFlaky is a storm of 256 peers whose creations fail three times
// with "not yet published" before they succeed.
func BenchmarkFlaky(b *testing.B) {
	for _, im := range bench.Impls {
		b.Run(fmt.Sprintf("impl=%s/peers=256/goroutines=64/failures=3", im.Name), func(b *testing.B) {
			benchStorm(b, bench.Spec{Workload: "flaky", Impl: im.Name, Keys: "uint64", Dist: "uniform",
				Peers: 256, Goroutines: 64, Cost: "sleep:1ms", Failures: 3})
		})
	}
}

func benchStorm(b *testing.B, s bench.Spec) {
	b.ReportAllocs()
	var completion time.Duration
	var creates, duplicates uint64
	var overlap int
	for i := range b.N {
		s.Seed = uint64(i)
		r, err := bench.Run(context.Background(), s)
		if err != nil {
			b.Fatal(err)
		}
		if r.Failure != "" {
			b.Fatal(r.Failure)
		}
		completion += r.Completion
		creates += r.Creates
		duplicates += r.Duplicates
		overlap = max(overlap, r.Overlap)
	}
	b.ReportMetric(float64(completion)/float64(b.N)/1e6, "ms-to-ready")
	b.ReportMetric(float64(creates)/float64(b.N), "creates/op")
	b.ReportMetric(float64(duplicates)/float64(b.N), "duplicates/op")
	b.ReportMetric(float64(overlap), "max-overlap")
}
