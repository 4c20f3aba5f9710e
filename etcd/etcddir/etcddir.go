package etcddir

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults of Options.
const (
	DefaultTTL     = 5 * time.Second
	DefaultTimeout = 5 * time.Second
)

// Options configures a [Directory].
type Options struct {
	// Client is the etcd client. Required; Close does not close it.
	Client *clientv3.Client

	// Prefix is the key prefix of the job's addresses: peer i publishes
	// under Prefix + strconv.Itoa(i). Required; it should end in "/", so
	// that one job's prefix is not the start of another's.
	Prefix string

	// Size is the number of peers, numbered 0 to Size-1. Required.
	Size int

	// TTL is the life of the lease each publication is bound to: a process
	// that stops keeping it alive leaves the directory at most TTL later.
	// DefaultTTL if 0; at least one second (etcd counts leases in whole
	// seconds).
	TTL time.Duration

	// Timeout bounds each request to etcd, and the revokes of Close all
	// together. DefaultTimeout if 0.
	Timeout time.Duration

	// Validate, if set, checks each address read from etcd (for TCP, that
	// it is a host:port): Lookup of a peer whose address fails it returns
	// an error naming the peer, the address and the failure.
	Validate func(addr string) error
}

// Directory is a directory of peer addresses kept in etcd. Make one with
// [Open]; its methods are safe for concurrent use.
type Directory struct {
	opts    Options
	entries []atomic.Pointer[entry] // the mirror: nil, never seen

	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	loops  sync.WaitGroup // the watch and the keep-alives

	mu     sync.Mutex
	own    map[int]*publication // this process's publications, until Unpublish or Close (superseded ones too); guarded by mu
	locks  map[int]*peerLock    // per peer, while a Publish or Unpublish of it runs or waits; guarded by mu
	closed bool                 // Close has begun; guarded by mu

	watchMu  sync.Mutex // held while a watcher runs, so that stop waits for it
	watchers map[int]func(int, string)
	nextID   int

	// odd holds the keys under the prefix that name no peer, as the mirror
	// last saw them. Only load and apply use it, on Open's goroutine and
	// then on the watch's, one after the other.
	odd       map[string]struct{}
	malformed atomic.Int64 // len(odd) + the peers whose entry is bad
	relists   atomic.Int64
}

// entry is what the mirror knows of one peer, immutable once stored.
type entry struct {
	addr      string
	life      int64 // the life of addr (see the package doc); of a withdrawal, the life withdrawn
	newest    int64 // the newest life the mirror has seen of the peer, visible or not
	withdrawn bool  // a published address was deleted (Unpublish, an expired lease)
	bad       error // the value is garbled or the address failed validation
}

// visible reports whether e holds an address that Lookup returns.
func (e *entry) visible() bool { return e != nil && !e.withdrawn && e.bad == nil }

// publication is one life this process published and keeps alive.
type publication struct {
	addr   string
	life   int64 // the revision of Publish's write, which names the life; set before p is shared
	cancel context.CancelFunc
	done   chan struct{} // closed when its keep-alive loop has ended
	lease  atomic.Int64  // the lease its address is bound to, or was last

	// superseded is set once a newer life of the peer is known: from then
	// on the publication writes nothing, and its keep-alive loop revokes
	// its lease on the way out.
	superseded atomic.Bool
}

// peerLock serializes one process's Publish and Unpublish of a peer.
type peerLock struct {
	sync.Mutex
	users int // guarded by Directory.mu
}

