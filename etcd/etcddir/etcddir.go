package etcddir

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults of Options.
const (
	DefaultTTL      = 5 * time.Second
	DefaultTimeout  = 5 * time.Second
	DefaultPageSize = 1000
)

// Mode is how a [Directory] learns the other peers' addresses; see
// "Choosing a mode" in the package doc.
type Mode int

const (
	// Mirror keeps every peer's address in memory, loaded at Open and kept
	// current by a watch of the whole prefix: Lookup answers every peer at
	// once, and every new life of every peer is news. It costs etcd N
	// events per publication, N² for a job of N processes starting.
	Mirror Mode = iota
	// OnDemand fetches a peer's address when this process first asks for
	// it ([Directory.Resolve]): one read of one key, and a watch of that
	// key if the peer has not published yet. Concurrent askers share the
	// one fetch. It costs etcd in proportion to the peers each process
	// uses, not to the job's size.
	OnDemand
)

func (m Mode) String() string {
	switch m {
	case Mirror:
		return "mirror"
	case OnDemand:
		return "ondemand"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Options configures a [Directory].
type Options struct {
	// Client is the etcd client. Required; Close does not close it.
	Client *clientv3.Client

	// Prefix is the key prefix of the job: peer i publishes under
	// [Key](Prefix, i), Prefix + "v2/" + i in ten digits. Required; it
	// should end in "/", so that one job's prefix is not the start of
	// another's.
	Prefix string

	// Size is the number of peers, numbered 0 to Size-1. Required.
	Size int

	// Mode is Mirror (the default) or OnDemand.
	Mode Mode

	// TTL is the life of the lease this process binds its publications
	// to: a process that stops keeping it alive leaves the directory at
	// most TTL later. DefaultTTL if 0; at least one second (etcd counts
	// leases in whole seconds).
	TTL time.Duration

	// Timeout bounds each request to etcd, and the revoke of Close.
	// DefaultTimeout if 0.
	Timeout time.Duration

	// Validate, if set, checks each address read from etcd (for TCP, that
	// it is a host:port): Lookup and Resolve of a peer whose address fails
	// it return an error naming the peer, the address and the failure.
	Validate func(addr string) error

	// MaxEntries, OnDemand only: if positive, the most addresses this
	// process keeps (epcache's [epcache.Config] MaxEntries, whose doc says
	// how the room is shared). A fetch that needs room when the cache is
	// full first evicts an address that has not been used since the clock
	// hand last passed it, choosing among those the one asked for least
	// often (a CLOCK weighed by a frequency sketch): a peer asked for
	// often outlives one asked for once, even if that one was used more
	// recently. An evicted address is fetched again when asked for. A
	// fetch holds room only for its one read of the peer's key: a peer
	// that has not published is waited for outside the cache, taking no
	// room, so that lookups of published peers never wait behind it. What
	// such a wait, Unreachable's watch or Prefetch finds is kept only if
	// there is room (they never evict); Resolve returns it all the same.
	MaxEntries int

	// IdleTimeout, OnDemand only: if positive, an address nobody asked for
	// in about that long is dropped (epcache's Config.IdleTimeout).
	IdleTimeout time.Duration

	// PageSize is the most keys one range request returns: reads of many
	// keys (Open's in Mirror, a reload, a fence's, Prefetch) are made of
	// pages. DefaultPageSize if 0.
	PageSize int
}

// Directory is a directory of peer addresses kept in etcd. Make one with
// [Open]; its methods are safe for concurrent use.
type Directory struct {
	opts  Options
	count counters

	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	loops  sync.WaitGroup // every goroutine of the directory's; Add only under mu, while !closed

	mu     sync.Mutex
	own    map[int]*publication // this process's publications, until Unpublish or Close; guarded by mu
	locks  map[int]*peerLock    // per peer, while a Publish, Unpublish or republication of it runs or waits; guarded by mu
	closed bool                 // Close has begun; guarded by mu
	owned  ownRange             // OnDemand: the peers whose keys the own watch follows; guarded by mu

	lease leaseState // the one lease of this process's publications

	// Mirror only.
	entries []atomic.Pointer[entry] // nil: never seen
	// odd holds the keys under the prefix that name no peer of this
	// format, as the mirror last saw them. Only load and apply use it, on
	// Open's goroutine and then on the watch's, one after the other.
	odd       map[string]struct{}
	malformed atomic.Int64 // Mirror: len(odd) + the peers whose entry is bad; OnDemand: old-format keys
	waitMu    sync.Mutex
	waiters   map[int]chan struct{} // closed when the mirror stores an entry of the peer; guarded by waitMu

	// OnDemand only.
	addrs *epcache.Cache[int, address]
	ond   onDemand

	watchMu  sync.Mutex // held while a watcher runs, so that stop waits for it
	watchers map[int]func(int, string)
	nextID   int
}

// Backoffs of the loops that wait for etcd to answer again, each wait
// drawn at random from its upper half (jitter): after a compaction or an
// etcd restart, a job's processes do not come back in step.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// jitter returns a random duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	half := d / 2
	return half + rand.N(d-half+1)
}

// maxTxnOps is etcd's default --max-txn-ops: PublishAll writes at most
// this many peers per transaction.
const maxTxnOps = 128

// Open connects the directory to its job's keys. In Mirror mode it loads
// every address under opts.Prefix and starts watching them; in OnDemand
// mode it reads only the names of the keys of the old format, so that a
// peer published only under that format gets an error that says so (see
// "Keys" in the package doc). It reads page by page, PageSize keys a
// request, every page at the revision of the first; a compaction between
// two pages makes it read again from the first page, at once, at the
// newest revision. It fails, with an error naming the endpoints, if etcd
// does not answer a request within opts.Timeout, or ctx ends first.
func Open(ctx context.Context, opts Options) (*Directory, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("etcddir: Options.Client is nil; it is required")
	case opts.Prefix == "":
		return nil, errors.New("etcddir: Options.Prefix is empty; want a key prefix such as \"/epcache/job-1/\"")
	case opts.Size <= 0 || opts.Size > directory.MaxSize:
		return nil, fmt.Errorf("etcddir: Options.Size is %d; want 1 to %d", opts.Size, directory.MaxSize)
	case opts.Mode != Mirror && opts.Mode != OnDemand:
		return nil, fmt.Errorf("etcddir: Options.Mode is %v; want Mirror or OnDemand", opts.Mode)
	case opts.TTL < 0 || opts.TTL > 0 && opts.TTL < time.Second:
		return nil, fmt.Errorf("etcddir: Options.TTL is %v; want 0 (default %v) or at least 1s", opts.TTL, DefaultTTL)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("etcddir: Options.Timeout is %v; want 0 (default %v) or a positive duration", opts.Timeout, DefaultTimeout)
	case opts.PageSize < 0:
		return nil, fmt.Errorf("etcddir: Options.PageSize is %d; want 0 (default %d) or a positive count", opts.PageSize, DefaultPageSize)
	case opts.MaxEntries < 0:
		return nil, fmt.Errorf("etcddir: Options.MaxEntries is %d; want 0 (no bound) or a positive count", opts.MaxEntries)
	case opts.IdleTimeout < 0:
		return nil, fmt.Errorf("etcddir: Options.IdleTimeout is %v; want 0 (none) or a positive duration", opts.IdleTimeout)
	case opts.Mode == Mirror && (opts.MaxEntries > 0 || opts.IdleTimeout > 0):
		return nil, errors.New("etcddir: Options.MaxEntries and IdleTimeout bound the addresses OnDemand fetches; a Mirror holds every peer's")
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.PageSize == 0 {
		opts.PageSize = DefaultPageSize
	}
	d := &Directory{
		opts:     opts,
		own:      map[int]*publication{},
		locks:    map[int]*peerLock{},
		watchers: map[int]func(int, string){},
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	var err error
	if opts.Mode == Mirror {
		err = d.openMirror(ctx)
	} else {
		err = d.openOnDemand(ctx)
	}
	if err != nil {
		d.cancel()
		d.loops.Wait()
		return nil, err
	}
	return d, nil
}

// spawn runs f on a goroutine of the directory's, which Close waits for;
// it reports false, and runs nothing, once Close has begun.
func (d *Directory) spawn(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
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

// enter begins a call that makes requests of its own (Prefetch) as one
// of the directory's goroutines, which Close waits for. It returns ctx,
// ended by Close too, and the function that ends the call; ok is false,
// and nothing is begun, once Close has begun.
func (d *Directory) enter(ctx context.Context) (_ context.Context, exit func(), ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, nil, false
	}
	d.loops.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
		d.loops.Done()
	}, true
}

// Size returns the number of peers.
func (d *Directory) Size() int { return d.opts.Size }

// Mode returns the directory's mode.
func (d *Directory) Mode() Mode { return d.opts.Mode }

func (d *Directory) check(peer int) error {
	if peer < 0 || peer >= d.opts.Size {
		return fmt.Errorf("%w %d (peers are 0 to %d)", directory.ErrUnknownPeer, peer, d.opts.Size-1)
	}
	return nil
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

// request returns the context of one request to etcd: ctx, bounded by
// Timeout.
func (d *Directory) request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.opts.Timeout)
}

