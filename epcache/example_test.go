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
		CreateTimeout: time.Minute,
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

// A send holds a lease on its endpoint: a failure reported meanwhile, by
// this send or any other, drops the endpoint from the cache at once (the
// next Acquire reconnects), but it is closed only when the last send using
// it lets go.
func ExampleCache_Acquire() {
	cache, _ := epcache.New(epcache.Config[int, *Endpoint]{
		Create:  func(ctx context.Context, rank int) (*Endpoint, error) { return &Endpoint{Rank: rank}, nil },
		Release: func(rank int, ep *Endpoint) { ep.Close() },
	})
	defer cache.Close()

	lease, err := cache.Acquire(context.Background(), 5)
	if err != nil {
		fmt.Println(err)
		return
	}
	ep := lease.Value()
	// Another sender saw the connection fail and reported it.
	fmt.Println("dropped:", cache.CompareAndInvalidate(5, ep))
	fmt.Println("closed under the send:", ep.closed)
	next, _ := cache.Get(context.Background(), 5)
	fmt.Println("the next Get reconnects:", next != ep)

	lease.Release() // the send is done: the last lease closes the endpoint
	fmt.Println("closed after the send:", ep.closed)
	// Output:
	// dropped: true
	// closed under the send: false
	// the next Get reconnects: true
	// closed after the send: true
}

// A peer connected to us while we were connecting to it: the accepted
// connection, offered to the cache, answers our creation in flight, and the
// connection our Create returns anyway is released. Which one wins is what
// reached the cache first; both sides of a transport keep the same one by a
// tie-break of their own (see transport/tcp).
func ExampleCache_Offer() {
	dialing := make(chan struct{})
	givenUp := make(chan error, 1)
	cache, _ := epcache.New(epcache.Config[int, *Endpoint]{
		Create: func(ctx context.Context, rank int) (*Endpoint, error) {
			close(dialing)
			<-ctx.Done() // a slow dial, given up once an Offer answers it
			givenUp <- context.Cause(ctx)
			return &Endpoint{Rank: rank}, nil
		},
		Release: func(rank int, ep *Endpoint) { ep.Close() },
	})
	defer cache.Close()

	got := make(chan *Endpoint)
	go func() {
		ep, _ := cache.Get(context.Background(), 2)
		got <- ep
	}()
	<-dialing
	accepted := &Endpoint{Rank: 2}
	fmt.Println("offered:", cache.Offer(2, accepted))
	fmt.Println("the sender got the accepted connection:", <-got == accepted)
	fmt.Println("dial given up:", errors.Is(<-givenUp, epcache.ErrOffered))
	fmt.Println("a second offer is refused:", !cache.Offer(2, &Endpoint{Rank: 2}))
	// Output:
	// offered: true
	// the sender got the accepted connection: true
	// dial given up: true
	// a second offer is refused: true
}
