package epcache_test

import (
	"context"
	"testing"

	"github.com/epcache/epcache/epcache"
)

// TestAllYieldsAKeyCreatedAgainDuringTheWalkOnce: Cache.All promises "no entry is yielded
// twice". A key invalidated (or evicted) and created again while All runs
// must not be yielded a second time by the same walk.
func TestAllYieldsAKeyCreatedAgainDuringTheWalkOnce(t *testing.T) {
	for _, evict := range []bool{false, true} {
		name := "invalidate"
		if evict {
			name = "evict"
		}
		t.Run(name, func(t *testing.T) {
			gen := 0
			var released []int
			cfg := epcache.Config[int, int]{
				Create:  func(_ context.Context, k int) (int, error) { gen++; return gen, nil },
				Release: func(k, v int) { released = append(released, k) },
				Shards:  1,
			}
			if evict {
				cfg.MaxEntries = 3
			}
			c, err := epcache.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			for k := 1; k <= 3; k++ {
				c.Get(ctx, k)
			}
			seen := map[int]int{}
			first := true
			for k := range c.All() {
				seen[k]++
				if !first {
					continue
				}
				first = false
				again := k
				if evict {
					c.Get(ctx, 100) // evicts one of 1..3
					if len(released) != 1 {
						t.Fatalf("released %v", released)
					}
					again = released[0]
				} else if !c.Invalidate(k) {
					t.Fatalf("Invalidate(%d) = false", k)
				}
				if _, err := c.Get(ctx, again); err != nil {
					t.Fatal(err)
				}
			}
			for k, n := range seen {
				if n > 1 {
					t.Errorf("All yielded key %d %d times (seen %v)", k, n, seen)
				}
			}
		})
	}
}

// TestPeersSeesAKeyCreatedAgainDuringTheWalkOnce: Peers promises it "sees each key once".
// A key invalidated and created again while Peers walks must not be
// reported twice.
func TestPeersSeesAKeyCreatedAgainDuringTheWalkOnce(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{
		Create: func(_ context.Context, k int) (int, error) { return k, nil },
		Shards: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for k := 1; k <= 3; k++ {
		c.Get(ctx, k)
	}
	seen := map[int]int{}
	first := true
	for p := range c.Peers() {
		seen[p.Key]++
		if first {
			first = false
			c.Invalidate(p.Key)
			c.Get(ctx, p.Key)
		}
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("Peers reported key %d %d times (seen %v)", k, n, seen)
		}
	}
}
