package etcddir

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Publications: this process's lives, all bound to its one lease.

// publication is one life this process published and keeps alive.
type publication struct {
	addr    string
	life    int64        // the revision of Publish's write, which names the life; set before p is shared
	lease   atomic.Int64 // the lease its last write was bound to
	written atomic.Int64 // the revision of its last write

	// superseded is set once a newer life of the peer is known: from then
	// on the publication writes nothing.
	superseded atomic.Bool
}

// peerLock serializes one process's Publish, Unpublish and republication
// of a peer.
type peerLock struct {
	sync.Mutex
	users int // guarded by Directory.mu
}

// lock takes this process's lock of peer, and returns its release.
func (d *Directory) lock(peer int) (unlock func()) {
	d.mu.Lock()
	l := d.locks[peer]
	if l == nil {
		l = &peerLock{}
		d.locks[peer] = l
	}
	l.users++
	d.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		d.mu.Lock()
		if l.users--; l.users == 0 {
			delete(d.locks, peer)
		}
		d.mu.Unlock()
	}
}

// leaseState is the one lease of a process: granted at its first
// publication, kept alive by one loop, granted again if etcd lets it
// lapse.
type leaseState struct {
	mu     sync.Mutex
	id     clientv3.LeaseID // 0: none (not yet, or lost)
	closed bool             // Close has taken the lease to revoke it
	loop   bool             // the keep-alive loop has started
}

// currentLease returns the process's lease, granting one if it has none,
// and starts the keep-alive loop with the first.
func (d *Directory) currentLease(ctx context.Context) (clientv3.LeaseID, error) {
	d.lease.mu.Lock()
	defer d.lease.mu.Unlock()
	switch {
	case d.lease.closed:
		return 0, errClosed
	case d.lease.id != 0:
		return d.lease.id, nil
	}
	// Granted under the lock: concurrent publishers share one lease, and
	// Close, which takes the lock to revoke it, waits for the grant.
	rctx, cancel := d.request(ctx)
	defer cancel()
	d.count.grants.Add(1)
	resp, err := d.opts.Client.Grant(rctx, int64((d.opts.TTL+time.Second-1)/time.Second))
	if err != nil {
		return 0, fmt.Errorf("granting a lease from etcd at %v: %w", d.opts.Client.Endpoints(), err)
	}
	d.lease.id = resp.ID
	if !d.lease.loop && d.spawn(d.keepAlive) {
		d.lease.loop = true
	}
	return resp.ID, nil
}

// leaseLost forgets lease id, which etcd no longer has, so that the next
// currentLease grants another.
func (d *Directory) leaseLost(id clientv3.LeaseID) {
	d.lease.mu.Lock()
	if d.lease.id == id {
		d.lease.id = 0
	}
	d.lease.mu.Unlock()
}

func (d *Directory) leaseID() clientv3.LeaseID {
	d.lease.mu.Lock()
	defer d.lease.mu.Unlock()
	return d.lease.id
}

// revokeLease revokes the process's lease, for Close: every key still
// bound to it leaves etcd.
func (d *Directory) revokeLease(ctx context.Context) {
	d.lease.mu.Lock()
	d.lease.closed = true
	id := d.lease.id
	d.lease.mu.Unlock()
	if id != 0 {
		d.count.revokes.Add(1)
		_, _ = d.opts.Client.Revoke(ctx, id)
	}
}

// checkAddr refuses what Publish may not write.
func checkAddr(peer int, addr string) error {
	if addr == "" {
		return fmt.Errorf("etcddir: Publish of an empty address for peer %d", peer)
	}
	if strings.HasPrefix(addr, lifeTag) {
		return fmt.Errorf("etcddir: Publish of peer %d's address %q: an address may not begin with %q, which tags a republication", peer, addr, lifeTag)
	}
	return nil
}

