package epcache_test

import (
	"context"
	"strconv"
	"testing"
)

func BenchmarkLeaseHotTmp(b *testing.B) {
	for _, peers := range []int{1, 8, 1024} {
		keys := benchUintKeys(peers)
		eps := make([]*endpoint, len(keys))
		for i := range eps {
			eps[i] = &endpoint{peer: i}
		}
		ctx := context.Background()
		mask := len(keys) - 1
		b.Run("impl=get/peers="+strconv.Itoa(peers), func(b *testing.B) {
			c := filledCache(b, keys, eps)
			runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
				for i := first; pb.Next(); i++ {
					last, _ = c.Get(ctx, keys[i&mask])
				}
				return last
			})
		})
		b.Run("impl=lease/peers="+strconv.Itoa(peers), func(b *testing.B) {
			c := filledCache(b, keys, eps)
			runHit(b, func(pb *testing.PB, first int) (last *endpoint) {
				for i := first; pb.Next(); i++ {
					l, _ := c.Acquire(ctx, keys[i&mask])
					last = l.Value()
					l.Release()
				}
				return last
			})
		})
	}
}
