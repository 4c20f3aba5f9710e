package etcddir

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// OnDemand: a process fetches the peers it asks for, through an endpoint
// cache of addresses (epcache), so that every goroutine and every layer of
// the process that asks for one peer at once shares one fetch, as PMIx's
// direct modex queues concurrent requests for one peer behind the one
// reply (openpmix #3415).

// address is what a fetch of a peer found: its address and the life it
// belongs to. Compared by value: Unreachable drops the one it names.
type address struct {
	addr string
	life int64
}

// onDemand is the state of OnDemand beside the cache.
type onDemand struct {
	mu       sync.Mutex
	demands  map[int]*demand // per peer, while a Resolve waits or a fetch runs
	stale    map[int]bool    // the next fetch of the peer reads linearizably (Unreachable)
	reviving map[int]bool    // a revival watch runs for the peer

	// old holds the peers whose key of the old format exists, as the
	// guard last saw them; oldWake is closed and replaced when it gains
	// one. Guarded by mu.
	old     map[int]bool
	oldWake chan struct{}

	// seen is the newest life of each peer the watchers were told of;
	// queue holds the news not yet delivered. Guarded by mu.
	seen  map[int]int64
	queue []news
	wake  chan struct{} // signalled when queue gains news
}

// demand counts the Resolves of one peer waiting, so that a fetch nobody
// waits for any more stops.
type demand struct {
	waiting    int
	background bool                    // a fetch started by Lookup runs
	cancel     context.CancelCauseFunc // of the fetch in flight; nil if none
}

type news struct {
	peer int
	addr string
}

// errAbandoned ends a fetch whose askers all left.
var errAbandoned = errors.New("etcddir: fetch abandoned: nobody waits for it")

func (d *Directory) openOnDemand(ctx context.Context) error {
	d.ond = onDemand{
		demands: map[int]*demand{}, stale: map[int]bool{}, reviving: map[int]bool{},
		old: map[int]bool{}, oldWake: make(chan struct{}),
		seen: map[int]int64{}, wake: make(chan struct{}, 1),
	}
	addrs, err := epcache.New(epcache.Config[int, address]{
		Create:      d.fetch,
		MaxEntries:  d.opts.MaxEntries,
		IdleTimeout: d.opts.IdleTimeout,
	})
	if err != nil {
		return fmt.Errorf("etcddir: %w", err)
	}
	d.addrs = addrs
	rev, err := d.loadOld(ctx)
	if err != nil {
		addrs.Close()
		return fmt.Errorf("etcddir: reading %q from etcd at %v: %w", d.opts.Prefix, d.opts.Client.Endpoints(), err)
	}
	d.spawn(func() { d.guard(rev) })
	d.spawn(d.deliver)
	return nil
}

// The guard: a job whose processes mix key formats must fail clearly, not
// wait forever for a peer that published where this process does not
// look. It reads the range of the old format's keys at Open (empty in a
// job of one format) and watches it: one range and one silent watch per
// process.

func (d *Directory) loadOld(ctx context.Context) (int64, error) {
	start, end := d.oldRange()
	var found map[int]bool
	rev, err := d.rangeNewest(ctx, start, end, true, func() { found = map[int]bool{} }, func(kv *mvccpb.KeyValue) {
		if peer, kind, _ := d.parseKey(kv.Key); kind == kindOld {
			found[peer] = true
		}
	})
	if err != nil {
		return 0, err
	}
	d.ond.mu.Lock()
	d.ond.old = found
	d.malformed.Store(int64(len(found)))
	d.wakeOldLocked()
	d.ond.mu.Unlock()
	return rev, nil
}

func (d *Directory) wakeOldLocked() {
	close(d.ond.oldWake)
	d.ond.oldWake = make(chan struct{})
}