// Publish begins a new life of peer at addr (see the package doc): it
// stores addr under the process's lease (granted at its first
// publication, TTL long), unconditionally, and keeps the lease alive until
// Close; if the lease is lost (this process was cut off from etcd for
// longer than TTL), it publishes the same life again under a new lease as
// soon as etcd answers, unless a newer life holds the key. This process's
// previous publication of peer, if any, ends. Publish returns once etcd
// has stored the address, or an error if etcd does not answer within
// Timeout. Calls for one peer take effect one after the other.
func (d *Directory) Publish(peer int, addr string) error {
	if err := d.check(peer); err != nil {
		return err
	}
	if err := checkAddr(peer, addr); err != nil {
		return err
	}
	// Without the lock, two calls for one peer could install their
	// publications in the opposite order from their writes: the directory
	// would keep the older and lose track of the one that holds the key.
	unlock := d.lock(peer)
	defer unlock()
	if d.ctx.Err() != nil {
		return errClosed
	}
	p := &publication{addr: addr}
	key := d.key(peer)
	for {
		lease, err := d.currentLease(d.ctx)
		if err != nil {
			return d.publishError(peer, err)
		}
		rctx, cancel := d.request(d.ctx)
		d.count.puts.Add(1)
		resp, err := d.opts.Client.Put(rctx, key, addr, clientv3.WithLease(lease))
		cancel()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// Expired before the put reached etcd (TTL passed on a busy
			// machine, or while etcd was away): grant another.
			d.leaseLost(lease)
			continue
		}
		if err != nil {
			return d.publishError(peer, err)
		}
		p.lease.Store(int64(lease))
		p.life = resp.Header.Revision
		p.written.Store(p.life)
		return d.install(peer, p)
	}
}

func (d *Directory) publishError(peer int, err error) error {
	if d.ctx.Err() != nil || errors.Is(err, errClosed) {
		return errClosed
	}
	return fmt.Errorf("etcddir: publishing peer %d: %w", peer, err)
}

// PublishAll begins a new life of every peer of addrs at its address, as
// Publish does for one, in as few transactions as etcd allows (128 peers
// each, etcd's default --max-txn-ops): a launcher, or a process that
// hosts many peers, publishes them in one round trip per 128. The peers of
// one transaction share its revision as their life. It returns once etcd
// has stored every address, or the first error (the transactions before
// it stand).
func (d *Directory) PublishAll(addrs map[int]string) error {
	peers := make([]int, 0, len(addrs))
	for peer, addr := range addrs {
		if err := d.check(peer); err != nil {
			return err
		}
		if err := checkAddr(peer, addr); err != nil {
			return err
		}
		peers = append(peers, peer)
	}
	slices.Sort(peers) // locks taken in order: two PublishAll never wait for each other in a cycle
	for chunk := range slices.Chunk(peers, maxTxnOps) {
		if err := d.publishChunk(chunk, addrs); err != nil {
			return err
		}
	}
	return nil
}

func (d *Directory) publishChunk(peers []int, addrs map[int]string) error {
	for _, peer := range peers {
		unlock := d.lock(peer)
		defer unlock()
	}
	if d.ctx.Err() != nil {
		return errClosed
	}
	for {
		lease, err := d.currentLease(d.ctx)
		if err != nil {
			return d.publishError(peers[0], err)
		}
		ops := make([]clientv3.Op, len(peers))
		for i, peer := range peers {
			ops[i] = clientv3.OpPut(d.key(peer), addrs[peer], clientv3.WithLease(lease))
		}
		rctx, cancel := d.request(d.ctx)
		resp, err := d.txn(rctx).Then(ops...).Commit()
		cancel()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			d.leaseLost(lease)
			continue
		}
		if err != nil {
			return d.publishError(peers[0], err)
		}
		for _, peer := range peers {
			p := &publication{addr: addrs[peer], life: resp.Header.Revision}
			p.lease.Store(int64(lease))
			p.written.Store(p.life)
			if err := d.install(peer, p); err != nil {
				return err
			}
		}
		return nil
	}
}

// install makes p the publication of peer, once its write is in etcd.
// The caller holds peer's lock.
func (d *Directory) install(peer int, p *publication) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		// Close revokes the lease the write was bound to (it waited for
		// any grant under way): the address does not outlive the
		// directory.
		return errClosed
	}
	old := d.own[peer]
	d.own[peer] = p
	if d.entries != nil {
		if e := d.entries[peer].Load(); e != nil {
			// The mirror saw a newer life before p was installed: it was
			// written after p's, over it.
			d.supersedeIfOlder(peer, p, e.newest, 0)
		}
	} else {
		d.followOwn(peer)
	}
	if old != nil && !old.superseded.Swap(true) {
		d.count.superseded.Add(1) // p's write replaced old's
	}
	return nil
}

