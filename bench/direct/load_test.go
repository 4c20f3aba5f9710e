package direct_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/epcache/epcache/shard"
	xsync4 "github.com/puzpuzpuz/xsync/v4"
)

// publish makes v the ready value of key in t.
func publish[K comparable, V any](b *testing.B, t *shard.Table[K, V], key K, v V) {
	s := t.LoadOrInsert(key)
	claim, _, ok := s.Claim(s.State(), context.Background())
	if !ok || !t.Publish(s, claim, v) {
		b.Fatalf("publishing %v", key)
	}
}

func benchLoad[K comparable](b *testing.B, keys []K) {
	t, _ := shard.New[K, *endpoint](shard.Options[K]{})
	m := xsync4.NewMap[K, *endpoint]()
	for i, k := range keys {
		publish(b, t, k, &endpoint{i})
		m.Store(k, &endpoint{i})
	}
	mask := len(keys) - 1
	b.Run("impl=shard", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				if _, ok := t.Load(keys[i&mask]); !ok {
					b.Fatal("miss")
				}
			}
		})
	})
	b.Run("impl=xsync4", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				if _, ok := m.Load(keys[i&mask]); !ok {
					b.Fatal("miss")
				}
			}
		})
	})
}

// BenchmarkLoad is the table's own hit path beside xsync v4's Map, without
// the epcache layer on top.
func BenchmarkLoad(b *testing.B) {
	for _, n := range []int{1024, 65536} {
		strs := make([]string, n)
		ints := make([]uint64, n)
		for i := range strs {
			strs[i] = "node-" + strconv.Itoa(i/64) + ":rank-" + strconv.Itoa(i)
			ints[i] = uint64(i) * 0x9e3779b97f4a7c15
		}
		b.Run("keys=uint64/peers="+strconv.Itoa(n), func(b *testing.B) { benchLoad(b, ints) })
		b.Run("keys=string/peers="+strconv.Itoa(n), func(b *testing.B) { benchLoad(b, strs) })
	}
}