func (d *Directory) guard(rev int64) {
	start, end := d.oldRange()
	backoff := minBackoff
	for {
		var progressed bool
		rev, progressed, _ = d.follow(start, end, rev, nil, func(ev *clientv3.Event) {
			peer, kind, _ := d.parseKey(ev.Kv.Key)
			if kind != kindOld {
				return
			}
			d.ond.mu.Lock()
			defer d.ond.mu.Unlock()
			put := ev.Type == mvccpb.Event_PUT
			if put == d.ond.old[peer] {
				return
			}
			if put {
				d.ond.old[peer] = true
				d.malformed.Add(1)
				d.wakeOldLocked()
			} else {
				delete(d.ond.old, peer)
				d.malformed.Add(-1)
			}
		})
		if progressed {
			backoff = minBackoff
		}
		if pause(d.ctx, jitter(backoff)) != nil {
			return
		}
		backoff = min(2*backoff, maxBackoff)
		if r, err := d.loadOld(d.ctx); err == nil {
			rev = r
			d.count.reloads.Add(1)
		}
	}
}

// oldPeer reports whether peer published under the old format, and
// returns the channel closed when the guard next learns of such a peer.
func (d *Directory) oldPeer(peer int) (old bool, wake <-chan struct{}) {
	d.ond.mu.Lock()
	defer d.ond.mu.Unlock()
	return d.ond.old[peer], d.ond.oldWake
}

func (d *Directory) lookupOnDemand(peer int) (string, error) {
	if a, ok := d.addrs.Load(peer); ok {
		return a.addr, nil
	}
	if old, _ := d.oldPeer(peer); old {
		return "", d.oldFormatError(peer)
	}
	d.fetchInBackground(peer)
	return "", &directory.NotPublishedError{Peer: peer}
}

// fetchInBackground starts a fetch of peer for Lookup, unless one runs.
func (d *Directory) fetchInBackground(peer int) {
	d.ond.mu.Lock()
	dm := d.ond.demands[peer]
	if dm != nil && (dm.background || dm.cancel != nil) {
		d.ond.mu.Unlock()
		return
	}
	if dm == nil {
		dm = &demand{}
		d.ond.demands[peer] = dm
	}
	dm.background = true
	dm.waiting++ // held for the goroutine, which lets it go
	d.ond.mu.Unlock()
	started := d.spawn(func() {
		ctx, cancel := d.request(d.ctx)
		defer cancel()
		_, _ = d.resolveWaiting(ctx, peer)
		d.ond.mu.Lock()
		dm.background = false
		d.ond.mu.Unlock()
		d.want(peer, -1)
	})
	if !started {
		d.ond.mu.Lock()
		dm.background = false
		d.ond.mu.Unlock()
		d.want(peer, -1)
	}
}

// want adds delta to the Resolves of peer waiting; when none is left, the
// fetch in flight, if any, is cancelled.
func (d *Directory) want(peer, delta int) {
	d.ond.mu.Lock()
	defer d.ond.mu.Unlock()
	dm := d.ond.demands[peer]
	if dm == nil {
		dm = &demand{}
		d.ond.demands[peer] = dm
	}
	dm.waiting += delta
	if dm.waiting > 0 {
		return
	}
	if dm.cancel != nil {
		dm.cancel(errAbandoned)
	} else if !dm.background {
		delete(d.ond.demands, peer)
	}
}

func (d *Directory) resolveOnDemand(ctx context.Context, peer int) (string, error) {
	d.want(peer, 1)
	defer d.want(peer, -1)
	return d.resolveWaiting(ctx, peer)
}

// resolveWaiting is Resolve for a caller counted in peer's demand.
func (d *Directory) resolveWaiting(ctx context.Context, peer int) (string, error) {
	for {
		a, err := d.addrs.Get(ctx, peer)
		switch {
		case err == nil:
			return a.addr, nil
		case ctx.Err() != nil:
			return "", d.notPublishedBy(ctx, peer)
		case errors.Is(err, errAbandoned):
			// Joined a fetch its askers had left, which ended before this
			// caller's demand could keep it: fetch again.
			continue
		case errors.Is(err, epcache.ErrClosed), d.ctx.Err() != nil:
			return "", errClosed
		}
		return "", err
	}
}