// supersedeIfOlder ends p if newest, a life of its peer seen in an event
// of revision at (0: known to be written after p's last write), is newer
// than p's: p writes nothing more. If p's last write came after that
// event (a republication into an absent key, before this process heard
// of the newer life), the key may still hold it: it is deleted, if it
// still does. The caller holds d.mu, so that a publication that install
// makes is checked either here or there.
func (d *Directory) supersedeIfOlder(peer int, p *publication, newest, at int64) {
	if p.life >= newest || p.superseded.Swap(true) {
		return
	}
	if w := p.written.Load(); at == 0 || w < at || !d.spawnLocked(func() { d.withdrawOwn(peer, p, w) }) {
		d.count.superseded.Add(1)
	}
}

// spawnLocked is spawn for a caller that holds d.mu.
func (d *Directory) spawnLocked(f func()) bool {
	if d.closed {
		return false
	}
	d.loops.Add(1)
	go func() {
		defer d.loops.Done()
		f()
	}()
	return true
}

// withdrawOwn deletes peer's key if it still holds p's write of revision
// written, and counts p superseded.
func (d *Directory) withdrawOwn(peer int, p *publication, written int64) {
	defer d.count.superseded.Add(1)
	key := d.key(peer)
	rctx, cancel := d.request(d.ctx)
	defer cancel()
	_, _ = d.txn(rctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", written)).Then(clientv3.OpDelete(key)).Commit()
}

// keepAlive keeps the process's lease alive until Close, and, whenever
// the lease is lost, grants another and publishes every publication again
// under it, unless a newer life supersedes it.
func (d *Directory) keepAlive() {
	backoff := minBackoff
	for d.ctx.Err() == nil {
		id := d.leaseID()
		answered := false
		if id != 0 {
			if ka, err := d.opts.Client.KeepAlive(d.ctx, id); err == nil {
				for range ka { // drained, or the client blocks on it
					answered = true
				}
			}
		}
		if answered {
			backoff = minBackoff
		}
		// The keep-alives stopped: the lease is gone (expired while etcd
		// could not be reached, or revoked), or the client stopped waiting
		// for etcd's answers. Check, and publish again if it is gone, as
		// soon as etcd answers.
		for {
			if pause(d.ctx, jitter(backoff)) != nil {
				return
			}
			backoff = min(2*backoff, maxBackoff)
			if d.renew(id) == nil {
				break
			}
		}
	}
}

// renew runs when the keep-alives of lease id stopped. If id is still
// alive, it does nothing: the keep-alives resume. If it is gone, and with
// it every key bound to it, it takes a new lease and writes each
// publication again under it (see republish).
func (d *Directory) renew(id clientv3.LeaseID) error {
	if id != 0 {
		rctx, cancel := d.request(d.ctx)
		d.count.leaseChecks.Add(1)
		ttl, err := d.opts.Client.TimeToLive(rctx, id)
		cancel()
		if err != nil {
			return err
		}
		if ttl.TTL >= 0 { // -1: no such lease
			return nil
		}
		d.leaseLost(id)
	}
	lease, err := d.currentLease(d.ctx)
	if err != nil {
		return err
	}
	d.mu.Lock()
	peers := make([]int, 0, len(d.own))
	for peer := range d.own {
		peers = append(peers, peer)
	}
	d.mu.Unlock()
	slices.Sort(peers)
	for _, peer := range peers {
		if err := d.republish(peer, lease); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				d.leaseLost(lease)
			}
			return err
		}
	}
	d.count.leaseRenewals.Add(1)
	return nil
}

// republish writes peer's publication again under lease, in a
// transaction conditional on the key being as last read: absent, this
// life, or an older life. It writes nothing, and ends the publication, if
// the key holds a newer life or this process has heard of one.
func (d *Directory) republish(peer int, lease clientv3.LeaseID) error {
	unlock := d.lock(peer)
	defer unlock()
	d.mu.Lock()
	p := d.own[peer]
	d.mu.Unlock()
	if p == nil || p.superseded.Load() || p.lease.Load() == int64(lease) {
		return nil
	}
	key := d.key(peer)
	rctx, cancel := d.request(d.ctx)
	defer cancel()
	get, err := d.get(rctx, key)
	if err != nil {
		return err
	}
	kvs := get.Kvs
	for {
		var modRev int64 // 0: the key is absent
		if len(kvs) > 0 {
			if _, life, _ := decode(kvs[0]); life > p.life {
				if !p.superseded.Swap(true) {
					d.count.superseded.Add(1) // nothing of p's is left to withdraw
				}
				return nil
			}
			modRev = kvs[0].ModRevision
		}
		if p.superseded.Load() {
			return nil
		}
		txn, err := d.txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, tagged(p.addr, p.life), clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key)).
			Commit()
		switch {
		case err != nil:
			return err
		case txn.Succeeded:
			p.written.Store(txn.Header.Revision)
			p.lease.Store(int64(lease))
			return nil
		}
		kvs = txn.Responses[0].GetResponseRange().Kvs
	}
}