// Backoffs of the loops that wait for etcd to answer again.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// Open loads the addresses under opts.Prefix and starts watching them. It
// fails, with an error naming the endpoints, if etcd does not answer within
// opts.Timeout (or ctx).
func Open(ctx context.Context, opts Options) (*Directory, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("etcddir: Options.Client is nil; it is required")
	case opts.Prefix == "":
		return nil, errors.New("etcddir: Options.Prefix is empty; want a key prefix such as \"/epcache/job-1/\"")
	case opts.Size <= 0 || opts.Size > directory.MaxSize:
		return nil, fmt.Errorf("etcddir: Options.Size is %d; want 1 to %d", opts.Size, directory.MaxSize)
	case opts.TTL < 0 || opts.TTL > 0 && opts.TTL < time.Second:
		return nil, fmt.Errorf("etcddir: Options.TTL is %v; want 0 (default %v) or at least 1s", opts.TTL, DefaultTTL)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("etcddir: Options.Timeout is %v; want 0 (default %v) or a positive duration", opts.Timeout, DefaultTimeout)
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	d := &Directory{
		opts:     opts,
		entries:  make([]atomic.Pointer[entry], opts.Size),
		own:      map[int]*publication{},
		locks:    map[int]*peerLock{},
		watchers: map[int]func(int, string){},
		odd:      map[string]struct{}{},
	}
	rev, err := d.load(ctx)
	if err != nil {
		return nil, err
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.loops.Add(1)
	go d.watch(rev)
	return d, nil
}

// load reads the whole prefix into the mirror and returns its revision.
func (d *Directory) load(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.Timeout)
	defer cancel()
	resp, err := d.opts.Client.Get(ctx, d.opts.Prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("etcddir: reading %q from etcd at %v: %w", d.opts.Prefix, d.opts.Client.Endpoints(), err)
	}
	seen := make([]bool, len(d.entries))
	seenOdd := map[string]struct{}{}
	for _, kv := range resp.Kvs {
		if peer, ok := d.apply(kv, true); ok {
			seen[peer] = true
		} else {
			seenOdd[string(kv.Key)] = struct{}{}
		}
	}
	// What is gone now was deleted while the watch was away.
	for peer := range d.entries {
		if !seen[peer] {
			d.withdraw(peer)
		}
	}
	for key := range d.odd {
		if _, ok := seenOdd[key]; !ok {
			delete(d.odd, key)
			d.malformed.Add(-1)
		}
	}
	return resp.Header.Revision, nil
}

// peerOf parses a key under the prefix; ok is false for a malformed one.
func (d *Directory) peerOf(key []byte) (int, bool) {
	s, found := strings.CutPrefix(string(key), d.opts.Prefix)
	if !found {
		return 0, false
	}
	peer, err := strconv.Atoi(s)
	if err != nil || peer < 0 || peer >= len(d.entries) || strconv.Itoa(peer) != s {
		return 0, false
	}
	return peer, true
}

// apply records a put of kv (or, with put false, its deletion) in the
// mirror, ends this process's publication of the peer if kv is of a newer
// life, and tells the watchers of an address newly visible. It reports the
// peer; ok is false for a key that names none.
func (d *Directory) apply(kv *mvccpb.KeyValue, put bool) (peer int, ok bool) {
	peer, ok = d.peerOf(kv.Key)
	if !ok {
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
		return 0, false
	}
	if !put {
		d.withdraw(peer)
		return peer, true
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
	}
	d.store(peer, old, e)
	d.mu.Lock()
	if p := d.own[peer]; p != nil {
		supersedeIfOlder(p, e.newest)
	}
	d.mu.Unlock()
	if e.visible() && (!old.visible() || old.life != e.life || old.addr != e.addr) {
		d.notify(peer, e.addr)
	}
	return peer, true
}

// withdraw records that peer's key is gone.
func (d *Directory) withdraw(peer int) {
	old := d.entries[peer].Load()
	if old == nil || old.withdrawn {
		return // nothing to withdraw: Lookup's answer stays "not published yet"
	}
	d.store(peer, old, &entry{life: old.life, newest: old.newest, withdrawn: true})
}

// store replaces peer's entry old with e, and counts it if it is bad.
func (d *Directory) store(peer int, old, e *entry) {
	d.entries[peer].Store(e)
	wasBad, isBad := old != nil && old.bad != nil, e.bad != nil
	switch {
	case isBad && !wasBad:
		d.malformed.Add(1)
	case wasBad && !isBad:
		d.malformed.Add(-1)
	}
}

// supersedeIfOlder ends p if newest, a life of its peer, is newer than
// p's: p writes nothing more, and its keep-alive loop revokes its lease.
// The caller holds d.mu, so that a publication that Publish installs is
// checked against the mirror either here or there.
func supersedeIfOlder(p *publication, newest int64) {
	if p.life < newest && !p.superseded.Swap(true) {
		p.cancel()
	}
}

