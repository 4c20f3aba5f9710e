package epcache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/epcache"
)

// Endpoint stands for a connection to one peer.
type Endpoint struct {
	Rank   int
	closed bool
}

func (e *Endpoint) Close() { e.closed = true }

func ExampleNew() {
	var dials atomic.Int32
	cache, err := epcache.New(epcache.Config[int, *Endpoint]{
		// Create dials a peer. It runs once per peer, however many
		// goroutines ask for that peer at once.
		Create: func(ctx context.Context, rank int) (*Endpoint, error) {
			dials.Add(1)
			return &Endpoint{Rank: rank}, nil
		},
		// Release closes every endpoint the cache gives up, exactly once.
		Release:       func(rank int, ep *Endpoint) { ep.Close() },
		CreateTimeout: 5 * time.Second,
		Retry:         epcache.Backoff(10*time.Millisecond, time.Second, 5, nil),
		ErrorTTL:      time.Second,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ep, err := cache.Get(context.Background(), 3)
	fmt.Println(ep.Rank, err)

	// Report a broken endpoint: only this exact endpoint is dropped.
	cache.CompareAndInvalidate(3, ep)
	fmt.Println("closed after invalidation:", ep.closed)

	ep, _ = cache.Get(context.Background(), 3) // reconnects
	_ = cache.Close()                          // closes what is left
	fmt.Println("dials:", dials.Load(), "closed at Close:", ep.closed)
	// Output:
	// 3 <nil>
	// closed after invalidation: true
	// dials: 2 closed at Close: true
}

func ExampleNew_badConfig() {
	_, err := epcache.New(epcache.Config[string, *Endpoint]{Shards: -4})
	fmt.Println(err)
	// Output:
	// epcache: Config.Create is nil; it is required
}

// Many goroutines need the same peer at once, as at the start of an MPI job:
// one of them creates the endpoint, the others wait for it.
func ExampleCache_Get() {
	release := make(chan struct{})
	cache, _ := epcache.New(epcache.Config[string, *Endpoint]{
		Create: func(ctx context.Context, peer string) (*Endpoint, error) {
			<-release // a slow connect
			return &Endpoint{Rank: len(peer)}, nil
		},
	})
	defer cache.Close()

	var wg sync.WaitGroup
	got := make([]*Endpoint, 100)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], _ = cache.Get(context.Background(), "node-7")
		}()
	}
	// A caller in a hurry leaves on its own context; the creation goes on.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err := cache.Get(ctx, "node-7")
	fmt.Println(errors.Is(err, context.DeadlineExceeded))

	close(release)
	wg.Wait()
	same := true
	for _, ep := range got {
		same = same && ep == got[0]
	}
	st := cache.Stats()
	fmt.Println("one endpoint for all:", same, "creates:", st.Creates)
	// Output:
	// true
	// one endpoint for all: true creates: 1
}