// Lookup returns peer's address from memory, without a round trip. A
// peer with none gives a [*directory.NotPublishedError]; a value that is
// empty or garbled, an address that failed validation, or a peer that
// published only under the old key format (a peer with keys of both
// formats is answered with the address of its key of this one), gives an
// error that says so, and is not a NotPublishedError.
//
// In Mirror mode, Withdrawn is set for a peer that had an address (it was
// unpublished or its lease expired). In OnDemand mode, Lookup answers
// from what this process fetched (Resolve, Prefetch, and Lookup's own
// fetches). For a peer whose address it holds none of, it starts a fetch
// in the background, bounded by Timeout (its wait for a peer that has not
// published included), unless one runs or a Resolve of the peer is under
// way, and answers what the last fetch of the peer found wrong with its value
// or key format, or, if none did, a NotPublishedError (so a peer of the
// old format too, before a fetch has looked for its key of this format).
// A valid address that Prefetch or Unreachable's watch reads from a
// later write of the key than the wrong one ends that answer; one read
// from an earlier write (a Prefetch at an older revision) does not, and
// is not kept:
// a transport that only calls Lookup and retries it finds the address, or
// learns what is wrong, on a later call. A peer whose value is wrong is
// read again at each Lookup that starts a fetch, so that a corrected
// value is found.
func (d *Directory) Lookup(peer int) (string, error) {
	if err := d.check(peer); err != nil {
		return "", err
	}
	if d.addrs != nil {
		return d.lookupOnDemand(peer)
	}
	return d.lookupMirror(peer)
}