// watch keeps the mirror current from revision rev on, until Close.
func (d *Directory) watch(rev int64) {
	defer d.loops.Done()
	backoff := minBackoff
	for {
		var progressed bool
		rev, progressed = d.follow(rev)
		if progressed {
			backoff = minBackoff
		}
		// The watch ended (compaction, a member without a leader, a
		// cancellation by the server): reload, then watch from there.
		if pause(d.ctx, backoff) != nil {
			return
		}
		backoff = min(2*backoff, maxBackoff)
		if r, err := d.load(d.ctx); err == nil {
			rev = r
			d.relists.Add(1)
		}
	}
}

// follow applies the events after revision rev until the watch ends, and
// returns the revision the mirror is then current to; progressed reports
// whether any response came.
func (d *Directory) follow(rev int64) (last int64, progressed bool) {
	// A member cut off from the cluster's leader would keep the watch open
	// and silent: with WithRequireLeader, etcd cancels it instead, and the
	// mirror reloads through another member once the client finds one.
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(d.ctx))
	defer cancel()
	wch := d.opts.Client.Watch(ctx, d.opts.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for {
		// Close is waited for here, not only through the channel: the
		// channel of a watch on a client that was closed is not always
		// closed when d.ctx is cancelled, and Close hung on it (a fresh-
		// clone CI run, TestDeadProcessLeavesAndComesBack).
		select {
		case <-d.ctx.Done():
			return rev, progressed
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				return rev, progressed // every error of a watch response ends it
			}
			for _, ev := range resp.Events {
				d.apply(ev.Kv, ev.Type == mvccpb.PUT)
			}
			rev, progressed = resp.Header.Revision, true
		}
	}
}

// pause waits for d, or returns ctx.Err() if ctx ends first.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Size returns the number of peers.
func (d *Directory) Size() int { return len(d.entries) }

func (d *Directory) check(peer int) error {
	if peer < 0 || peer >= len(d.entries) {
		return fmt.Errorf("%w %d (peers are 0 to %d)", directory.ErrUnknownPeer, peer, len(d.entries)-1)
	}
	return nil
}

func (d *Directory) key(peer int) string { return d.opts.Prefix + strconv.Itoa(peer) }

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

// Lookup returns peer's address from the mirror, without a round trip. A
// peer with none gives a [*directory.NotPublishedError] (Withdrawn if it
// had one: it was unpublished or its lease expired); an address that
// failed validation gives an error that names it.
func (d *Directory) Lookup(peer int) (string, error) {
	if err := d.check(peer); err != nil {
		return "", err
	}
	e := d.entries[peer].Load()
	switch {
	case e == nil:
		return "", &directory.NotPublishedError{Peer: peer}
	case e.withdrawn:
		return "", &directory.NotPublishedError{Peer: peer, Withdrawn: true}
	case e.bad != nil:
		return "", fmt.Errorf("etcddir: peer %d's address %q under %q is invalid: %w", peer, e.addr, d.key(peer), e.bad)
	}
	return e.addr, nil
}

var errClosed = errors.New("etcddir: Publish after Close")

// Publish begins a new life of peer at addr (see the package doc): it
// stores addr under a lease of TTL, unconditionally, and keeps the lease
// alive until Unpublish, Close, or a newer life of peer; if the lease is
// lost (this process was cut off from etcd for longer than TTL), it
// publishes the same life again as soon as etcd answers, unless a newer
// life holds the key. This process's previous publication of peer, if
// any, ends. Publish returns once etcd has stored the address, or an error
// if etcd does not answer within Timeout. Calls for one peer take effect
// one after the other.
func (d *Directory) Publish(peer int, addr string) error {
	if err := d.check(peer); err != nil {
		return err
	}
	if addr == "" {
		return fmt.Errorf("etcddir: Publish of an empty address for peer %d", peer)
	}
	if strings.HasPrefix(addr, lifeTag) {
		return fmt.Errorf("etcddir: Publish of peer %d's address %q: an address may not begin with %q, which tags a republication", peer, addr, lifeTag)
	}
	// Without the lock, two calls for one peer could install their
	// publications in the opposite order from their writes: the directory
	// would keep the older, whose lease holds nothing, and lose track of
	// the one that holds the key (before issue 24, 9, it revoked its lease,
	// and the key with it).
	unlock := d.lock(peer)
	defer unlock()
	if d.ctx.Err() != nil {
		return errClosed
	}
	ctx, cancel := context.WithCancel(d.ctx)
	p := &publication{addr: addr, cancel: cancel, done: make(chan struct{})}
	if err := d.put(ctx, peer, p); err != nil {
		cancel()
		if d.ctx.Err() != nil {
			return errClosed
		}
		return err
	}
	d.mu.Lock()
	if d.closed {
		// Close has revoked what it found: this lease is this call's to
		// revoke, or the address would outlive the directory by TTL.
		d.mu.Unlock()
		cancel()
		rctx, rcancel := context.WithTimeout(context.Background(), d.opts.Timeout)
		defer rcancel()
		d.revoke(rctx, p)
		return errClosed
	}
	old := d.own[peer]
	d.own[peer] = p
	if e := d.entries[peer].Load(); e != nil {
		supersedeIfOlder(p, e.newest) // the mirror saw a newer life before p was installed
	}
	if old != nil {
		supersedeIfOlder(old, p.life)
	}
	d.loops.Add(1)
	d.mu.Unlock()
	go d.keepAlive(ctx, peer, p)
	return nil
}

