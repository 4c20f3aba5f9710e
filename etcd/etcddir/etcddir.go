// Package etcddir is a directory of peer addresses backed by etcd, for
// transports whose peers are separate processes on separate hosts: it
// implements [directory.Interface] and [directory.Watcher], so that
// transport/tcp (and transport/ucx) take it where a single process uses the
// in-process [directory.Directory].
//
// A peer publishes its address under Prefix + its number, bound to an etcd
// lease that the publishing process keeps alive: a process that dies (even
// by SIGKILL) disappears from the directory when its lease expires, TTL
// after its last keep-alive. Every process keeps a mirror of the whole
// prefix, loaded at Open and kept current by a watch, so that Lookup, which
// a transport calls on every connection attempt, answers from memory; a
// peer that has not published (or whose lease expired) gets the
// [directory.NotPublishedError] that transports retry. The watch also tells
// a transport when a dead peer republishes ([Directory.Watch]), so that it
// forgets a remembered failure at once instead of when its ErrorTTL ends.
//
// etcd going away is not fatal: the client reconnects, the watch resumes
// where it stopped (or reloads the prefix if etcd compacted past it), and a
// publication whose lease was lost meanwhile is made again. Entries under
// the prefix that are not a peer number in range, or whose address is empty
// or fails Options.Validate, are counted ([Directory.Malformed]) and answer
// Lookup with an error that says what is wrong.
//
// This package is in a module of its own (github.com/epcache/epcache/etcd),
// so that importing epcache never brings etcd or gRPC into a build.
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

	// Timeout bounds each request to etcd. DefaultTimeout if 0.
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

	mu  sync.Mutex
	own map[int]*publication // this process's publications; guarded by mu

	watchMu  sync.Mutex // held while a watcher runs, so that stop waits for it
	watchers map[int]func(int, string)
	nextID   int

	malformed atomic.Int64
	relists   atomic.Int64
}

// entry is what the mirror knows of one peer, immutable once stored.
type entry struct {
	addr      string
	withdrawn bool  // a published address was deleted (Unpublish, an expired lease)
	bad       error // the address failed validation
}