// Unpublish withdraws peer's address. If this process published peer, it
// withdraws only its own life: a newer one (the peer restarted elsewhere)
// is not its to withdraw. Otherwise, as a resource manager withdraws a
// peer it knows to be dead, it withdraws whatever life holds the key. It
// reports whether it deleted an address; false also when etcd does not
// answer within Timeout.
func (d *Directory) Unpublish(peer int) bool {
	if d.check(peer) != nil {
		return false
	}
	unlock := d.lock(peer)
	defer unlock()
	d.mu.Lock()
	p := d.own[peer]
	delete(d.own, peer)
	d.mu.Unlock()
	ctx, cancel := d.request(context.Background())
	defer cancel()
	key := d.key(peer)
	if p == nil {
		d.count.deletes.Add(1)
		resp, err := d.opts.Client.Delete(ctx, key)
		return err == nil && resp.Deleted > 0
	}
	p.superseded.Store(true) // writes nothing more
	resp, err := d.txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", p.written.Load())).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err == nil && resp.Succeeded && resp.Responses[0].GetResponseDeleteRange().Deleted > 0
}

// The own watch (OnDemand): without a mirror, a process learns of newer
// lives of the peers it publishes from a watch of their keys alone, one
// range from the lowest to the highest (keys are in peer order).

// ownRange is the range of peers the own watch follows.
type ownRange struct {
	lo, hi int // peers lo to hi-1; hi == 0: none yet
	// from is the revision the watch must (re)start after, at the
	// latest: a peer added to the range is followed from just before its
	// write, whatever revision the watch had reached. MaxInt64: no
	// constraint.
	from    int64
	changed chan struct{} // signalled when the range grows
}

// followOwn makes the own watch cover peer, which the caller, holding
// d.mu, has just published; it starts the watch with the first.
func (d *Directory) followOwn(peer int) {
	o := &d.owned
	life := d.own[peer].life
	switch {
	case o.hi == 0:
		o.lo, o.hi = peer, peer+1
		o.changed = make(chan struct{}, 1)
		o.from = life - 1 // its own write is the first event
		d.spawnLocked(d.watchOwn)
	case peer < o.lo || peer >= o.hi:
		o.lo, o.hi = min(o.lo, peer), max(o.hi, peer+1)
		o.from = min(o.from, life-1)
		select {
		case o.changed <- struct{}{}:
		default:
		}
	}
}

// watchOwn follows the keys of the peers this process publishes until
// Close, and ends each publication that a newer life supersedes.
func (d *Directory) watchOwn() {
	rev := int64(math.MaxInt64)
	backoff := minBackoff
	apply := func(ev *clientv3.Event) {
		if ev.Type == mvccpb.Event_PUT {
			d.applyOwn(ev.Kv)
		}
	}
	for {
		d.mu.Lock()
		lo, hi, changed := d.owned.lo, d.owned.hi, d.owned.changed
		rev = min(rev, d.owned.from)
		d.owned.from = math.MaxInt64
		d.mu.Unlock()
		start, end := d.peerRange(lo, hi)
		var progressed, restarted bool
		rev, progressed, restarted = d.follow(start, end, rev, changed, apply)
		if restarted {
			continue // the range grew: watch it from where this one stopped
		}
		if progressed {
			backoff = minBackoff
		}
		if pause(d.ctx, jitter(backoff)) != nil {
			return
		}
		backoff = min(2*backoff, maxBackoff)
		// The watch was lost: what it missed is read from the keys as
		// they are now (a newer life that came and went meanwhile is
		// lost with the history etcd compacted).
		if r, err := d.rangeAll(d.ctx, start, end, 0, false, d.applyOwn); err == nil {
			rev = r
			d.count.reloads.Add(1)
		}
	}
}

// applyOwn ends this process's publication of kv's peer if kv holds a
// newer life of it.
func (d *Directory) applyOwn(kv *mvccpb.KeyValue) {
	peer, kind, _ := d.parseKey(kv.Key)
	if kind != kindPeer {
		return
	}
	_, life, _ := decode(kv)
	d.mu.Lock()
	if p := d.own[peer]; p != nil {
		d.supersedeIfOlder(peer, p, life, kv.ModRevision)
	}
	d.mu.Unlock()
}
