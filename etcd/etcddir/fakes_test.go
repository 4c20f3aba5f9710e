package etcddir_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/etcd/etcddir"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The fakes below replace one of a client's interfaces (its KV, Lease or
// Watcher, which the client embeds) to put a process in a situation that
// a real network makes only by chance: cut off from etcd, or stopped at
// one step of a request. Each passes everything else through to etcd.

// silentLease is a client's Lease that never sends a keep-alive: a lease
// granted through it expires TTL after its grant, as a dead process's
// does, however late the process would have sent its keep-alives.
type silentLease struct{ clientv3.Lease }

func (silentLease) KeepAlive(ctx context.Context, _ clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	ch := make(chan *clientv3.LeaseKeepAliveResponse)
	context.AfterFunc(ctx, func() { close(ch) })
	return ch, nil
}

// patientOpen is a client's KV whose first read, the one Open makes, waits
// for etcd however long it takes; every later request keeps the
// directory's Timeout.
type patientOpen struct {
	clientv3.KV
	opened atomic.Bool
}

func (k *patientOpen) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if !k.opened.Swap(true) {
		ctx = context.WithoutCancel(ctx)
	}
	return k.KV.Get(ctx, key, opts...)
}

// deeds records the requests through which a process changed, or tried to
// change, etcd, each once etcd answered it: "put <key> <value>", "txn
// succeeded" or "txn failed", "revoke". A test that fails prints them.
type deeds struct {
	mu   sync.Mutex
	list []string
}

func (d *deeds) add(format string, args ...any) {
	d.mu.Lock()
	d.list = append(d.list, fmt.Sprintf(format, args...))
	d.mu.Unlock()
}

func (d *deeds) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.list, "; ")
}

// spyKV is a client's KV that records its writes in deeds.
type spyKV struct {
	clientv3.KV
	deeds *deeds
}

func (k spyKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	resp, err := k.KV.Put(ctx, key, val, opts...)
	if err == nil {
		k.deeds.add("put %s %s", key, val)
	}
	return resp, err
}

func (k spyKV) Txn(ctx context.Context) clientv3.Txn { return spyTxn{k.KV.Txn(ctx), k.deeds} }

type spyTxn struct {
	clientv3.Txn
	deeds *deeds
}

func (t spyTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { return spyTxn{t.Txn.If(cs...), t.deeds} }
func (t spyTxn) Then(ops ...clientv3.Op) clientv3.Txn { return spyTxn{t.Txn.Then(ops...), t.deeds} }
func (t spyTxn) Else(ops ...clientv3.Op) clientv3.Txn { return spyTxn{t.Txn.Else(ops...), t.deeds} }

func (t spyTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	switch {
	case err != nil:
	case resp.Succeeded:
		t.deeds.add("txn succeeded")
	default:
		t.deeds.add("txn failed")
	}
	return resp, err
}

// cutLease is a client's Lease cut off from etcd until heal: its
// keep-alives never reach etcd, so that etcd lets the lease lapse (the
// test revokes it, as etcd does TTL after the last keep-alive) while the
// process goes on as if all were well. heal closes the keep-alive channels
// under way, as the client does when etcd answers that the lease is gone,
// and lets every later keep-alive through. Revokes go through all along,
// and are recorded in deeds.
type cutLease struct {
	clientv3.Lease
	healed chan struct{}
	deeds  *deeds
}

func (l *cutLease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	select {
	case <-l.healed:
		return l.Lease.KeepAlive(ctx, id)
	default:
	}
	ch := make(chan *clientv3.LeaseKeepAliveResponse)
	go func() {
		select {
		case <-l.healed:
		case <-ctx.Done():
		}
		close(ch)
	}()
	return ch, nil
}

func (l *cutLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	resp, err := l.Lease.Revoke(ctx, id)
	l.deeds.add("revoke %x (%v)", int64(id), err)
	return resp, err
}

// gatedWatch is a client's Watcher that the test controls: responses flow
// only once open is closed (a process cut off from etcd hears no news),
// and breakAll ends every watch so far, as etcd does when it cancels one.
type gatedWatch struct {
	clientv3.Watcher
	open chan struct{}

	mu    sync.Mutex
	stops []context.CancelFunc
}

func (w *gatedWatch) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	ctx, stop := context.WithCancel(ctx)
	w.mu.Lock()
	w.stops = append(w.stops, stop)
	w.mu.Unlock()
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		select {
		case <-w.open:
		case <-ctx.Done():
			return
		}
		for resp := range in {
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func (w *gatedWatch) breakAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, stop := range w.stops {
		stop()
	}
}

// zombie is a process that loses touch with etcd and goes on: its lease's
// keep-alives never reach etcd until heal, and, if its news are held,
// its watch hears nothing until hear.
type zombie struct {
	*etcddir.Directory
	deeds *deeds
	lease *cutLease
	watch *gatedWatch
}

func startZombie(t *testing.T, url string, holdNews bool, mode etcddir.Mode) *zombie {
	t.Helper()
	c := client(t, url)
	z := &zombie{deeds: &deeds{}}
	z.lease = &cutLease{Lease: c.Lease, healed: make(chan struct{}), deeds: z.deeds}
	z.watch = &gatedWatch{Watcher: c.Watcher, open: make(chan struct{})}
	if !holdNews {
		close(z.watch.open)
	}
	c.KV, c.Lease, c.Watcher = spyKV{c.KV, z.deeds}, z.lease, z.watch
	z.Directory = open(t, c, func(o *etcddir.Options) { o.Mode = mode })
	return z
}

// heal lets the zombie's keep-alives reach etcd: the first tells it that
// its lease is gone.
func (z *zombie) heal() { close(z.lease.healed) }

// hear lets the zombie's watch deliver what it held.
func (z *zombie) hear() { close(z.watch.open) }

// gatePut is a client's KV that stops the first Put of key once etcd has
// answered it, until release is closed: the process's write is in etcd,
// and the process has not heard so yet.
type gatePut struct {
	clientv3.KV
	key     string
	puts    atomic.Int32
	landed  chan struct{} // closed when the first Put of key is answered
	release chan struct{}
	second  chan struct{} // closed when the second Put of key is answered
}

func newGatePut(kv clientv3.KV, key string) *gatePut {
	return &gatePut{KV: kv, key: key, landed: make(chan struct{}), release: make(chan struct{}), second: make(chan struct{})}
}

func (k *gatePut) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	resp, err := k.KV.Put(ctx, key, val, opts...)
	if key == k.key {
		switch k.puts.Add(1) {
		case 1:
			close(k.landed)
			<-k.release
		case 2:
			close(k.second)
		}
	}
	return resp, err
}