// publication is an address this process published and keeps alive.
type publication struct {
	addr   string
	cancel context.CancelFunc
	done   chan struct{} // closed when its keep-alive loop has ended
	lease  atomic.Int64  // the current lease; 0 while there is none
}

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
		watchers: map[int]func(int, string){},
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
	for _, kv := range resp.Kvs {
		if peer, ok := d.apply(kv.Key, kv.Value, true); ok {
			seen[peer] = true
		}
	}
	// A peer that had an address and has none now was withdrawn while the
	// watch was away.
	for peer := range d.entries {
		if old := d.entries[peer].Load(); !seen[peer] && old != nil && !old.withdrawn {
			d.entries[peer].Store(&entry{withdrawn: true})
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

// apply records a put (or, with put false, a delete) of key, and tells the
// watchers of a new address. It reports the peer.
func (d *Directory) apply(key, value []byte, put bool) (int, bool) {
	peer, ok := d.peerOf(key)
	if !ok {
		d.malformed.Add(1)
		return 0, false
	}
	if !put {
		d.entries[peer].Store(&entry{withdrawn: true})
		return peer, true
	}
	e := &entry{addr: string(value)}
	switch {
	case e.addr == "":
		e.bad = errors.New("the address is empty")
	case d.opts.Validate != nil:
		e.bad = d.opts.Validate(e.addr)
	}
	if e.bad != nil {
		d.malformed.Add(1)
	}
	old := d.entries[peer].Swap(e)
	if e.bad == nil && (old == nil || old.addr != e.addr || old.withdrawn) {
		d.notify(peer, e.addr)
	}
	return peer, true
}

// watch keeps the mirror current from revision rev on, until Close.
func (d *Directory) watch(rev int64) {
	defer d.loops.Done()
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		wch := d.opts.Client.Watch(d.ctx, d.opts.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	responses:
		for {
			// Close is waited for here, not only through the channel: the
			// channel of a watch on a client that was closed is not always
			// closed when d.ctx is cancelled, and Close hung on it (a fresh-
			// clone CI run, TestDeadProcessLeavesAndComesBack).
			var resp clientv3.WatchResponse
			select {
			case <-d.ctx.Done():
				return
			case r, ok := <-wch:
				if !ok {
					break responses
				}
				resp = r
			}
			if err := resp.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					break responses // reload below
				}
				continue
			}
			for _, ev := range resp.Events {
				d.apply(ev.Kv.Key, ev.Kv.Value, ev.Type == mvccpb.PUT)
			}
			rev = resp.Header.Revision
			backoff = 50 * time.Millisecond
		}
		if d.ctx.Err() != nil {
			return
		}
		// The watch ended (compaction, or a cancellation by the server):
		// reload, then watch from there.
		select {
		case <-time.After(backoff):
		case <-d.ctx.Done():
			return
		}
		if r, err := d.load(d.ctx); err == nil {
			rev = r
			d.relists.Add(1)
		}
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

// Publish publishes addr as peer's address, bound to a lease of TTL that
// this process keeps alive until Unpublish or Close; if the lease is lost
// (etcd was away longer than TTL), the address is published again under a
// new one as soon as etcd answers. It returns once etcd has stored the
// address, or an error if it does not answer within Timeout.
func (d *Directory) Publish(peer int, addr string) error {
	if err := d.check(peer); err != nil {
		return err
	}
	if addr == "" {
		return fmt.Errorf("etcddir: Publish of an empty address for peer %d", peer)
	}
	if d.ctx.Err() != nil {
		return errors.New("etcddir: Publish after Close")
	}
	ctx, cancel := context.WithCancel(d.ctx)
	p := &publication{addr: addr, cancel: cancel, done: make(chan struct{})}
	if err := d.put(ctx, peer, p); err != nil {
		cancel()
		return err
	}
	d.mu.Lock()
	old := d.own[peer]
	d.own[peer] = p
	d.mu.Unlock()
	if old != nil {
		old.cancel()
		<-old.done
		d.revoke(old)
	}
	d.loops.Add(1)
	go d.keepAlive(ctx, peer, p)
	return nil
}

// put grants a lease and stores p's address under it. A lease that expired
// before the put reached etcd (TTL passed between the two requests, on a
// busy machine) is granted again: only Timeout ends the attempts.
func (d *Directory) put(ctx context.Context, peer int, p *publication) error {
	rctx, cancel := context.WithTimeout(ctx, d.opts.Timeout)
	defer cancel()
	for {
		lease, err := d.opts.Client.Grant(rctx, int64((d.opts.TTL+time.Second-1)/time.Second))
		if err != nil {
			return fmt.Errorf("etcddir: publishing peer %d: granting a lease from etcd at %v: %w", peer, d.opts.Client.Endpoints(), err)
		}
		_, err = d.opts.Client.Put(rctx, d.key(peer), p.addr, clientv3.WithLease(lease.ID))
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("etcddir: publishing peer %d: %w", peer, err)
		}
		p.lease.Store(int64(lease.ID))
		return nil
	}
}

// keepAlive keeps p's lease alive until ctx ends, and publishes p again
// under a new lease whenever the old one is lost.
func (d *Directory) keepAlive(ctx context.Context, peer int, p *publication) {
	defer d.loops.Done()
	defer close(p.done)
	for backoff := 100 * time.Millisecond; ctx.Err() == nil; {
		ka, err := d.opts.Client.KeepAlive(ctx, clientv3.LeaseID(p.lease.Load()))
		if err == nil {
			for range ka { // drained, or the client blocks on it
				backoff = 100 * time.Millisecond
			}
		}
		if ctx.Err() != nil {
			return
		}
		// The lease is gone (expired while etcd was away, or revoked):
		// publish again, as soon as etcd answers.
		for ctx.Err() == nil {
			if d.put(ctx, peer, p) == nil {
				break
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// revoke revokes p's lease, which deletes its key if it still holds it.
func (d *Directory) revoke(p *publication) {
	if id := p.lease.Load(); id != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), d.opts.Timeout)
		defer cancel()
		_, _ = d.opts.Client.Revoke(ctx, clientv3.LeaseID(id))
	}
}

// Unpublish withdraws peer's address (this process's own publication, or
// another's, as a resource manager withdraws a peer it knows to be dead).
// It reports whether etcd held an address for peer; false also when etcd
// does not answer within Timeout.
func (d *Directory) Unpublish(peer int) bool {
	if d.check(peer) != nil {
		return false
	}
	d.mu.Lock()
	p := d.own[peer]
	delete(d.own, peer)
	d.mu.Unlock()
	if p != nil {
		p.cancel()
		<-p.done
		defer d.revoke(p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Timeout)
	defer cancel()
	resp, err := d.opts.Client.Delete(ctx, d.key(peer))
	return err == nil && resp.Deleted > 0
}

// Watch calls f with a peer and its address each time the mirror learns a
// new address for it (a peer that publishes, or republishes after it
// died), on the directory's watch goroutine, one call at a time, until
// stop is called; stop waits for a call under way. f must not call stop
// or Close.
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

// Malformed returns the number of entries read under the prefix that were
// not a valid peer and address.
func (d *Directory) Malformed() int64 { return d.malformed.Load() }

// Reloads returns how many times the watch was lost and the prefix read
// again.
func (d *Directory) Reloads() int64 { return d.relists.Load() }

// Close stops the watch and the keep-alives and revokes this process's
// leases, so that its addresses leave the directory at once rather than
// TTL later. It does not close the client.
func (d *Directory) Close() error {
	d.cancel()
	d.mu.Lock()
	own := d.own
	d.own = map[int]*publication{}
	d.mu.Unlock()
	d.loops.Wait()
	for _, p := range own {
		d.revoke(p)
	}
	return nil
}

var (
	_ directory.Interface = (*Directory)(nil)
	_ directory.Watcher   = (*Directory)(nil)
)