// Resolve returns peer's address as Lookup does, and, where this process
// holds none, waits for one until ctx ends. In OnDemand mode it fetches
// the address from etcd (one read of one key, serializable; linearizable
// after [Directory.Unreachable] reported the address it held), and, if the
// key is absent, watches that key from the read's revision until the peer
// publishes: nothing is missed and nothing is polled. However many
// goroutines ask for one peer at once, etcd sees one fetch (and, for a
// peer that has not published, one watch), and its reply answers them
// all. The watch of a peer that has not published runs outside the
// address cache: it takes none of MaxEntries' room, and no Resolve or
// Lookup of a published peer waits behind it; the address it finds is
// returned even where the cache has no room to keep it. In Mirror mode it
// waits for the mirror to hold an address.
//
// A peer outside 0 to Size-1 gives an error wrapping
// [directory.ErrUnknownPeer] at once; an invalid address, or a peer that
// published only under the old key format, an error that says so, at
// once (a peer with keys of both formats gets the address of its key of
// this one, as from Lookup, in both modes). When ctx ends first, the
// error names the peer and wraps both ctx.Err() and a
// [*directory.NotPublishedError]. After Close, Resolve fails.
func (d *Directory) Resolve(ctx context.Context, peer int) (string, error) {
	if err := d.check(peer); err != nil {
		return "", err
	}
	d.count.resolves.Add(1)
	if d.addrs != nil {
		if a, ok := d.addrs.Load(peer); ok {
			return a.addr, nil
		}
		return d.resolveOnDemand(ctx, peer)
	}
	return d.resolveMirror(ctx, peer)
}