// put grants a lease and stores p's address under it, unconditionally: a
// Publish is the newest life. A lease that expired before the put reached
// etcd (TTL passed between the two requests, on a busy machine) is granted
// again: only Timeout ends the attempts.
func (d *Directory) put(ctx context.Context, peer int, p *publication) error {
	rctx, cancel := context.WithTimeout(ctx, d.opts.Timeout)
	defer cancel()
	for {
		lease, err := d.grant(rctx)
		if err != nil {
			return fmt.Errorf("etcddir: publishing peer %d: %w", peer, err)
		}
		resp, err := d.opts.Client.Put(rctx, d.key(peer), p.addr, clientv3.WithLease(lease))
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("etcddir: publishing peer %d: %w", peer, err)
		}
		p.lease.Store(int64(lease))
		p.life = resp.Header.Revision
		return nil
	}
}

func (d *Directory) grant(ctx context.Context) (clientv3.LeaseID, error) {
	resp, err := d.opts.Client.Grant(ctx, int64((d.opts.TTL+time.Second-1)/time.Second))
	if err != nil {
		return 0, fmt.Errorf("granting a lease from etcd at %v: %w", d.opts.Client.Endpoints(), err)
	}
	return resp.ID, nil
}

// keepAlive keeps p's lease alive until ctx ends, and publishes p again
// whenever the lease is lost, until a newer life supersedes it.
func (d *Directory) keepAlive(ctx context.Context, peer int, p *publication) {
	defer d.loops.Done()
	defer close(p.done)
	defer func() {
		if p.superseded.Load() {
			// Removes the key if this life's last write still holds it (it
			// wrote into an absent key before the mirror told of the newer
			// life). Close cuts it short: it revokes what it finds itself.
			rctx, cancel := context.WithTimeout(d.ctx, d.opts.Timeout)
			defer cancel()
			d.revoke(rctx, p)
		}
	}()
	backoff := minBackoff
	for ctx.Err() == nil {
		answered := false
		if ka, err := d.opts.Client.KeepAlive(ctx, clientv3.LeaseID(p.lease.Load())); err == nil {
			for range ka { // drained, or the client blocks on it
				answered = true
			}
		}
		if answered {
			backoff = minBackoff
		}
		// The keep-alives stopped: the lease is gone (expired while etcd
		// could not be reached, or revoked), or the client stopped waiting
		// for etcd's answers. Publish again, as soon as etcd answers.
		for {
			if pause(ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, maxBackoff)
			superseded, err := d.republish(ctx, peer, p)
			if superseded {
				p.superseded.Store(true)
				return
			}
			if err == nil {
				break
			}
		}
	}
}

