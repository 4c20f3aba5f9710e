package etcddir

import (
	"context"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// Counters are what a [Directory] asked of etcd and what etcd sent it,
// since Open: the measure of its cost to etcd, which grows with the job
// (see "Choosing a mode" in the package doc). Each field counts requests
// that reached the client, answered or not.
type Counters struct {
	// Ranges counts range requests: one per page of a paginated read, one
	// per single-key read. KeysLoaded counts the keys they returned.
	Ranges, KeysLoaded int64
	// Puts, Txns and Deletes count writes: a Publish is a Put, a
	// PublishAll one Txn per 128 peers; republications, conditional
	// deletes and the fence are Txns.
	Puts, Txns, Deletes int64
	// Grants, Revokes and LeaseChecks count lease requests (LeaseChecks:
	// TimeToLive, after the keep-alives stopped).
	Grants, Revokes, LeaseChecks int64
	// Watches counts watches opened. Events counts the events they
	// delivered, and EventBytes their size as etcd encodes them.
	Watches, Events, EventBytes int64
	// Reloads counts the reads of a range again after its watch was lost
	// (etcd compacted past it, or its member lost the leader).
	Reloads int64

	// Resolves counts calls of Resolve. Fetches counts the reads of a
	// peer's key that OnDemand made on a miss: each serves every caller
	// that asked for the peer while it ran, and a peer it found absent is
	// then watched once for them all. Abandoned counts such watches
	// stopped because nobody waited for them any more.
	Resolves, Fetches, Abandoned int64
	// Cached is the number of addresses OnDemand holds now.
	Cached int64

	// LeaseRenewals counts the times this process found its lease gone and
	// wrote its publications again under a new one (or found them
	// superseded). Superseded counts publications ended by a newer life
	// of their peer, each counted once whatever it wrote is withdrawn.
	LeaseRenewals, Superseded int64
	// Malformed is [Directory.Malformed].
	Malformed int64
}

// Requests returns the requests to etcd the counters add up to: reads,
// writes, lease requests and watches opened (keep-alives not counted).
func (c Counters) Requests() int64 {
	return c.Ranges + c.Puts + c.Txns + c.Deletes + c.Grants + c.Revokes + c.LeaseChecks + c.Watches
}

// Add returns the sum of c and o, field by field: the counters of a job
// from those of its processes.
func (c Counters) Add(o Counters) Counters {
	return Counters{
		Ranges: c.Ranges + o.Ranges, KeysLoaded: c.KeysLoaded + o.KeysLoaded,
		Puts: c.Puts + o.Puts, Txns: c.Txns + o.Txns, Deletes: c.Deletes + o.Deletes,
		Grants: c.Grants + o.Grants, Revokes: c.Revokes + o.Revokes, LeaseChecks: c.LeaseChecks + o.LeaseChecks,
		Watches: c.Watches + o.Watches, Events: c.Events + o.Events, EventBytes: c.EventBytes + o.EventBytes,
		Reloads:  c.Reloads + o.Reloads,
		Resolves: c.Resolves + o.Resolves, Fetches: c.Fetches + o.Fetches, Abandoned: c.Abandoned + o.Abandoned,
		Cached:        c.Cached + o.Cached,
		LeaseRenewals: c.LeaseRenewals + o.LeaseRenewals, Superseded: c.Superseded + o.Superseded,
		Malformed: c.Malformed + o.Malformed,
	}
}

// counters are a Directory's Counters as they are kept.
type counters struct {
	ranges, keys                 atomic.Int64
	puts, txns, deletes          atomic.Int64
	grants, revokes, leaseChecks atomic.Int64
	watches, events, eventBytes  atomic.Int64
	reloads                      atomic.Int64
	resolves, fetches, abandoned atomic.Int64
	leaseRenewals, superseded    atomic.Int64
}

// Counters returns what this directory asked of etcd and received from it
// so far; see [Counters].
func (d *Directory) Counters() Counters {
	c := &d.count
	out := Counters{
		Ranges: c.ranges.Load(), KeysLoaded: c.keys.Load(),
		Puts: c.puts.Load(), Txns: c.txns.Load(), Deletes: c.deletes.Load(),
		Grants: c.grants.Load(), Revokes: c.revokes.Load(), LeaseChecks: c.leaseChecks.Load(),
		Watches: c.watches.Load(), Events: c.events.Load(), EventBytes: c.eventBytes.Load(),
		Reloads:  c.reloads.Load(),
		Resolves: c.resolves.Load(), Fetches: c.fetches.Load(), Abandoned: c.abandoned.Load(),
		LeaseRenewals: c.leaseRenewals.Load(), Superseded: c.superseded.Load(),
		Malformed: d.malformed.Load(),
	}
	if d.addrs != nil {
		out.Cached = int64(d.addrs.Len())
	}
	return out
}

// The requests below go through these helpers, which count them.

func (d *Directory) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	d.count.ranges.Add(1)
	resp, err := d.opts.Client.Get(ctx, key, opts...)
	if err == nil {
		d.count.keys.Add(int64(len(resp.Kvs)))
	}
	return resp, err
}

func (d *Directory) txn(ctx context.Context) clientv3.Txn {
	d.count.txns.Add(1)
	return d.opts.Client.Txn(ctx)
}

func (d *Directory) watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	d.count.watches.Add(1)
	return d.opts.Client.Watch(ctx, key, opts...)
}

// received counts the events of a watch response.
func (d *Directory) received(resp *clientv3.WatchResponse) {
	if len(resp.Events) == 0 {
		return
	}
	n := 0
	for _, ev := range resp.Events {
		n += proto.Size(ev)
	}
	d.count.events.Add(int64(len(resp.Events)))
	d.count.eventBytes.Add(int64(n))
}