// notPublishedBy is Resolve's error when ctx ends before peer has an
// address.
func (d *Directory) notPublishedBy(ctx context.Context, peer int) error {
	return fmt.Errorf("etcddir: resolving peer %d (key %q): %w: %w", peer, d.key(peer), &directory.NotPublishedError{Peer: peer}, ctx.Err())
}

var errClosed = errors.New("etcddir: directory closed")

// Unreachable reports that addr, which Resolve or Lookup returned for
// peer, no longer answers. In OnDemand mode, if the directory still holds
// addr for peer, it drops it (a report about an older address leaves a
// newer one alone), so that the next Resolve reads the key again,
// linearizably; and it watches peer's key for a life newer than the
// newest reported, which, as soon as it appears, replaces in the address
// cache any older life held (a Resolve may have read the reported one
// again meanwhile, while its process's lease lasts), and then the
// watchers are told of it: from the moment they are, Lookup and Resolve
// answer it. One watch per peer follows every report: a report made
// while it runs (of the life it found, say) makes it wait for a life
// newer than that one. A reported life, or an older one, is never put
// back into the cache except by a read of the key (Resolve, or Lookup's
// background fetch): not by Prefetch, nor by the watch. The watch ends
// with a life newer than every report, or at Close; a key of the old
// format for the peer does not end it (the key of this format, once
// written, wins). In Mirror mode, which follows every change of every
// key, it does nothing.
func (d *Directory) Unreachable(peer int, addr string) {
	if d.check(peer) != nil || d.addrs == nil {
		return
	}
	d.unreachable(peer, addr)
}

// Watch calls f with a peer and its address each time this process learns
// of a new life of the peer (see "What a watcher sees" in the package
// doc), on a goroutine of the directory's, one call at a time, until stop
// is called; stop waits for a call under way. f must not call stop or
// Close. Each call of f runs on a goroutine of its own, which the
// directory waits for: if f calls runtime.Goexit (t.FailNow in a test),
// that call ends there, and the directory, the other watchers and later
// calls go on as if it had returned. A panic in f is not recovered: as
// on any goroutine, it ends the program.
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

// notify calls every watcher with peer's new life, one at a time. It
// runs on the mirror's or the news's loop, which a runtime.Goexit in f
// would end for good: each call runs on a goroutine of its own instead,
// whose end (a return or a Goexit) notify waits for. A call costs a
// goroutine, and calls are as rare as new lives.
func (d *Directory) notify(peer int, addr string) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	for _, f := range d.watchers {
		done := make(chan struct{})
		go func() {
			defer close(done)
			f(peer, addr)
		}()
		<-done
	}
}

// Malformed returns the number of entries under the prefix that are not
// a valid peer and address. In Mirror mode: keys that name no peer of
// this format (the old format's included), and peers whose value is
// empty, garbled or fails Options.Validate, as the mirror last saw them;
// an entry counts once however often it is read, and stops counting once
// it is deleted or made valid. In OnDemand mode, which reads only the
// keys it needs: the keys of the old format under the prefix.
func (d *Directory) Malformed() int64 { return d.malformed.Load() }

// Reloads returns how many times a watch was lost and its range read
// again.
func (d *Directory) Reloads() int64 { return d.count.reloads.Load() }

// Close stops the directory's watches and fetches and revokes this
// process's lease, so that its addresses leave the directory at once
// rather than TTL later (only those still bound to it: never a newer
// life's). The revoke is bounded by Timeout: Close returns within about
// Timeout even if etcd does not answer. It does not close the client. A
// Publish that overlaps Close either returns nil, and Close revokes its
// lease, or fails and leaves nothing in etcd; a Resolve waiting when Close
// begins fails; a Prefetch under way is stopped, fails as a Prefetch
// after Close does, and Close waits for it to return, so that no
// Prefetch request is made after Close returns.
func (d *Directory) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.own = map[int]*publication{}
	d.mu.Unlock()
	d.cancel()
	if d.addrs != nil {
		_ = d.addrs.Close() // no Release: nothing to report
	}
	d.loops.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Timeout)
	defer cancel()
	d.revokeLease(ctx)
	return nil
}

var (
	_ directory.Interface = (*Directory)(nil)
	_ directory.Watcher   = (*Directory)(nil)
	_ directory.Resolver  = (*Directory)(nil)
)