// republish runs when p's keep-alives stopped. If p's lease is still
// alive, it does nothing: the keep-alives resume. If the lease is gone,
// and with it the key if it was bound to it, it writes p's life again
// under a new lease, in a transaction conditional on the key being as last
// read: absent, p's own life, or an older life. It writes nothing and
// reports superseded if the key holds a newer life, or if the mirror has
// told of one.
func (d *Directory) republish(ctx context.Context, peer int, p *publication) (superseded bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, d.opts.Timeout)
	defer cancel()
	ttl, err := d.opts.Client.TimeToLive(rctx, clientv3.LeaseID(p.lease.Load()))
	if err != nil {
		return false, err
	}
	if ttl.TTL >= 0 { // -1: no such lease
		return false, nil
	}
	key := d.key(peer)
	get, err := d.opts.Client.Get(rctx, key)
	if err != nil {
		return false, err
	}
	kvs := get.Kvs
	var lease clientv3.LeaseID
	for {
		var modRev int64 // 0: the key is absent
		if len(kvs) > 0 {
			if _, life, _ := decode(kvs[0]); life > p.life {
				return true, nil
			}
			modRev = kvs[0].ModRevision
		}
		if p.superseded.Load() {
			return true, nil
		}
		if lease == 0 {
			if lease, err = d.grant(rctx); err != nil {
				return false, err
			}
			// Known before the write, so that a revoke on the way out
			// (superseded meanwhile) removes what it may have written.
			p.lease.Store(int64(lease))
		}
		txn, err := d.opts.Client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, tagged(p.addr, p.life), clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key)).
			Commit()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			lease = 0 // expired before the write reached etcd: grant another
			continue
		case err != nil:
			return false, err
		case txn.Succeeded:
			return false, nil
		}
		kvs = txn.Responses[0].GetResponseRange().Kvs
	}
}

// revoke revokes p's lease, which deletes its key if it is still bound to
// it.
func (d *Directory) revoke(ctx context.Context, p *publication) {
	if id := p.lease.Load(); id != 0 {
		_, _ = d.opts.Client.Revoke(ctx, clientv3.LeaseID(id))
	}
}

// Unpublish withdraws peer's address. If this process published peer, it
// withdraws only its own life: a newer one (the peer restarted elsewhere)
// is not its to withdraw. Otherwise, as a resource manager withdraws a
// peer it knows to be dead, it withdraws whatever life holds the key. It
// reports whether it deleted an address; false also when etcd does not
// answer within Timeout, which its requests share.
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
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Timeout)
	defer cancel()
	key := d.key(peer)
	if p == nil {
		resp, err := d.opts.Client.Delete(ctx, key)
		return err == nil && resp.Deleted > 0
	}
	p.cancel()
	<-p.done
	defer d.revoke(ctx, p)
	resp, err := d.opts.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(key), "=", p.lease.Load())).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err == nil && resp.Succeeded && resp.Responses[0].GetResponseDeleteRange().Deleted > 0
}

// Watch calls f with a peer and its address each time the mirror makes an
// address of it visible with a new life, or again after it was withdrawn
// (see "What a watcher sees" in the package doc), on the directory's watch
// goroutine, one call at a time, in etcd's revision order, until stop is
// called; stop waits for a call under way. f must not call stop or Close.
func (d *Directory) Watch(f func(peer int, addr string)) (stop func()) {
	d.watchMu.Lock()
	id := d.nextID
	d.nextID++
	d.watchers[id] = f
	d.watchMu.Unlock()
	return func() {
		d.watchMu.Lock()
		delete(d.watchers, id)
		d.watchMu.Unlock()
	}
}

func (d *Directory) notify(peer int, addr string) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	for _, f := range d.watchers {
		f(peer, addr)
	}
}

// Malformed returns the number of entries under the prefix, as the mirror
// last saw them, that are not a valid peer and address: keys that name no
// peer in range, and peers whose value is empty, garbled or fails
// Options.Validate. An entry counts once however often it is read, and
// stops counting once it is deleted or made valid.
func (d *Directory) Malformed() int64 { return d.malformed.Load() }

// Reloads returns how many times the watch was lost and the prefix read
// again.
func (d *Directory) Reloads() int64 { return d.relists.Load() }

// Close stops the watch and the keep-alives and revokes this process's
// leases, so that its addresses leave the directory at once rather than
// TTL later (only those still bound to them: never a newer life's). The
// revokes share one deadline, Timeout: Close returns within about Timeout
// even if etcd does not answer. It does not close the client. A Publish
// that overlaps Close either returns nil, and Close revokes its lease, or
// fails and leaves nothing in etcd.
func (d *Directory) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	own := d.own
	d.own = map[int]*publication{}
	d.mu.Unlock()
	d.cancel()
	d.loops.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Timeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range own {
		wg.Go(func() { d.revoke(ctx, p) })
	}
	wg.Wait()
	return nil
}

var (
	_ directory.Interface = (*Directory)(nil)
	_ directory.Watcher   = (*Directory)(nil)
)
