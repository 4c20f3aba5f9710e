package etcddir

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The fence: "every peer has published", for jobs that want every address
// at once (PMIx's full modex). One process (the launcher, or peer 0) runs
// CoordinateFence: it reads the peers' keys once and follows them, N
// events, and writes the fence key when all N are in. Every process calls
// Fence, which reads the fence key and, until it exists, watches that one
// key: one event each. The fence costs etcd O(N) events and bytes, where
// etcd's DoubleBarrier recipe, whose every Enter reads the whole range of
// the waiting, costs O(N²) bytes. Prefetch then reads every address at the
// fence's revision, page by page.

// CoordinateFence waits until every peer of the job has a key under the
// prefix, then writes the job's fence ([FenceKey]), whose value is the
// revision at which all were in, and returns that revision; if the fence
// exists already, it returns its revision at once. Run it in one process
// of the job (the launcher, or peer 0): it reads the peers' keys once, page
// by page, then follows them with one watch, so that it costs etcd N
// events, not N per process. A watch lost to a compaction is followed by
// a fresh read of the keys. A peer counts as in from the moment its key
// exists, whatever its value; one whose key is deleted before the fence
// (it died) counts again once it publishes again. The fence key has no
// lease: it records a fact of the job's history, and outlives the
// coordinator; delete the job's prefix when the job ends.
//
// It returns an error wrapping ctx.Err() if ctx ends first.
func (d *Directory) CoordinateFence(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(d.ctx, cancel)
	defer stop()
	start, end := d.peerRange(0, d.opts.Size)
	backoff := minBackoff
	for reads := 0; ; reads++ {
		if rev, ok, err := d.readFence(ctx); err != nil || ok {
			return rev, err
		}
		in := make([]bool, d.opts.Size)
		count := 0
		mark := func(kv *mvccpb.KeyValue, put bool) {
			peer, kind, _ := d.parseKey(kv.Key)
			if kind != kindPeer || in[peer] == put {
				return
			}
			in[peer] = put
			if put {
				count++
			} else {
				count--
			}
		}
		rev, err := d.rangeAll(ctx, start, end, 0, true, func(kv *mvccpb.KeyValue) { mark(kv, true) })
		if err == nil && reads > 0 {
			d.count.reloads.Add(1)
		}
		if err == nil && count == d.opts.Size {
			return d.writeFence(ctx, rev)
		}
		if err == nil {
			if at, done := d.followFence(ctx, start, end, rev, mark, func() bool { return count == d.opts.Size }); done {
				return d.writeFence(ctx, at)
			}
		}
		if ctx.Err() != nil {
			return 0, d.fenceError(ctx)
		}
		// etcd did not answer, or the watch was lost: read again.
		if pause(ctx, jitter(backoff)) != nil {
			return 0, d.fenceError(ctx)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (d *Directory) fenceError(ctx context.Context) error {
	if d.ctx.Err() != nil {
		return errClosed
	}
	return fmt.Errorf("etcddir: fence of %q: %w", d.opts.Prefix, ctx.Err())
}

// followFence applies the events of the peers' keys after rev until
// complete holds (at: the revision of the event that completed it), or
// the watch ends (done false).
func (d *Directory) followFence(ctx context.Context, start, end string, rev int64, mark func(*mvccpb.KeyValue, bool), complete func() bool) (at int64, done bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := d.watch(wctx, start, clientv3.WithRange(end), clientv3.WithRev(rev+1))
	for resp := range wch {
		if resp.Err() != nil {
			return 0, false
		}
		d.received(&resp)
		for _, ev := range resp.Events {
			mark(ev.Kv, ev.Type == mvccpb.Event_PUT)
			if complete() {
				return ev.Kv.ModRevision, true
			}
		}
	}
	return 0, false
}

// writeFence writes the fence at revision at, unless a fence exists, and
// returns the fence's revision.
func (d *Directory) writeFence(ctx context.Context, at int64) (int64, error) {
	key := FenceKey(d.opts.Prefix)
	rctx, cancel := d.request(ctx)
	defer cancel()
	resp, err := d.txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, strconv.FormatInt(at, 10))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("etcddir: writing the fence %q: %w", key, err)
	}
	if resp.Succeeded {
		return at, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return 0, fmt.Errorf("etcddir: the fence %q was deleted as it was written", key)
	}
	return d.parseFence(kvs[0])
}

// readFence reads the fence key: ok reports whether it exists.
func (d *Directory) readFence(ctx context.Context) (rev int64, ok bool, err error) {
	rctx, cancel := d.request(ctx)
	defer cancel()
	resp, err := d.get(rctx, FenceKey(d.opts.Prefix))
	if err != nil || len(resp.Kvs) == 0 {
		return 0, false, nil // not yet; etcd not answering shows in the read that follows
	}
	rev, err = d.parseFence(resp.Kvs[0])
	return rev, err == nil, err
}

func (d *Directory) parseFence(kv *mvccpb.KeyValue) (int64, error) {
	rev, err := strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil || rev <= 0 || rev > kv.ModRevision {
		return 0, fmt.Errorf("etcddir: the fence %q holds %q; want the revision, up to %d, at which every peer had published", kv.Key, kv.Value, kv.ModRevision)
	}
	return rev, nil
}

// Fence waits until the job's fence exists (see CoordinateFence), and
// returns the revision at which every peer had published: the revision
// to give Prefetch. It reads the fence key, and until it exists watches
// that one key, so that the fence costs etcd one event per process. A
// watch lost to a compaction is followed by a fresh read of the key. It
// returns an error wrapping ctx.Err() if ctx ends first.
func (d *Directory) Fence(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(d.ctx, cancel)
	defer stop()
	key := FenceKey(d.opts.Prefix)
	backoff := minBackoff
	for reads := 0; ; reads++ {
		rctx, rcancel := d.request(ctx)
		resp, err := d.get(rctx, key)
		rcancel()
		if err == nil && reads > 0 {
			d.count.reloads.Add(1)
		}
		if err == nil && len(resp.Kvs) > 0 {
			return d.parseFence(resp.Kvs[0])
		}
		if err == nil {
			if rev, found, err := d.awaitFence(ctx, key, resp.Header.Revision); found || err != nil {
				return rev, err
			}
		}
		if ctx.Err() != nil {
			return 0, d.fenceError(ctx)
		}
		if pause(ctx, jitter(backoff)) != nil {
			return 0, d.fenceError(ctx)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (d *Directory) awaitFence(ctx context.Context, key string, rev int64) (fence int64, found bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range d.watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterDelete()) {
		if resp.Err() != nil {
			return 0, false, nil
		}
		d.received(&resp)
		if len(resp.Events) > 0 {
			fence, err := d.parseFence(resp.Events[0].Kv)
			return fence, err == nil, err
		}
	}
	return 0, false, nil
}

// Prefetch reads every peer's address at revision rev (a fence's, from
// Fence or CoordinateFence; 0: the newest), page by page (PageSize keys
// per request), every page at rev, so that Lookup answers each without a
// fetch of its own: PMIx's full modex after the fence. In OnDemand mode
// each address read goes into the address cache unless the cache holds
// that life of the peer or a newer one: a newer life replaces the older
// address held, never the reverse, and a life older than one the
// watchers were told of, or not newer than the newest one reported to
// [Directory.Unreachable], is passed over (and is not news). With MaxEntries, the cache takes
// only what it has room for: Prefetch never evicts. The watchers hear of
// each life newer than any they heard of, after the cache took it (or
// had no room for it). In Mirror mode, which holds every address already,
// Prefetch does nothing. If etcd compacted rev away, before the first
// page or between two, Prefetch reads every page again at the newest
// revision. Garbled values are passed over: Lookup and Resolve of their
// peer fetch it, and say what is wrong; a valid value read from a later
// write of the key than one a fetch found wrong ends Lookup's answer of
// that error (see [Directory.Lookup]).
//
// Close stops a Prefetch under way, which then returns the error of a
// Prefetch after Close: one that says the directory is closed, without a
// request to etcd, in both modes.
func (d *Directory) Prefetch(ctx context.Context, rev int64) error {
	ctx, exit, ok := d.enter(ctx)
	if !ok {
		return fmt.Errorf("etcddir: prefetching %q at revision %d: %w", d.opts.Prefix, rev, errClosed)
	}
	defer exit()
	if d.addrs == nil {
		return nil
	}
	start, end := d.peerRange(0, d.opts.Size)
	each := func(kv *mvccpb.KeyValue) {
		peer, kind, _ := d.parseKey(kv.Key)
		if kind != kindPeer {
			return
		}
		a, err := d.decodeAddress(peer, kv)
		if err != nil {
			return
		}
		d.foundValid(peer, a.written)
		if d.keepNewer(peer, a) {
			d.newLife(peer, a)
		}
	}
	_, err := d.rangeAll(ctx, start, end, rev, false, each)
	if errors.Is(err, rpctypes.ErrCompacted) && ctx.Err() == nil {
		_, err = d.rangeNewest(ctx, start, end, false, func() {}, each)
	}
	switch {
	case err != nil && d.ctx.Err() != nil:
		return fmt.Errorf("etcddir: prefetching %q at revision %d: %w", d.opts.Prefix, rev, errClosed)
	case err != nil:
		return fmt.Errorf("etcddir: prefetching %q at revision %d: %w", d.opts.Prefix, rev, err)
	}
	return nil
}