// fetch is the address cache's Create: it reads peer's key, and waits for
// the peer to publish if it has not, until the peer's askers all leave.
func (d *Directory) fetch(ctx context.Context, peer int) (address, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	d.ond.mu.Lock()
	dm := d.ond.demands[peer]
	if dm == nil || dm.waiting <= 0 {
		d.ond.mu.Unlock()
		return address{}, errAbandoned
	}
	dm.cancel = cancel
	linear := d.ond.stale[peer]
	delete(d.ond.stale, peer)
	d.ond.mu.Unlock()
	defer func() {
		d.ond.mu.Lock()
		dm.cancel = nil
		if dm.waiting <= 0 && !dm.background {
			delete(d.ond.demands, peer)
		}
		d.ond.mu.Unlock()
	}()
	d.count.fetches.Add(1)
	a, err := d.fetchKey(ctx, peer, linear, 0, false)
	switch {
	case err == nil:
		if errors.Is(context.Cause(ctx), epcache.ErrOffered) {
			// An Offer answered this fetch meanwhile, and the cache drops
			// what it returns: keep it if it is the newer life.
			d.spawn(func() { d.keepNewer(peer, a) })
		}
		d.newLife(peer, a)
		return a, nil
	case errors.Is(context.Cause(ctx), errAbandoned):
		d.count.abandoned.Add(1)
		err = errAbandoned
	case errors.Is(context.Cause(ctx), epcache.ErrOffered):
		return address{}, err // answered by what Offer gave: nothing owed
	}
	if linear {
		d.ond.mu.Lock()
		d.ond.stale[peer] = true // still owed a linearizable read
		d.ond.mu.Unlock()
	}
	return address{}, err
}