// waitingInPublish reports whether a goroutine waits for a lock in
// Publish, with no request to etcd under way and not in the gatePut: a
// Publish that waits for another of the same peer to end.
func waitingInPublish() bool {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n") // "goroutine 7 [sync.Mutex.Lock]:"
		if !strings.Contains(header, "Mutex.Lock") && !strings.Contains(header, "semacquire") {
			continue
		}
		if strings.Contains(g, "etcddir.(*Directory).Publish(") &&
			!strings.Contains(g, "go.etcd.io/etcd/client/v3.") &&
			!strings.Contains(g, "(*gatePut).Put(") {
			return true
		}
	}
	return false
}

// patientKV is a client's KV whose reads and writes wait for etcd however
// long it takes, whatever the directory's Timeout.
type patientKV struct{ clientv3.KV }

func (k patientKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	return k.KV.Get(context.WithoutCancel(ctx), key, opts...)
}

func (k patientKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return k.KV.Put(context.WithoutCancel(ctx), key, val, opts...)
}

// unansweredRevoke is a client's Lease whose grants wait for etcd however
// long it takes and whose revokes are never answered, as by an etcd that
// went away: each waits for its deadline, which it records.
type unansweredRevoke struct {
	clientv3.Lease
	mu        sync.Mutex
	deadlines []time.Time
}

func (l *unansweredRevoke) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	return l.Lease.Grant(context.WithoutCancel(ctx), ttl)
}

func (l *unansweredRevoke) Revoke(ctx context.Context, _ clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	dl, _ := ctx.Deadline()
	l.mu.Lock()
	l.deadlines = append(l.deadlines, dl)
	l.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

// countingKV is a client's KV that counts the reads of each key, notes
// whether each was serializable, and holds every read of a key that
// matches hold until release is closed (nil hold: none held).
type countingKV struct {
	clientv3.KV
	hold    func(key string) bool
	release chan struct{}

	mu    sync.Mutex
	reads map[string][]bool // key → serializable, per read
}

func newCountingKV(kv clientv3.KV) *countingKV {
	return &countingKV{KV: kv, release: make(chan struct{}), reads: map[string][]bool{}}
}

func (k *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.mu.Lock()
	k.reads[key] = append(k.reads[key], clientv3.OpGet(key, opts...).IsSerializable())
	k.mu.Unlock()
	if k.hold != nil && k.hold(key) {
		select {
		case <-k.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return k.KV.Get(ctx, key, opts...)
}

// readsOf returns the reads of key so far: true for a serializable one.
func (k *countingKV) readsOf(key string) []bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.reads[key])
}

// countingWatcher is a client's Watcher that counts the watches of each
// key, and holds the first watch of a key that matches hold until release
// is closed, after closing held.
type countingWatcher struct {
	clientv3.Watcher
	hold    func(key string) bool
	held    chan struct{}
	release chan struct{}

	mu      sync.Mutex
	watches map[string]int
	holding bool
}

func newCountingWatcher(w clientv3.Watcher) *countingWatcher {
	return &countingWatcher{Watcher: w, held: make(chan struct{}), release: make(chan struct{}), watches: map[string]int{}}
}

func (w *countingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.mu.Lock()
	w.watches[key]++
	first := w.hold != nil && !w.holding && w.hold(key)
	if first {
		w.holding = true
	}
	w.mu.Unlock()
	if first {
		close(w.held)
		select {
		case <-w.release:
		case <-ctx.Done():
		}
	}
	return w.Watcher.Watch(ctx, key, opts...)
}

func (w *countingWatcher) watchesOf(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.watches[key]
}

// compactAfterFirstPage is a client's KV that compacts etcd's history
// right after the first range read under prefix is answered: between the
// first two pages of Open's load.
type compactAfterFirstPage struct {
	clientv3.KV
	prefix  string
	compact func()
	once    sync.Once
}

func (k *compactAfterFirstPage) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil && strings.HasPrefix(key, k.prefix) && !clientv3.OpGet(key, opts...).IsSerializable() && len(clientv3.OpGet(key, opts...).RangeBytes()) > 0 {
		k.once.Do(k.compact)
	}
	return resp, err
}
