package etcddir

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/epcache/epcache/transport/directory"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The mirror (Mirror mode): every key under the prefix, loaded at Open,
// kept current by one watch of the whole prefix.

// entry is what the mirror knows of one peer, immutable once stored.
type entry struct {
	addr      string
	life      int64 // the life of addr (see the package doc); of a withdrawal, the life withdrawn; 0: no address seen
	newest    int64 // the newest life the mirror has seen of the peer, visible or not
	withdrawn bool  // a published address was deleted (Unpublish, an expired lease)
	bad       error // the value is garbled or the address failed validation
	oldKey    bool  // a key of the old format names the peer
}

// visible reports whether e holds an address that Lookup returns.
func (e *entry) visible() bool { return e != nil && e.life != 0 && !e.withdrawn && e.bad == nil }

func (d *Directory) openMirror(ctx context.Context) error {
	d.entries = make([]atomic.Pointer[entry], d.opts.Size)
	d.odd = map[string]struct{}{}
	d.waiters = map[int]chan struct{}{}
	rev, err := d.load(ctx)
	if err != nil {
		return err
	}
	d.spawn(func() { d.mirror(rev) })
	return nil
}

// rangeAll reads the keys [start, end) page by page, every page at
// revision rev (0: the newest, which the first page's answer names),
// calling each for every key in order, and returns the revision read. A
// compaction past rev between two pages fails it with
// rpctypes.ErrCompacted.
func (d *Directory) rangeAll(ctx context.Context, start, end string, rev int64, keysOnly bool, each func(*mvccpb.KeyValue)) (int64, error) {
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(d.opts.PageSize))}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		rctx, cancel := d.request(ctx)
		resp, err := d.get(rctx, start, opts...)
		cancel()
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			// The first page of a read of the newest: the others read at
			// its revision. A read at a given revision keeps it: etcd
			// answers every read with its current revision, not the one
			// asked for.
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			each(kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// rangeNewest is rangeAll of the newest revision, read again from the
// start, at once, when a compaction lands between two of its pages, until
// a read completes, fails otherwise, or ctx ends. Each attempt begins with
// a call of begin, which resets what each gathered. A read of the newest
// cannot fail on its first page for a compaction: each retry has read at
// least a page, and a later revision than the one before.
func (d *Directory) rangeNewest(ctx context.Context, start, end string, keysOnly bool, begin func(), each func(*mvccpb.KeyValue)) (int64, error) {
	for {
		begin()
		rev, err := d.rangeAll(ctx, start, end, 0, keysOnly, each)
		if !errors.Is(err, rpctypes.ErrCompacted) || ctx.Err() != nil {
			return rev, err
		}
	}
}

// load reads the whole prefix into the mirror and returns its revision.
func (d *Directory) load(ctx context.Context) (int64, error) {
	var seen, seenOld []bool
	var seenOdd map[string]struct{}
	begin := func() {
		seen = make([]bool, len(d.entries))
		seenOld = make([]bool, len(d.entries))
		seenOdd = map[string]struct{}{}
	}
	rev, err := d.rangeNewest(ctx, d.opts.Prefix, clientv3.GetPrefixRangeEnd(d.opts.Prefix), false, begin, func(kv *mvccpb.KeyValue) {
		switch peer, kind := d.apply(kv, true); kind {
		case kindPeer:
			seen[peer] = true
		case kindOld:
			seenOld[peer] = true
			seenOdd[string(kv.Key)] = struct{}{}
		case kindGarbled:
			seenOdd[string(kv.Key)] = struct{}{}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("etcddir: reading %q from etcd at %v: %w", d.opts.Prefix, d.opts.Client.Endpoints(), err)
	}
	// What is gone now was deleted while the watch was away.
	for peer := range d.entries {
		if !seen[peer] {
			d.withdraw(peer)
		}
		if !seenOld[peer] {
			d.setOldKey(peer, false)
		}
	}
	for key := range d.odd {
		if _, ok := seenOdd[key]; !ok {
			delete(d.odd, key)
			d.malformed.Add(-1)
		}
	}
	return rev, nil
}

// apply records a put of kv (or, with put false, its deletion) in the
// mirror, ends this process's publication of the peer if kv is of a newer
// life, and tells the watchers of an address newly visible. It reports
// what the key is.
func (d *Directory) apply(kv *mvccpb.KeyValue, put bool) (peer int, kind keyKind) {
	peer, kind, _ = d.parseKey(kv.Key)
	switch kind {
	case kindFence:
		return peer, kind
	case kindOld, kindGarbled:
		// Counted once while it exists, however often it is read.
		key := string(kv.Key)
		_, known := d.odd[key]
		switch {
		case put && !known:
			d.odd[key] = struct{}{}
			d.malformed.Add(1)
		case !put && known:
			delete(d.odd, key)
			d.malformed.Add(-1)
		}
		if kind == kindOld {
			d.setOldKey(peer, put)
		}
		return peer, kind
	}
	if !put {
		d.withdraw(peer)
		return peer, kind
	}
	addr, life, bad := decode(kv)
	e := &entry{addr: addr, life: life, newest: life, bad: bad}
	switch {
	case e.bad != nil:
	case addr == "":
		e.bad = errors.New("the address is empty")
	case d.opts.Validate != nil:
		e.bad = d.opts.Validate(addr)
	}
	old := d.entries[peer].Load()
	if old != nil {
		e.newest = max(e.newest, old.newest)
		e.oldKey = old.oldKey
	}
	d.store(peer, old, e)
	d.mu.Lock()
	if p := d.own[peer]; p != nil {
		d.supersedeIfOlder(peer, p, e.newest, kv.ModRevision)
	}
	d.mu.Unlock()
	if e.visible() && (!old.visible() || old.life != e.life || old.addr != e.addr) {
		d.notify(peer, e.addr)
	}
	return peer, kind
}

// withdraw records that peer's key is gone.
func (d *Directory) withdraw(peer int) {
	old := d.entries[peer].Load()
	if old == nil || old.life == 0 || old.withdrawn {
		return // nothing to withdraw: Lookup's answer stays "not published yet"
	}
	d.store(peer, old, &entry{life: old.life, newest: old.newest, withdrawn: true, oldKey: old.oldKey})
}

// setOldKey records whether a key of the old format names peer.
func (d *Directory) setOldKey(peer int, on bool) {
	old := d.entries[peer].Load()
	if (old != nil && old.oldKey) == on {
		return
	}
	e := &entry{oldKey: on}
	if old != nil {
		c := *old
		c.oldKey = on
		e = &c
	}
	d.store(peer, old, e)
}

// store replaces peer's entry old with e, counts it if it is bad, and
// wakes the Resolves waiting for the peer.
func (d *Directory) store(peer int, old, e *entry) {
	d.entries[peer].Store(e)
	wasBad, isBad := old != nil && old.bad != nil, e.bad != nil
	switch {
	case isBad && !wasBad:
		d.malformed.Add(1)
	case wasBad && !isBad:
		d.malformed.Add(-1)
	}
	d.waitMu.Lock()
	if ch := d.waiters[peer]; ch != nil {
		close(ch)
		delete(d.waiters, peer)
	}
	d.waitMu.Unlock()
}

// mirror keeps the mirror current from revision rev on, until Close.
func (d *Directory) mirror(rev int64) {
	backoff := minBackoff
	for {
		var progressed bool
		rev, progressed, _ = d.follow(d.opts.Prefix, clientv3.GetPrefixRangeEnd(d.opts.Prefix), rev, nil, func(ev *clientv3.Event) {
			d.apply(ev.Kv, ev.Type == mvccpb.Event_PUT)
		})
		if progressed {
			backoff = minBackoff
		}
		// The watch ended (compaction, a member without a leader, a
		// cancellation by the server): reload, then watch from there.
		if pause(d.ctx, jitter(backoff)) != nil {
			return
		}
		backoff = min(2*backoff, maxBackoff)
		if r, err := d.load(d.ctx); err == nil {
			rev = r
			d.count.reloads.Add(1)
		}
	}
}

// follow applies the events of the keys [start, end) after revision rev
// until the watch ends, Close, or restart is signalled, and returns the
// revision it is then current to; progressed reports whether any response
// came, restarted whether restart ended it.
func (d *Directory) follow(start, end string, rev int64, restart <-chan struct{}, apply func(*clientv3.Event)) (last int64, progressed, restarted bool) {
	// A member cut off from the cluster's leader would keep the watch open
	// and silent: with WithRequireLeader, etcd cancels it instead, and the
	// range is read again through another member once the client finds
	// one.
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(d.ctx))
	defer cancel()
	wch := d.watch(ctx, start, clientv3.WithRange(end), clientv3.WithRev(rev+1))
	for {
		// Close is waited for here, not only through the channel: the
		// channel of a watch on a client that was closed is not always
		// closed when d.ctx is cancelled, and Close hung on it (a fresh-
		// clone CI run, TestDeadProcessLeavesAndComesBack).
		select {
		case <-d.ctx.Done():
			return rev, progressed, false
		case <-restart:
			return rev, progressed, true
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				return rev, progressed, false // every error of a watch response ends it
			}
			d.received(&resp)
			for _, ev := range resp.Events {
				apply(ev)
			}
			rev, progressed = resp.Header.Revision, true
		}
	}
}

func (d *Directory) lookupMirror(peer int) (string, error) {
	e := d.entries[peer].Load()
	switch {
	case e == nil:
		return "", &directory.NotPublishedError{Peer: peer}
	case e.withdrawn || e.life == 0:
		if e.oldKey {
			return "", d.oldFormatError(peer)
		}
		return "", &directory.NotPublishedError{Peer: peer, Withdrawn: e.withdrawn}
	case e.bad != nil && e.addr == "":
		return "", fmt.Errorf("etcddir: peer %d's value under %q is invalid: %w", peer, d.key(peer), e.bad)
	case e.bad != nil:
		return "", fmt.Errorf("etcddir: peer %d's address %q under %q is invalid: %w", peer, e.addr, d.key(peer), e.bad)
	}
	return e.addr, nil
}

// resolveMirror waits until the mirror holds an address of peer, or
// something that Lookup answers with an error other than "not
// published". After Close it fails, as Resolve's doc says, even where the
// mirror, which Close leaves as it was, holds an address.
func (d *Directory) resolveMirror(ctx context.Context, peer int) (string, error) {
	for {
		if d.ctx.Err() != nil {
			return "", errClosed
		}
		d.waitMu.Lock()
		ch := d.waiters[peer]
		if ch == nil {
			ch = make(chan struct{})
			d.waiters[peer] = ch
		}
		d.waitMu.Unlock()
		// Looked up after the wait is registered: a store after this
		// closes ch.
		addr, err := d.lookupMirror(peer)
		if err == nil || !errors.Is(err, directory.ErrNotPublished) {
			return addr, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return "", d.notPublishedBy(ctx, peer)
		case <-d.ctx.Done():
			return "", errClosed
		}
	}
}