// fetchKey reads peer's key until it holds a valid life newer than after:
// one read of the key (linearizable if linear, serializable otherwise),
// then, if that finds nothing, a watch of the key from the read's
// revision. A watch lost (compaction, a member without a leader) is
// followed by a linearizable read again. It ends with ctx.
//
// A garbled value is an error, unless waitValid is set: then it is passed
// over, as an absent key is, until a valid life is written.
func (d *Directory) fetchKey(ctx context.Context, peer int, linear bool, after int64, waitValid bool) (address, error) {
	key := d.key(peer)
	backoff := minBackoff
	for {
		var opts []clientv3.OpOption
		if !linear {
			opts = append(opts, clientv3.WithSerializable())
		}
		rctx, cancel := d.request(ctx)
		resp, err := d.get(rctx, key, opts...)
		cancel()
		if err == nil {
			if len(resp.Kvs) > 0 {
				a, err := d.decodeAddress(peer, resp.Kvs[0])
				if err != nil && !waitValid || err == nil && a.life > after {
					return a, err
				}
			}
			if old, _ := d.oldPeer(peer); old {
				return address{}, d.oldFormatError(peer)
			}
			var found bool
			var a address
			a, found, err = d.await(ctx, peer, key, resp.Header.Revision, after, waitValid)
			if found || err != nil {
				return a, err
			}
		}
		if ctx.Err() != nil {
			return address{}, ctx.Err()
		}
		// etcd did not answer, or the watch was lost: read again, from
		// the leader's view (a serializable read of a lagging member
		// might take this process back before what the watch saw).
		linear = true
		if pause(ctx, jitter(backoff)) != nil {
			return address{}, ctx.Err()
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// await watches peer's key after revision rev until a put of a valid life
// newer than after (found), an invalid value (an error, unless waitValid)
// or an old-format key of the peer (an error), or the watch's end
// (neither: read again).
func (d *Directory) await(ctx context.Context, peer int, key string, rev, after int64, waitValid bool) (a address, found bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := d.watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	_, oldWake := d.oldPeer(peer)
	for {
		select {
		case <-ctx.Done():
			return address{}, false, ctx.Err()
		case <-oldWake:
			var old bool
			if old, oldWake = d.oldPeer(peer); old {
				return address{}, false, d.oldFormatError(peer)
			}
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				return address{}, false, nil
			}
			d.received(&resp)
			for _, ev := range resp.Events {
				if ev.Type != mvccpb.Event_PUT {
					continue
				}
				a, err := d.decodeAddress(peer, ev.Kv)
				if err != nil && !waitValid || err == nil && a.life > after {
					return a, err == nil, err
				}
			}
		}
	}
}

// decodeAddress reads the address kv holds for peer.
func (d *Directory) decodeAddress(peer int, kv *mvccpb.KeyValue) (address, error) {
	addr, life, err := decode(kv)
	switch {
	case err != nil:
		return address{}, fmt.Errorf("etcddir: peer %d's value under %q is invalid: %w", peer, kv.Key, err)
	case addr == "":
		err = errors.New("the address is empty")
	case d.opts.Validate != nil:
		err = d.opts.Validate(addr)
	}
	if err != nil {
		return address{}, fmt.Errorf("etcddir: peer %d's address %q under %q is invalid: %w", peer, addr, kv.Key, err)
	}
	return address{addr: addr, life: life}, nil
}

// unreachable is Unreachable in OnDemand mode.
func (d *Directory) unreachable(peer int, addr string) {
	a, held := d.addrs.Load(peer)
	switch {
	case !held:
		// Dropped already (MaxEntries, IdleTimeout, another report): the
		// next fetch reads linearizably, but which life failed is not
		// known, so none is waited for.
		d.ond.mu.Lock()
		d.ond.stale[peer] = true
		d.ond.mu.Unlock()
		return
	case a.addr != addr:
		return // a report about an older address: the newer stays
	case !d.addrs.CompareAndInvalidate(peer, a):
		return // dropped or replaced meanwhile
	}
	d.ond.mu.Lock()
	d.ond.stale[peer] = true
	revive := !d.ond.reviving[peer]
	d.ond.reviving[peer] = true
	d.ond.mu.Unlock()
	if revive && !d.spawn(func() { d.revive(peer, a.life) }) {
		d.ond.mu.Lock()
		delete(d.ond.reviving, peer)
		d.ond.mu.Unlock()
	}
}

// revive watches peer's key for a life newer than dead, the one reported
// unreachable: when one appears, the address cache gets it (answering a
// fetch in flight) and the watchers hear of it. It ends then, or at Close.
func (d *Directory) revive(peer int, dead int64) {
	defer func() {
		d.ond.mu.Lock()
		delete(d.ond.reviving, peer)
		d.ond.mu.Unlock()
	}()
	a, err := d.fetchKey(d.ctx, peer, true, dead, true)
	if err != nil {
		return // Close, or the peer moved to the old key format: nothing will come
	}
	d.keepNewer(peer, a)
	d.newLife(peer, a)
}

// keepNewer puts a into the address cache unless it holds a's life or a
// newer one: a newer life replaces an older one (the older is compared
// and invalidated, then a offered), never the reverse, so that what the
// watchers are told of next (newLife, which callers call after
// keepNewer) is what Lookup answers from then on. A life older than one
// the watchers were told of is not kept: it is over. Offer answers a
// fetch in flight; a cache that is full (MaxEntries) or closed keeps
// nothing, and the next ask fetches.
func (d *Directory) keepNewer(peer int, a address) {
	for {
		d.ond.mu.Lock()
		over := a.life < d.ond.seen[peer]
		d.ond.mu.Unlock()
		if over {
			return
		}
		if cur, held := d.addrs.Load(peer); held {
			if cur.life >= a.life {
				return
			}
			if !d.addrs.CompareAndInvalidate(peer, cur) {
				continue // replaced or dropped meanwhile: look again
			}
		}
		if d.addrs.Offer(peer, a) {
			return
		}
		if _, held := d.addrs.Load(peer); !held {
			return // full or closed: nothing to compare with
		}
		// A fetch stored a value first: compare with it.
	}
}

// newLife tells the watchers of a, if it is a newer life of peer than any
// they heard of.
func (d *Directory) newLife(peer int, a address) {
	d.ond.mu.Lock()
	defer d.ond.mu.Unlock()
	if a.life <= d.ond.seen[peer] {
		return
	}
	d.ond.seen[peer] = a.life
	d.ond.queue = append(d.ond.queue, news{peer, a.addr})
	select {
	case d.ond.wake <- struct{}{}:
	default:
	}
}

// deliver calls the watchers with the news, in the order it came, until
// Close.
func (d *Directory) deliver() {
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-d.ond.wake:
		}
		d.ond.mu.Lock()
		q := d.ond.queue
		d.ond.queue = nil
		d.ond.mu.Unlock()
		for _, n := range q {
			d.notify(n.peer, n.addr)
		}
	}
}
