// Command hitpath is a user of package epcache, and only of it: the hit
// paths that TestHitPathMakesNoCalls disassembles are compiled here, as a
// user's program compiles them. (The test binary of package epcache imports
// package shard directly, and the Go compiler inlines shard's non-generic
// helpers into generic code only where shard is imported directly; a user's
// program imports epcache alone.)
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/epcache/epcache/epcache"
)

type endpoint struct{ peer string }

func main() {
	ctx := context.Background()
	ints, err := epcache.New(epcache.Config[uint64, *endpoint]{
		Create: func(_ context.Context, k uint64) (*endpoint, error) { return &endpoint{peer: fmt.Sprint(k)}, nil },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	strs, err := epcache.New(epcache.Config[string, *endpoint]{
		Create: func(_ context.Context, k string) (*endpoint, error) { return &endpoint{peer: k}, nil },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	use(ctx, ints, 7)
	use(ctx, strs, "node-7.example:4000")
	fmt.Println(ints.Close(), strs.Close())
}

// use calls every hit path: Get, Load, Acquire and Lease.Release.
func use[K comparable](ctx context.Context, c *epcache.Cache[K, *endpoint], key K) {
	ep, err := c.Get(ctx, key)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if again, ok := c.Load(key); !ok || again != ep {
		fmt.Fprintln(os.Stderr, "Load missed a value Get made")
		os.Exit(1)
	}
	l, err := c.Acquire(ctx, key)
	if err != nil || l.Value() != ep {
		fmt.Fprintln(os.Stderr, "Acquire:", err)
		os.Exit(1)
	}
	l.Release()
}
