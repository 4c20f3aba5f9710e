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
//
// A fetch (the cache's Create) is one read of the peer's key. epcache
// counts a creation in flight against MaxEntries, so a fetch that waited
// inside the cache for a peer to publish would hold the room of an
// address for as long as the peer takes, and with MaxEntries reached,
// every lookup of a published peer would wait behind it. A peer found
// absent is therefore waited for outside the cache: the fetch registers a
// wait (pending) with the peer's demand and fails with errAwaiting, which
// sends its askers to that wait. The wait watches the key from the read's
// revision, one watch for all the peer's askers, and gives them the
// address it finds, which it also offers to the cache.

// address is what a fetch of a peer found: its address, the life it
// belongs to, and the revision of the write read (the key's
// ModRevision). Compared by value: Unreachable drops the one it names.
type address struct {
	addr    string
	life    int64
	written int64
}

// failure is what a fetch found wrong with a peer's key: err, in the
// write of revision written (0: not a write of the key, such as the old
// key format with this format's key absent).
type failure struct {
	err     error
	written int64
}

// onDemand is the state of OnDemand beside the cache.
type onDemand struct {
	mu       sync.Mutex
	demands  map[int]*demand // per peer, while a Resolve of it (or Lookup's background fetch) runs
	stale    map[int]bool    // the next fetch of the peer reads linearizably (Unreachable)
	reviving map[int]bool    // a revival watch runs for the peer

	// dead is, per peer, the newest life reported unreachable
	// (Unreachable of the address the cache held). No revival, Prefetch
	// or Offer puts it, or an older life, back into the cache: only a
	// fetch does, which reads the key again (a false alarm, or a lease
	// not yet expired). A revival waits for a life newer than it. Guarded
	// by mu.
	dead map[int]int64

	// failed holds, per peer, what the last fetch or wait of the peer
	// found wrong: an invalid value, or the old key format. Lookup answers
	// it, so that a transport that calls only Lookup learns it. A fetch
	// or wait that finds the key absent or valid clears it; so does a
	// valid life that Prefetch or a revival finds in a later write than
	// the wrong one (a Prefetch at an older revision leaves a newer
	// write's error alone). Guarded by mu.
	failed map[int]failure

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

// demand counts the askers of one peer (its Resolves under way, and
// Lookup's background fetch), so that a wait for the peer that nobody
// waits for any more stops.
type demand struct {
	waiting    int
	background bool     // a fetch started by Lookup runs
	wait       *pending // the wait for the peer to publish; nil if none runs
}

// pending is a wait for a peer to publish, shared by its askers: done is
// closed when it ends, after a and err are set (a valid address, or the
// error that ended the wait: a garbled value, the old key format,
// errAbandoned, errClosed).
type pending struct {
	done   chan struct{}
	a      address
	err    error
	cancel context.CancelCauseFunc
}

type news struct {
	peer int
	addr string
}

var (
	// errAbandoned ends a wait whose askers all left.
	errAbandoned = errors.New("etcddir: wait abandoned: nobody waits for it")
	// errAwaiting is a fetch's answer for a peer that has not published:
	// its askers wait for it outside the cache (pending). Never returned
	// to a caller of the directory.
	errAwaiting = errors.New("etcddir: the peer has not published; its askers wait for it outside the address cache")
)

func (d *Directory) openOnDemand(ctx context.Context) error {
	d.ond = onDemand{
		demands: map[int]*demand{}, stale: map[int]bool{}, reviving: map[int]bool{}, dead: map[int]int64{}, failed: map[int]failure{},
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

// lookupOnDemand answers from what this process fetched: the address the
// cache holds, or else what the last fetch of the peer found wrong, or
// else "not published"; on a miss it fetches the peer in the background.
// The old key format is answered only once a fetch found no key of this
// format: a peer with keys of both formats is answered by this one's.
func (d *Directory) lookupOnDemand(peer int) (string, error) {
	if a, ok := d.addrs.Load(peer); ok {
		return a.addr, nil
	}
	d.fetchInBackground(peer)
	d.ond.mu.Lock()
	err := d.ond.failed[peer].err
	d.ond.mu.Unlock()
	if err != nil {
		return "", err
	}
	return "", &directory.NotPublishedError{Peer: peer}
}

// found records what a fetch or wait of peer, which reads the newest,
// found: err, an invalid value or the old key format, in the write of
// revision written, or nil, the key absent or valid.
func (d *Directory) found(peer int, written int64, err error) {
	d.ond.mu.Lock()
	defer d.ond.mu.Unlock()
	if err != nil {
		d.ond.failed[peer] = failure{err, written}
	} else {
		delete(d.ond.failed, peer)
	}
}

// foundValid records that Prefetch or a revival found a valid life of
// peer in the write of revision written: it clears what a fetch found
// wrong in an earlier write, not in a later one.
func (d *Directory) foundValid(peer int, written int64) {
	d.ond.mu.Lock()
	defer d.ond.mu.Unlock()
	if f, ok := d.ond.failed[peer]; ok && f.written < written {
		delete(d.ond.failed, peer)
	}
}

// fetchInBackground starts a fetch of peer for Lookup, unless one runs or
// a Resolve of the peer is under way.
func (d *Directory) fetchInBackground(peer int) {
	d.ond.mu.Lock()
	dm := d.ond.demands[peer]
	if dm != nil && (dm.background || dm.waiting > 0) {
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

// want adds delta to the askers of peer; when none is left, the wait for
// the peer, if one runs, is detached and cancelled, so that a later asker
// starts a wait of its own.
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
	if w := dm.wait; w != nil {
		dm.wait = nil
		w.cancel(errAbandoned)
	}
	if !dm.background {
		delete(d.ond.demands, peer)
	}
}

// currentWait returns the wait for peer that runs, or nil.
func (d *Directory) currentWait(peer int) *pending {
	d.ond.mu.Lock()
	defer d.ond.mu.Unlock()
	if dm := d.ond.demands[peer]; dm != nil {
		return dm.wait
	}
	return nil
}

func (d *Directory) resolveOnDemand(ctx context.Context, peer int) (string, error) {
	d.want(peer, 1)
	defer d.want(peer, -1)
	return d.resolveWaiting(ctx, peer)
}

// resolveWaiting is Resolve for a caller counted in peer's demand: it
// joins the wait for the peer if one runs, and asks the address cache
// otherwise. A fetch that finds the peer absent starts a wait before it
// fails with errAwaiting, so that the askers it answers, and those that
// come after, find that wait and share it.
func (d *Directory) resolveWaiting(ctx context.Context, peer int) (string, error) {
	for {
		if w := d.currentWait(peer); w != nil {
			select {
			case <-w.done:
			case <-ctx.Done():
				return "", d.notPublishedBy(ctx, peer)
			case <-d.ctx.Done():
				return "", errClosed
			}
			switch {
			case w.err == nil:
				return w.a.addr, nil
			case errors.Is(w.err, errAbandoned):
				continue // not while this caller counts in the demand; look again
			case errors.Is(w.err, errClosed), d.ctx.Err() != nil:
				return "", errClosed
			}
			return "", w.err
		}
		a, err := d.addrs.Get(ctx, peer)
		switch {
		case err == nil:
			return a.addr, nil
		case ctx.Err() != nil:
			return "", d.notPublishedBy(ctx, peer)
		case errors.Is(err, errAwaiting), errors.Is(err, errAbandoned):
			// Sent to the wait for the peer (or to a fetch that ended
			// before this caller's demand could keep it): look again.
			continue
		case errors.Is(err, epcache.ErrClosed), d.ctx.Err() != nil:
			return "", errClosed
		}
		return "", err
	}
}

// fetch is the address cache's Create: one read of peer's key, holding
// the room of an address (MaxEntries) for that read only, which Timeout
// bounds. A peer that has not published, or a key that etcd did not
// answer the read of, is waited for outside the cache (awaitPublication),
// and the fetch fails with errAwaiting; so does a fetch that finds such a
// wait running, without reading.
func (d *Directory) fetch(ctx context.Context, peer int) (address, error) {
	d.ond.mu.Lock()
	dm := d.ond.demands[peer]
	switch {
	case dm == nil || dm.waiting <= 0:
		d.ond.mu.Unlock()
		return address{}, errAbandoned
	case dm.wait != nil:
		d.ond.mu.Unlock()
		return address{}, errAwaiting
	}
	linear := d.ond.stale[peer]
	delete(d.ond.stale, peer)
	d.ond.mu.Unlock()
	d.count.fetches.Add(1)
	kv, rev, err := d.readKey(ctx, peer, linear)
	switch {
	case err != nil && ctx.Err() != nil:
		return address{}, err // Close, or answered by what an Offer gave: nothing owed
	case err != nil:
		// etcd did not answer: the wait reads again, linearizably, with
		// a backoff.
		d.awaitPublication(peer, 0)
		return address{}, errAwaiting
	case kv != nil:
		a, err := d.decodeAddress(peer, kv)
		d.found(peer, a.written, err)
		if err != nil {
			return address{}, err
		}
		if errors.Is(context.Cause(ctx), epcache.ErrOffered) {
			// An Offer answered this fetch meanwhile, and the cache drops
			// what it returns: keep it if it is the newer life, and only
			// then tell the watchers of it, so that a watcher that looks
			// the peer up finds it. (Not on this goroutine: the fetch is
			// the cache's Create, still under way.)
			d.spawn(func() {
				if d.keepNewer(peer, a) {
					d.newLife(peer, a)
				}
			})
			return a, nil
		}
		d.newLife(peer, a)
		return a, nil
	}
	if old, _ := d.oldPeer(peer); old {
		err := d.oldFormatError(peer)
		d.found(peer, 0, err)
		return address{}, err
	}
	d.found(peer, 0, nil)
	d.awaitPublication(peer, rev)
	return address{}, errAwaiting
}

// awaitPublication starts, as peer's demand's, a wait for the peer to
// publish: a watch of its key from revision rev on (0: a read of the key
// first), outside the address cache, unless a wait runs or nobody asks
// for the peer any more.
func (d *Directory) awaitPublication(peer int, rev int64) {
	d.ond.mu.Lock()
	dm := d.ond.demands[peer]
	if dm == nil || dm.waiting <= 0 || dm.wait != nil {
		d.ond.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancelCause(d.ctx)
	w := &pending{done: make(chan struct{}), cancel: cancel}
	dm.wait = w
	d.ond.mu.Unlock()
	if !d.spawn(func() { d.waitPublished(ctx, peer, w, rev) }) {
		d.endWait(peer, w, address{}, errClosed)
	}
}

// waitPublished runs the wait w for peer until the key holds a valid
// address (which goes into the cache, and the watchers hear of it), or a
// value that is not one, or the peer's askers all leave, or Close.
func (d *Directory) waitPublished(ctx context.Context, peer int, w *pending, rev int64) {
	a, err := d.fetchKey(ctx, peer, rev == 0, 0, false, rev)
	switch {
	case err == nil:
		d.found(peer, 0, nil)
		if d.keepNewer(peer, a) {
			d.newLife(peer, a)
		}
	case errors.Is(context.Cause(ctx), errAbandoned):
		d.count.abandoned.Add(1)
		err = errAbandoned
	case d.ctx.Err() != nil:
		err = errClosed
	default:
		d.found(peer, a.written, err)
	}
	d.endWait(peer, w, a, err)
}

// endWait ends w, peer's wait, with a or err.
func (d *Directory) endWait(peer int, w *pending, a address, err error) {
	d.ond.mu.Lock()
	if dm := d.ond.demands[peer]; dm != nil && dm.wait == w {
		dm.wait = nil
	}
	d.ond.mu.Unlock()
	w.a, w.err = a, err
	close(w.done)
	w.cancel(nil)
}

// readKey reads peer's key once (linearizable if linear, serializable
// otherwise), bounded by Timeout: kv is nil if the key is absent, rev is
// the revision read.
func (d *Directory) readKey(ctx context.Context, peer int, linear bool) (kv *mvccpb.KeyValue, rev int64, err error) {
	var opts []clientv3.OpOption
	if !linear {
		opts = append(opts, clientv3.WithSerializable())
	}
	rctx, cancel := d.request(ctx)
	defer cancel()
	resp, err := d.get(rctx, d.key(peer), opts...)
	if err != nil {
		return nil, 0, err
	}
	if len(resp.Kvs) > 0 {
		kv = resp.Kvs[0]
	}
	return kv, resp.Header.Revision, nil
}

// fetchKey reads peer's key until it holds a valid life newer than after:
// one read of the key (linearizable if linear, serializable otherwise),
// then, if that finds nothing newer, a watch of the key from the read's
// revision; with from set, it begins with that watch, from revision from
// on, of a key found absent there. A watch lost (compaction, a member
// without a leader) is followed by a linearizable read again. It ends
// with ctx.
//
// A garbled value is an error, unless waitValid is set: then it is passed
// over, as an absent key is, until a valid life is written. A key of the
// old format is an error while peer has no key of this format, unless
// waitValid is set: Unreachable's watch waits for a life of this format,
// which wins once written.
func (d *Directory) fetchKey(ctx context.Context, peer int, linear bool, after int64, waitValid bool, from int64) (address, error) {
	key := d.key(peer)
	backoff := minBackoff
	for {
		rev, absent := from, true
		from = 0
		if rev == 0 {
			kv, r, err := d.readKey(ctx, peer, linear)
			if err == nil {
				if kv != nil {
					a, err := d.decodeAddress(peer, kv)
					if err != nil && !waitValid || err == nil && a.life > after {
						return a, err
					}
					absent = false
				} else if old, _ := d.oldPeer(peer); old && !waitValid {
					return address{}, d.oldFormatError(peer)
				}
				rev = r
			}
		}
		if rev != 0 {
			a, found, err := d.await(ctx, peer, key, rev, after, waitValid, absent)
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
// or, if the key was absent at rev, an old-format key of the peer (an
// error, unless waitValid), or the watch's end (neither: read again).
func (d *Directory) await(ctx context.Context, peer int, key string, rev, after int64, waitValid, absent bool) (a address, found bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := d.watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	old, oldWake := d.oldPeer(peer)
	switch {
	case !absent || waitValid:
		oldWake = nil // the peer has a key of this format, or one is waited for: the old one does not count
	case old:
		return address{}, false, d.oldFormatError(peer)
	}
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

// decodeAddress reads the address kv holds for peer. On an error, the
// address is empty but for written.
func (d *Directory) decodeAddress(peer int, kv *mvccpb.KeyValue) (address, error) {
	addr, life, err := decode(kv)
	switch {
	case err != nil:
		return address{written: kv.ModRevision}, fmt.Errorf("etcddir: peer %d's value under %q is invalid: %w", peer, kv.Key, err)
	case addr == "":
		err = errors.New("the address is empty")
	case d.opts.Validate != nil:
		err = d.opts.Validate(addr)
	}
	if err != nil {
		return address{written: kv.ModRevision}, fmt.Errorf("etcddir: peer %d's address %q under %q is invalid: %w", peer, addr, kv.Key, err)
	}
	return address{addr: addr, life: life, written: kv.ModRevision}, nil
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
	d.ond.dead[peer] = max(d.ond.dead[peer], a.life)
	// A revival that runs already waits, from its next look on, for a
	// life newer than this one too.
	revive := !d.ond.reviving[peer]
	d.ond.reviving[peer] = true
	d.ond.mu.Unlock()
	if revive && !d.spawn(func() { d.revive(peer) }) {
		d.ond.mu.Lock()
		delete(d.ond.reviving, peer)
		d.ond.mu.Unlock()
	}
}

// revive watches peer's key for a life newer than the newest reported
// unreachable (dead): when one appears, it replaces in the address cache
// any older life held (keepNewer; an Offer answers a fetch in flight),
// and then the watchers hear of it. A report of a newer life while it
// runs (the one it found included) makes it wait for a life newer than
// that one: a second revival does not start while this one runs, so
// this one follows every report. It ends with a life newer than every
// report, or at Close.
func (d *Directory) revive(peer int) {
	for {
		d.ond.mu.Lock()
		dead := d.ond.dead[peer]
		d.ond.mu.Unlock()
		a, err := d.fetchKey(d.ctx, peer, true, dead, true, 0)
		if err == nil {
			d.foundValid(peer, a.written)
			if d.keepNewer(peer, a) {
				d.newLife(peer, a)
			}
		}
		d.ond.mu.Lock()
		if err != nil || a.life > d.ond.dead[peer] {
			// Close, or a life that no report names: ended under mu, so
			// that a report after this one starts a revival of its own.
			delete(d.ond.reviving, peer)
			d.ond.mu.Unlock()
			return
		}
		d.ond.mu.Unlock()
	}
}

// keepNewer puts a into the address cache unless it holds a's life or a
// newer one: a newer life replaces an older one (the older is compared
// and invalidated, then a offered), never the reverse, so that what the
// watchers are told of next (newLife, which callers call after
// keepNewer, on the same goroutine) is what Lookup answers from then on.
// A life older than one the watchers were told of is not kept: it is
// over; nor is a life at or below the newest reported unreachable, nor
// one read from a write older than the one a fetch found wrong. Offer
// answers a fetch in flight; a cache that is full (MaxEntries) or closed
// keeps nothing, and the next ask fetches. It reports whether a is
// current: kept, held already, or left out for want of room; false if
// it is over, dead, or older than the life held.
func (d *Directory) keepNewer(peer int, a address) bool {
	for {
		d.ond.mu.Lock()
		over := a.life < d.ond.seen[peer] || a.life <= d.ond.dead[peer] ||
			a.written < d.ond.failed[peer].written // a garbled write is a life of its own, newer
		d.ond.mu.Unlock()
		if over {
			return false
		}
		if cur, held := d.addrs.Load(peer); held {
			if cur.life >= a.life {
				return cur.life == a.life
			}
			if !d.addrs.CompareAndInvalidate(peer, cur) {
				continue // replaced or dropped meanwhile: look again
			}
		}
		if d.addrs.Offer(peer, a) {
			return true
		}
		if _, held := d.addrs.Load(peer); !held {
			return true // full or closed: nothing to compare with
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
