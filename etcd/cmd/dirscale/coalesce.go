package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/etcd/internal/etcdmetrics"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Coalescing is what one process's OnDemand directory asked etcd for when
// many goroutines of several layers asked it for the same peers at once.
type Coalescing struct {
	// Peers is the distinct peers asked for: Published of them had
	// published before the askers started, the others publish while the
	// askers wait.
	Peers     int `json:"peers"`
	Published int `json:"published"`
	// Layers × PerLayer goroutines ask for every peer, all released at
	// once: one layer calls Resolve, the other Lookup and then Resolve on
	// a miss, as a transport that checks its directory first.
	Layers   int `json:"layers"`
	PerLayer int `json:"per_layer"`
	// Asks is the number of answers the askers got, every one checked.
	Asks int `json:"asks"`
	// Resolves, Fetches, Ranges and Watches are the asking directory's
	// Counters over the asks: the calls of Resolve, the fetches they
	// made, and the range requests and watches those sent etcd.
	Resolves int64 `json:"resolves"`
	Fetches  int64 `json:"fetches"`
	Ranges   int64 `json:"ranges"`
	Watches  int64 `json:"watches"`
	// Etcd is what the server counted while the askers ran (its range
	// requests include the publisher's).
	Etcd etcdmetrics.Snapshot `json:"etcd"`
}

// coalesce measures Coalescing: a publisher publishes peers 0 to
// published-1, then layers × perLayer goroutines of one other process ask
// it for each of peers 0 to peers-1 at once, and the publisher publishes
// the rest while they wait.
func coalesce(ctx context.Context, self string, peers, published, layers, perLayer int) (Coalescing, error) {
	c := Coalescing{Peers: peers, Published: published, Layers: layers, PerLayer: perLayer}
	srv, err := startServer(ctx, self)
	if err != nil {
		return c, err
	}
	defer srv.stop()
	var clients [2]*clientv3.Client
	for i := range clients {
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.url}, DialTimeout: time.Minute, Logger: zap.NewNop()})
		if err != nil {
			return c, err
		}
		defer cl.Close()
		clients[i] = cl
	}
	const prefix = "/dirscale/coalesce/"
	open := func(cl *clientv3.Client, mode etcddir.Mode) (*etcddir.Directory, error) {
		return etcddir.Open(ctx, etcddir.Options{Client: cl, Prefix: prefix, Size: peers, Mode: mode, TTL: time.Hour, Timeout: time.Minute})
	}
	pub, err := open(clients[0], etcddir.Mirror)
	if err != nil {
		return c, err
	}
	defer pub.Close()
	asker, err := open(clients[1], etcddir.OnDemand)
	if err != nil {
		return c, err
	}
	defer asker.Close()
	for p := range published {
		if err := pub.Publish(p, addrOf(p)); err != nil {
			return c, err
		}
	}

	ask := []func(ctx context.Context, peer int) (string, error){
		asker.Resolve,
		func(ctx context.Context, peer int) (string, error) {
			if addr, err := asker.Lookup(peer); err == nil {
				return addr, nil
			}
			return asker.Resolve(ctx, peer)
		},
	}[:layers]
	before, err := etcdmetrics.Scrape(ctx, srv.url)
	if err != nil {
		return c, err
	}
	dir0 := asker.Counters()
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for p := range peers {
		for _, layer := range ask {
			for range perLayer {
				wg.Go(func() {
					<-start
					addr, err := layer(ctx, p)
					if err == nil && addr != addrOf(p) {
						err = fmt.Errorf("peer %d's address %q; want %q", p, addr, addrOf(p))
					}
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
					} else {
						c.Asks++
					}
				})
			}
		}
	}
	close(start)
	// The late peers publish once every asker of theirs waits on the
	// one watch of its fetch.
	for p := published; p < peers; p++ {
		for asker.Counters().Watches-dir0.Watches < int64(p-published+1) {
			if err := pause(ctx, time.Millisecond); err != nil {
				return c, err
			}
		}
		if err := pub.Publish(p, addrOf(p)); err != nil {
			return c, err
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		return c, fmt.Errorf("%d of %d asks failed, the first: %w", len(errs), peers*layers*perLayer, errs[0])
	}
	after, err := settle(ctx, srv.url)
	if err != nil {
		return c, err
	}
	c.Etcd = after.Sub(before)
	d := asker.Counters()
	c.Resolves, c.Fetches = d.Resolves-dir0.Resolves, d.Fetches-dir0.Fetches
	c.Ranges, c.Watches = d.Ranges-dir0.Ranges, d.Watches-dir0.Watches
	return c, nil
}

func addrOf(p int) string { return fmt.Sprintf("10.%d.%d.%d:7000", p>>16&255, p>>8&255, p&255) }
