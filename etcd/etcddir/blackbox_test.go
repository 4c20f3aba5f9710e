package etcddir_test

// Black-box tests of the documented promises: each names the promise it checks.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/etcd/etcdtest"
	"github.com/epcache/epcache/transport/directory"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func waitFor(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(patience):
		t.Fatalf("%s: not within %v", what, patience)
	}
}

// etcddirGoroutines returns the stacks of goroutines running the
// directory's code (the test's own excluded).
func etcddirGoroutines(match string) []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, match) && !strings.Contains(g, "etcddir_test.") {
			out = append(out, g)
		}
	}
	return out
}

func noGoroutines(t *testing.T, what, match string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		gs := etcddirGoroutines(match)
		if len(gs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d goroutines still run %s after 30s; first:\n%s", what, len(gs), match, gs[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Resolve of peers that never publish, by askers that leave on their
// contexts: the shared wait ends once every asker left ("so that a wait
// for the peer that nobody waits for any more stops"); Close leaves no
// goroutine of the directory's.
func TestWaitsEndWhenAskersLeaveAndAtClose(t *testing.T) {
	s := server(t)
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Mode, o.Size, o.MaxEntries = etcddir.OnDemand, 16, 2 })
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+i*7)*time.Millisecond)
			defer cancel()
			_, err := d.Resolve(ctx, i%16)
			var np *directory.NotPublishedError
			if !errors.As(err, &np) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Resolve(%d) left on its context: %v; want NotPublished and DeadlineExceeded", i%16, err)
			}
		}()
	}
	wg.Wait()
	noGoroutines(t, "every asker left", "etcddir.(*Directory).waitPublished")
	t.Logf("abandoned: %d, fetches %d, watches %d", d.Counters().Abandoned, d.Counters().Fetches, d.Counters().Watches)
	// Waits running at Close, Resolves among them.
	errs := make(chan error, 8)
	for p := range 8 {
		go func() { _, err := d.Resolve(context.Background(), p); errs <- err }()
	}
	eventually(t, "8 waits run", func() bool { return len(etcddirGoroutines("etcddir.(*Directory).waitPublished")) == 8 })
	for p := 8; p < 16; p++ {
		d.Lookup(p)
	}
	d.Close()
	for range 8 {
		select {
		case err := <-errs:
			if err == nil {
				t.Error("Resolve waiting at Close succeeded")
			}
		case <-time.After(patience):
			t.Fatal("Resolve waiting at Close did not return")
		}
	}
	noGoroutines(t, "after Close", "etcddir.(*Directory)")
}

// etcd going away mid-wait, then Close: the waiting Resolve fails at
// Close, Close returns within about Timeout, and nothing of the
// directory's runs on.
func TestCloseWithEtcdGoneMidWait(t *testing.T) {
	s, serr := etcdtest.Start("")
	if serr != nil {
		t.Fatal(serr)
	}
	defer func() { // etcdtest's Close after Stop panics: restart, then Close
		if s2, err := s.Restart(); err == nil {
			s2.Close()
		}
	}()
	d, err := etcddir.Open(context.Background(), etcddir.Options{Client: client(t, s.URL()), Prefix: "/test/" + t.Name() + "/", Size: 4, Mode: etcddir.OnDemand, TTL: time.Hour, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Publish(3, "127.0.0.1:7003"); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { _, err := d.Resolve(context.Background(), 1); errs <- err }()
	eventually(t, "the wait runs", func() bool { return len(etcddirGoroutines("etcddir.(*Directory).waitPublished")) == 1 })
	s.Stop()
	go func() { _, err := d.Resolve(context.Background(), 2); errs <- err }()
	d.Lookup(0)
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	d.Close()
	el := time.Since(start)
	t.Logf("Close with etcd gone took %v", el)
	if el > 30*time.Second {
		t.Errorf("Close took %v; want about Timeout (2s)", el)
	}
	for range 2 {
		select {
		case err := <-errs:
			if err == nil {
				t.Error("Resolve waiting at Close succeeded")
			}
		case <-time.After(patience):
			t.Fatal("Resolve waiting at Close did not return")
		}
	}
	noGoroutines(t, "after Close", "etcddir.(*Directory)")
}

// Reordering: an older life, read by Prefetch at an old revision, never
// replaces a newer one held, nor one the watchers were told of.
func TestPrefetchOfAnOlderRevisionKeepsTheNewerLife(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	fence := modRevision(t, tc, key)
	p1 := open(t, client(t, s.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	d := open(t, client(t, s.URL()), onDemand)
	h := listen(t, d)
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7101" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	h.expect(t, "1=127.0.0.1:7101")
	if err := d.Prefetch(request(t), fence); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Lookup(1); err != nil || got != "127.0.0.1:7101" {
		t.Fatalf("Lookup(1) after a Prefetch at an older revision = %q, %v; want the newer life", got, err)
	}
	// Dropped (Unreachable), then Prefetch of the older revision again.
	d.Unreachable(1, "127.0.0.1:7101")
	if err := d.Prefetch(request(t), fence); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Lookup(1); err == nil && got == "127.0.0.1:7001" {
		t.Fatalf("Lookup(1) = the older life's %q after the watchers heard of the newer", got)
	}
	select {
	case n := <-h.ch:
		t.Fatalf("the watcher heard %q of an older life", n)
	default:
	}
}

// generation reads the generation out of an address 127.0.G.P:port.
func generation(addr string) int {
	var a, b, g, p, port int
	fmt.Sscanf(addr, "%d.%d.%d.%d:%d", &a, &b, &g, &p, &port)
	return g
}

// Churn with the invariants of "What a watcher sees" (OnDemand): the
// watchers hear each peer's lives in increasing order ("called when it
// learns of a life of a peer newer than any it knew"), and once they were
// told of a life, Lookup never answers an older one ("so that Lookup
// answers what the watchers were last told ...; an older life never
// replaces a newer one"). Prefetches at old revisions add old lives.
func TestChurnNeverAnswersAnOlderLifeThanTheWatchersHeard(t *testing.T) {
	const size, maxEntries, askers = 10, 3, 12
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	pub := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode = size, etcddir.OnDemand })
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) {
		o.Size, o.Mode, o.MaxEntries, o.PageSize, o.Prefix = size, etcddir.OnDemand, maxEntries, 1, prefix
	})
	var heard [size]atomic.Int64
	var newsErr atomic.Value
	stop := d.Watch(func(peer int, addr string) {
		g := int64(generation(addr))
		if old := heard[peer].Load(); g <= old {
			newsErr.CompareAndSwap(nil, fmt.Sprintf("peer %d: news of gen %d after gen %d", peer, g, old))
		}
		heard[peer].Store(g)
	})
	defer stop()
	var gens [size]atomic.Int64
	var revs sync.Map // gen-revision samples
	var pubMu sync.Mutex
	publish := func(p int) {
		pubMu.Lock()
		defer pubMu.Unlock()
		g := gens[p].Add(1)
		if err := pub.Publish(p, fmt.Sprintf("127.0.%d.%d:7000", g, p+1)); err != nil {
			t.Error(err)
		}
		resp, err := tc.Get(request(t), "x")
		if err == nil {
			revs.Store(resp.Header.Revision, true)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var bad atomic.Value
	for a := range askers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := uint64(a)
			for i := 0; ctx.Err() == nil; i++ {
				r = r*6364136223846793005 + 1442695040888963407
				p := int(r>>33) % size
				before := heard[p].Load()
				var addr string
				var err error
				switch (r >> 20) % 4 {
				case 0, 1:
					addr, err = d.Lookup(p)
					if err == nil && int64(generation(addr)) < before {
						bad.CompareAndSwap(nil, fmt.Sprintf("Lookup(%d) = %s (gen %d) after the watchers heard of gen %d", p, addr, generation(addr), before))
					}
				case 2:
					rctx, rcancel := context.WithTimeout(ctx, time.Duration(r>>40%300)*time.Millisecond)
					_, err = d.Resolve(rctx, p)
					rcancel()
				case 3:
					if a, err := d.Lookup(p); err == nil && int64(generation(a)) < gens[p].Load() {
						d.Unreachable(p, a)
					}
				}
				if err != nil && !errors.Is(err, directory.ErrNotPublished) {
					bad.CompareAndSwap(nil, fmt.Sprintf("peer %d: %v", p, err))
				}
			}
		}()
	}
	wg.Add(2)
	go func() { // publisher: late and restarting peers
		defer wg.Done()
		r := uint64(99)
		for ctx.Err() == nil {
			r = r*6364136223846793005 + 1442695040888963407
			publish(int(r>>33) % size)
			time.Sleep(time.Duration(r>>50%30) * time.Millisecond)
		}
	}()
	go func() { // Prefetch at old and new revisions
		defer wg.Done()
		for ctx.Err() == nil {
			var rev int64
			revs.Range(func(k, _ any) bool { rev = k.(int64); return coin() })
			_ = d.Prefetch(ctx, rev)
			_ = d.Prefetch(ctx, 0)
		}
	}()
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Error(v)
	}
	if v := newsErr.Load(); v != nil {
		t.Error(v)
	}
	if c := d.Counters().Cached; c > maxEntries {
		t.Errorf("Cached = %d > MaxEntries %d", c, maxEntries)
	}
	// Converge, as a transport does.
	for p := range size {
		want := gens[p].Load()
		if want == 0 {
			continue
		}
		for i := 0; ; i++ {
			addr, err := d.Resolve(request(t), p)
			if err == nil && int64(generation(addr)) == want {
				break
			}
			if i > 1000 {
				t.Fatalf("Resolve(%d) does not converge to gen %d: %q, %v", p, want, addr, err)
			}
			if err == nil {
				d.Unreachable(p, addr)
			}
		}
	}
	d.Close()
	pub.Close()
	noGoroutines(t, "after Close", "etcddir.(*Directory)")
}

var coinFlips atomic.Uint64

func coin() bool { return coinFlips.Add(0x9E3779B97F4A7C15)>>63 == 0 }

// Lookup's background fetch: "bounded by Timeout (its wait for a peer
// that has not published included)". Many Lookups of unpublished peers:
// one fetch at a time per peer, and the waits end after Timeout.
func TestLookupBackgroundWaitsEndAfterTimeout(t *testing.T) {
	s := server(t)
	d, err := etcddir.Open(context.Background(), etcddir.Options{Client: client(t, s.URL()), Prefix: "/test/" + t.Name() + "/", Size: 8, Mode: etcddir.OnDemand, TTL: time.Hour, Timeout: time.Second, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := d.Lookup(i % 8); !errors.Is(err, directory.ErrNotPublished) {
					t.Errorf("Lookup(%d): %v", i%8, err)
				}
			}
		}()
	}
	wg.Wait()
	// One fetch per peer holds only while every Lookup came within
	// Timeout of the first: a slower machine starts a second one.
	within := time.Since(start) < time.Second
	eventually(t, "the 8 background waits are abandoned after Timeout", func() bool { return d.Counters().Abandoned >= 8 })
	noGoroutines(t, "Timeout after the Lookups", "etcddir.(*Directory).waitPublished")
	c := d.Counters()
	t.Logf("fetches %d, watches %d, abandoned %d", c.Fetches, c.Watches, c.Abandoned)
	if within && (c.Fetches != 8 || c.Abandoned != 8) {
		t.Errorf("Fetches = %d, Abandoned %d for 8 peers asked at once; want one each", c.Fetches, c.Abandoned)
	}
}

// "However many goroutines ask for one peer at once, etcd sees one fetch
// (and, for a peer that has not published, one watch), and its reply
// answers them all."
func TestManyResolvesOneFetchOneWatch(t *testing.T) {
	s := server(t)
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	c := client(t, s.URL())
	cw := newCountingWatcher(c.Watcher)
	c.Watcher = cw
	d := open(t, c, func(o *etcddir.Options) { o.Mode, o.MaxEntries = etcddir.OnDemand, 1 })
	const n = 100
	res := make(chan string, n)
	for range n {
		go func() {
			a, err := d.Resolve(request(t), 1)
			if err != nil {
				a = err.Error()
			}
			res <- a
		}()
	}
	eventually(t, "all ask", func() bool { return d.Counters().Resolves == n && cw.watchesOf(key) == 1 })
	pub := open(t, client(t, s.URL()), onDemand)
	if err := pub.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	for range n {
		if a := <-res; a != "127.0.0.1:7001" {
			t.Errorf("Resolve(1) = %s", a)
		}
	}
	if f, w := d.Counters().Fetches, cw.watchesOf(key); f != 1 || w != 1 {
		t.Errorf("fetches %d, watches of the key %d; want 1 and 1", f, w)
	}
}

// A wait for a peer whose key is deleted (passed over), garbled (an error
// that says so, from Resolve and Lookup), then corrected; and a key of the
// old format appearing while a peer is waited for.
func TestWaitThroughDeleteGarbleAndOldFormat(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	d := open(t, client(t, s.URL()), onDemand)
	res := make(chan error, 1)
	go func() { _, err := d.Resolve(request(t), 1); res <- err }()
	eventually(t, "the wait runs", func() bool { return len(etcddirGoroutines("etcddir.(*Directory).waitPublished")) == 1 })
	if _, err := tc.Put(request(t), key+"x", "junk"); err != nil { // another key, not the peer's
		t.Fatal(err)
	}
	if _, err := tc.Delete(request(t), key); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.Put(request(t), key, "epcache-life=99999 1.2.3.4:5"); err != nil {
		t.Fatal(err)
	}
	err := <-res
	if err == nil || errors.Is(err, directory.ErrNotPublished) || !strings.Contains(err.Error(), "peer 1") {
		t.Fatalf("Resolve(1) of a garbled value written while it waits: %v; want an error naming the peer", err)
	}
	if _, lerr := d.Lookup(1); lerr == nil || lerr.Error() != err.Error() {
		t.Errorf("Lookup(1) = %v; want Resolve's %v", lerr, err)
	}
	if _, err := tc.Put(request(t), key, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Lookup(1) finds the corrected value", lookupIs(d, 1, "127.0.0.1:7001"))

	go func() { _, err := d.Resolve(request(t), 2); res <- err }()
	eventually(t, "the wait for 2 runs", func() bool { return len(etcddirGoroutines("etcddir.(*Directory).waitPublished")) == 1 })
	if _, err := tc.Put(request(t), prefix+"2", "127.0.0.1:9002"); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err == nil || !strings.Contains(err.Error(), "old key format") {
		t.Fatalf("Resolve(2) when a key of the old format appears: %v; want the old-format error", err)
	}
	if _, err := d.Lookup(2); err == nil || !strings.Contains(err.Error(), "old key format") {
		t.Errorf("Lookup(2) = %v; want the old-format error", err)
	}
}

// Bad Options are refused; odd but valid ones work.
func TestOptions(t *testing.T) {
	s := server(t)
	c := client(t, s.URL())
	base := etcddir.Options{Client: c, Prefix: "/p/", Size: 2}
	for name, f := range map[string]func(*etcddir.Options){
		"TTL<0":         func(o *etcddir.Options) { o.TTL = -time.Second },
		"TTL=0.5s":      func(o *etcddir.Options) { o.TTL = 500 * time.Millisecond },
		"Timeout<0":     func(o *etcddir.Options) { o.Timeout = -1 },
		"PageSize<0":    func(o *etcddir.Options) { o.PageSize = -1 },
		"MaxEntries<0":  func(o *etcddir.Options) { o.Mode, o.MaxEntries = etcddir.OnDemand, -1 },
		"IdleTimeout<0": func(o *etcddir.Options) { o.Mode, o.IdleTimeout = etcddir.OnDemand, -1 },
		"Mirror+MaxEnt": func(o *etcddir.Options) { o.MaxEntries = 1 },
		"Mirror+Idle":   func(o *etcddir.Options) { o.IdleTimeout = time.Second },
		"Mode=7":        func(o *etcddir.Options) { o.Mode = 7 },
		"Size<0":        func(o *etcddir.Options) { o.Size = -1 },
		"Size>MaxSize":  func(o *etcddir.Options) { o.Size = directory.MaxSize + 1 },
		"Mode=-1":       func(o *etcddir.Options) { o.Mode = -1 },
	} {
		o := base
		f(&o)
		if d, err := etcddir.Open(context.Background(), o); err == nil {
			d.Close()
			t.Errorf("%s: Open succeeded", name)
		}
	}
	for _, mode := range []etcddir.Mode{etcddir.Mirror, etcddir.OnDemand} {
		o := base
		o.Mode, o.TTL, o.PageSize, o.Prefix = mode, 1500*time.Millisecond, 1, "/p/"+mode.String()+"/"
		if mode == etcddir.OnDemand {
			o.IdleTimeout, o.MaxEntries = time.Nanosecond, 1
		}
		d, err := etcddir.Open(context.Background(), o)
		if err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if err := d.Publish(0, "127.0.0.1:1"); err != nil {
			t.Fatal(err)
		}
		if got, err := d.Resolve(request(t), 0); err != nil || got != "127.0.0.1:1" {
			t.Errorf("%v: Resolve(0) = %q, %v", mode, got, err)
		}
		if err := d.Prefetch(request(t), 0); err != nil {
			t.Error(err)
		}
		d.Close()
	}
}

// OnDemand's Open reads the old format's keys page by page; a compaction
// between pages makes it read again, and each old key counts once.
func TestOnDemandOpenThroughACompactionBetweenPages(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	for p := range 3 {
		if _, err := tc.Put(request(t), fmt.Sprintf("%s%d", prefix, p), "127.0.0.1:1"); err != nil {
			t.Fatal(err)
		}
	}
	c := client(t, s.URL())
	var compacted bool
	c.KV = &compactAfterFirstPage{KV: c.KV, prefix: prefix, compact: func() {
		resp, err := tc.Put(request(t), "/other", "x")
		if err == nil {
			_, err = tc.Compact(request(t), resp.Header.Revision, clientv3.WithCompactPhysical())
		}
		compacted = err == nil
	}}
	d, err := etcddir.Open(context.Background(), etcddir.Options{Client: c, Prefix: prefix, Size: 4, Mode: etcddir.OnDemand, PageSize: 1, TTL: time.Hour, Timeout: patience})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !compacted {
		t.Fatal("no compaction")
	}
	if m := d.Malformed(); m != 3 {
		t.Errorf("Malformed = %d; want 3", m)
	}
	for p := range 3 {
		if _, err := d.Resolve(request(t), p); err == nil || !strings.Contains(err.Error(), "old key format") {
			t.Errorf("Resolve(%d) = %v", p, err)
		}
	}
}

// Unreachable, then a restart on the same address: a new life is news,
// and Lookup answers it.
func TestRestartOnTheSameAddressAfterUnreachable(t *testing.T) {
	s := server(t)
	d := open(t, client(t, s.URL()), onDemand)
	h := listen(t, d)
	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	h.expect(t, "1=127.0.0.1:7001")
	d.Unreachable(1, "127.0.0.1:7001")
	p0.Close()
	p1 := open(t, client(t, s.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "1=127.0.0.1:7001")
	if got, err := d.Lookup(1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Lookup(1) = %q, %v", got, err)
	}
}

// lateRead answers the n-th single-key read of key with what etcd held
// when it was made, but only once release is closed: a read that crossed
// a newer write on its way back.
type lateRead struct {
	clientv3.KV
	key     string
	n       int32
	reads   atomic.Int32
	held    chan struct{}
	release chan struct{}
}

func (k *lateRead) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if key == k.key && len(clientv3.OpGet(key, opts...).RangeBytes()) == 0 && k.reads.Add(1) == k.n {
		close(k.held)
		<-k.release
	}
	return resp, err
}

// Unreachable: the watch it starts finds the newer life, which "replaces
// in the address cache any older life held ..., and then the watchers
// are told of it: from the moment they are, Lookup and Resolve answer
// it"; "an older life never replaces a newer one". A Resolve with a
// context that never ends (context.Background(), whose fetch runs on the
// caller's goroutine and which Offer cannot answer) reads the older life
// while the newer is published; the revival's Offer fails, it keeps
// nothing, tells the watchers of the newer life, and then the fetch
// stores the older one: Lookup answers the older life from then on.
func TestRevivalAnswersAFetchInFlightOfAnOlderLife(t *testing.T) {
	s := server(t)
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	c := client(t, s.URL())
	cw := newCountingWatcher(c.Watcher)
	c.Watcher = cw
	k := &lateRead{KV: c.KV, key: key, n: 3, held: make(chan struct{}), release: make(chan struct{})}
	c.KV = k
	d := open(t, c, onDemand)
	h := listen(t, d)
	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" { // read 1
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	h.expect(t, "1=127.0.0.1:7001")
	d.Unreachable(1, "127.0.0.1:7001") // read 2: the revival's; then its watch
	eventually(t, "the revival watches the key", func() bool { return cw.watchesOf(key) == 1 })
	res := make(chan string, 1)
	go func() { // read 3: the old life, answered late
		a, err := d.Resolve(context.Background(), 1)
		res <- fmt.Sprint(a, " ", err)
	}()
	waitFor(t, "the Resolve's read is made", k.held)
	p1 := open(t, client(t, s.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	heard := false
	select {
	case n := <-h.ch:
		heard = n == "1=127.0.0.1:7101"
		t.Logf("the watcher heard %s while the older read was held", n)
	case <-time.After(2 * time.Second): // a log only: either way is right
		t.Log("the watcher heard nothing in 2s while the older read was held (the revival waits for it)")
	}
	close(k.release)
	t.Logf("Resolve(context.Background()) = %s", <-res)
	for !heard {
		heard = h.next(t) == "1=127.0.0.1:7101"
	}
	if got, err := d.Lookup(1); err != nil || got != "127.0.0.1:7101" {
		t.Fatalf("Lookup(1) once the watchers were told of the newer life = %q, %v; want 127.0.0.1:7101", got, err)
	}
}

// Prefetch: "each address read goes into the address cache unless the
// cache holds that life of the peer or a newer one ... The watchers hear
// of each life newer than any they heard of, after the cache took it (or
// had no room for it)". A first Resolve of the peer, with a context that
// never ends, has read the older life; Prefetch reads the newer one,
// whose Offer cannot answer that fetch: the cache keeps nothing, the
// watchers hear of the newer life, and the fetch then stores the older.
func TestPrefetchOfANewerLifeAnswersAFetchInFlight(t *testing.T) {
	s := server(t)
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	c := client(t, s.URL())
	k := &lateRead{KV: c.KV, key: key, n: 1, held: make(chan struct{}), release: make(chan struct{})}
	c.KV = k
	d := open(t, c, onDemand)
	h := listen(t, d)
	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	res := make(chan string, 1)
	go func() {
		a, err := d.Resolve(context.Background(), 1)
		res <- fmt.Sprint(a, " ", err)
	}()
	waitFor(t, "the Resolve's read is made", k.held)
	p1 := open(t, client(t, s.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	pre := make(chan error, 1)
	go func() { pre <- d.Prefetch(request(t), 0) }()
	preDone := false
	select {
	case err := <-pre:
		preDone = true
		t.Logf("Prefetch returned %v while the older read was held", err)
	case <-time.After(2 * time.Second): // a log only: either way is right
		t.Log("Prefetch waits for the fetch in flight")
	}
	heard := false
	select {
	case n := <-h.ch:
		heard = n == "1=127.0.0.1:7101"
		t.Logf("the watcher heard %s while the older read was held", n)
	case <-time.After(2 * time.Second): // a log only: either way is right
		t.Log("the watcher heard nothing while the older read was held")
	}
	close(k.release)
	t.Logf("Resolve(context.Background()) = %s", <-res)
	if !preDone {
		<-pre
	}
	for !heard {
		heard = h.next(t) == "1=127.0.0.1:7101"
	}
	if got, err := d.Lookup(1); err != nil || got != "127.0.0.1:7101" {
		t.Fatalf("Lookup(1) after a Prefetch of the newer life, which the watchers were told of = %q, %v; want 127.0.0.1:7101", got, err)
	}
}

// Prefetch: "With MaxEntries, the cache takes only what it has room for:
// Prefetch never evicts."
func TestPrefetchNeverEvicts(t *testing.T) {
	s := server(t)
	pub := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode = 8, etcddir.OnDemand })
	for p := range 8 {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode, o.MaxEntries, o.PageSize = 8, etcddir.OnDemand, 2, 1 })
	for _, p := range []int{5, 6} {
		if _, err := d.Resolve(request(t), p); err != nil {
			t.Fatal(err)
		}
	}
	f := d.Counters().Fetches
	if err := d.Prefetch(request(t), 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{5, 6} {
		if got, err := d.Lookup(p); err != nil || got != fmt.Sprintf("127.0.0.1:%d", 7000+p) {
			t.Errorf("Lookup(%d) after Prefetch = %q, %v; want it still held", p, got, err)
		}
	}
	if c := d.Counters(); c.Fetches != f || c.Cached != 2 {
		t.Errorf("fetches %d→%d, cached %d", f, c.Fetches, c.Cached)
	}
}

// Close racing everything: Resolves (waiting and not), Lookups,
// Unreachable, Prefetch, Watch, in both modes; every call returns, and
// nothing of the directory's runs on after Close.
func TestCloseRacingEverything(t *testing.T) {
	forModes(t, func(t *testing.T, mode etcddir.Mode) {
		s := server(t)
		const size = 16
		pub := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode = size, etcddir.OnDemand })
		for p := range size / 2 {
			if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
				t.Fatal(err)
			}
		}
		for round := range 6 {
			d, err := etcddir.Open(context.Background(), etcddir.Options{Client: client(t, s.URL()), Prefix: "/test/" + t.Name() + "/", Size: size, Mode: mode, TTL: time.Hour, Timeout: patience, PageSize: 3,
				MaxEntries: map[etcddir.Mode]int{etcddir.OnDemand: 3}[mode]})
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var calls atomic.Int64
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := uint64(g*7919 + round)
					for i := 0; i < 200; i++ {
						r = r*6364136223846793005 + 1442695040888963407
						p := int(r>>33) % size
						switch r >> 60 % 5 {
						case 0:
							ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r>>40%50)*time.Millisecond)
							d.Resolve(ctx, p)
							cancel()
						case 1:
							d.Resolve(context.Background(), p%(size/2))
						case 2:
							if a, err := d.Lookup(p); err == nil {
								d.Unreachable(p, a)
							}
						case 3:
							d.Prefetch(context.Background(), 0)
						case 4:
							stop := d.Watch(func(int, string) {})
							d.Lookup(p)
							stop()
						}
						calls.Add(1)
					}
				}()
			}
			// Waiting Resolves of unpublished peers, to be ended by Close.
			errs := make(chan error, 4)
			for p := size - 4; p < size; p++ {
				go func() { _, err := d.Resolve(context.Background(), p); errs <- err }()
			}
			eventually(t, "some calls", func() bool { return calls.Load() > int64(50*round) })
			d.Close()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(patience):
				t.Fatal("calls overlapping Close did not return")
			}
			for range 4 {
				if err := <-errs; err == nil {
					t.Error("a Resolve waiting at Close succeeded")
				}
			}
		}
		pub.Close()
		noGoroutines(t, "after Close", "etcddir.(*Directory)")
	})
}

// MaxEntries 1, more unpublished peers waited for than room, Lookup-only
// askers of published peers, late publishers: "lookups of published peers
// never wait behind it"; every Resolve gets its peer once it publishes.
func TestMaxEntriesOneWithManyLatePublishers(t *testing.T) {
	const size = 12
	s := server(t)
	pub := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode = size, etcddir.OnDemand })
	for p := range 3 {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode, o.MaxEntries = size, etcddir.OnDemand, 1 })
	type result struct {
		peer int
		addr string
		err  error
	}
	waits := make(chan result, 3*(size-3))
	for p := 3; p < size; p++ {
		for range 3 {
			go func() {
				a, err := d.Resolve(context.Background(), p)
				waits <- result{p, a, err}
			}()
		}
	}
	eventually(t, "the waits run", func() bool { return len(etcddirGoroutines("etcddir.(*Directory).waitPublished")) == size-3 })
	for p := range 3 {
		eventually(t, fmt.Sprintf("Lookup(%d) of a published peer", p), lookupIs(d, p, fmt.Sprintf("127.0.0.1:%d", 7000+p)))
		if got, err := d.Resolve(request(t), p); err != nil || got != fmt.Sprintf("127.0.0.1:%d", 7000+p) {
			t.Fatalf("Resolve(%d) = %q, %v", p, got, err)
		}
	}
	for p := size - 1; p >= 3; p-- {
		if _, err := d.Lookup(p); !errors.Is(err, directory.ErrNotPublished) {
			t.Errorf("Lookup(%d) of a waited peer: %v", p, err)
		}
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 * (size - 3) {
		r := <-waits
		if want := fmt.Sprintf("127.0.0.1:%d", 7000+r.peer); r.err != nil || r.addr != want {
			t.Errorf("Resolve(%d) = %q, %v; want %s", r.peer, r.addr, r.err, want)
		}
	}
	for p := range size {
		eventually(t, fmt.Sprintf("Lookup(%d)", p), lookupIs(d, p, fmt.Sprintf("127.0.0.1:%d", 7000+p)))
	}
	if c := d.Counters().Cached; c > 1 {
		t.Errorf("Cached = %d", c)
	}
}

// etcd going away while Unreachable's watch and a Resolve's wait run:
// "the watches resume where they stopped ..., a Resolve waiting for a
// peer goes on waiting". Once etcd is back, the restart of the peer
// reported unreachable is news, and the waiting Resolve gets its peer.
func TestRevivalAndWaitThroughAnEtcdRestart(t *testing.T) {
	s, err := etcdtest.Start("")
	if err != nil {
		t.Fatal(err)
	}
	cur := s
	t.Cleanup(func() { cur.Close() }) // after the directories' Close (cleanups run last-in first-out)
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Mode, o.Timeout = etcddir.OnDemand, 2*time.Second })
	h := listen(t, d)
	pc := client(t, s.URL())
	p0 := open(t, pc, onDemand)
	if err := p0.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	h.expect(t, "1=127.0.0.1:7001")
	d.Unreachable(1, "127.0.0.1:7001")
	res := make(chan string, 1)
	go func() { a, err := d.Resolve(context.Background(), 2); res <- fmt.Sprint(a, " ", err) }()
	eventually(t, "the wait and the revival run", func() bool {
		return len(etcddirGoroutines("etcddir.(*Directory).waitPublished")) == 1 && len(etcddirGoroutines("etcddir.(*Directory).revive")) == 1
	})
	s.Stop()
	time.Sleep(3 * time.Second) // more than Timeout: requests fail meanwhile
	cur, err = s.Restart()
	if err != nil {
		t.Fatal(err)
	}
	p1 := open(t, client(t, cur.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	if err := p1.Publish(2, "127.0.0.1:7102"); err != nil {
		t.Fatal(err)
	}
	for want := map[string]bool{"1=127.0.0.1:7101": true, "2=127.0.0.1:7102": true}; len(want) > 0; {
		n := h.next(t)
		if !want[n] {
			t.Fatalf("the watcher heard %s", n)
		}
		delete(want, n)
	}
	if r := <-res; r != "127.0.0.1:7102 <nil>" {
		t.Errorf("Resolve(2) = %s", r)
	}
}

// As a transport does: the watcher hears of the new life found by
// Unreachable's watch, dials it, fails, and reports it unreachable from
// its callback, while that watch may not have ended yet.
func TestUnreachableFromTheWatcherOfTheRevival(t *testing.T) {
	s := server(t)
	d := open(t, client(t, s.URL()), onDemand)
	news := make(chan string, 16)
	stop := d.Watch(func(peer int, addr string) {
		news <- addr
		if addr == "127.0.0.1:7001" {
			d.Unreachable(peer, addr) // L1 is dead at once
		}
	})
	defer stop()
	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7000"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7000" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	<-news
	d.Unreachable(1, "127.0.0.1:7000")
	p1 := open(t, client(t, s.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	if n := <-news; n != "127.0.0.1:7001" {
		t.Fatalf("heard %s", n)
	}
	p2 := open(t, client(t, s.URL()), onDemand)
	if err := p2.Publish(1, "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-news:
		if n != "127.0.0.1:7002" {
			t.Fatalf("heard %s", n)
		}
	case <-time.After(20 * time.Second):
		a, err := d.Lookup(1)
		t.Fatalf("L2 not news within 20s after the watcher reported L1 from its callback; Lookup(1) = %q, %v", a, err)
	}
}

// gateEveryWatch holds the responses of every watch of key until open is
// closed; started is closed when the first such watch begins.
type gateEveryWatch struct {
	clientv3.Watcher
	key     string
	open    chan struct{}
	started chan struct{}
	once    sync.Once
}

func (w *gateEveryWatch) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	if key != w.key {
		return in
	}
	w.once.Do(func() { close(w.started) })
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

// Unreachable: "it watches peer's key for a life newer than the one
// reported, which, as soon as it appears, replaces in the address cache
// any older life held ... and then the watchers are told of it: from the
// moment they are, Lookup and Resolve answer it."
//
// A revival watch for an older report (life L0) still runs when the life
// that replaced it (L1) is reported unreachable too: no new watch starts,
// and the old one, when it sees L1, puts the reported-dead L1 back into
// the cache and ends. The next life (L2) is then followed by nobody.
func TestASecondUnreachableWhileAnOlderRevivalRunsFollowsTheNextLife(t *testing.T) {
	s := server(t)
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	c := client(t, s.URL())
	gw := &gateEveryWatch{Watcher: c.Watcher, key: key, open: make(chan struct{}), started: make(chan struct{})}
	c.Watcher = gw
	d := open(t, c, onDemand)
	h := listen(t, d)

	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7000"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7000" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	h.expect(t, "1=127.0.0.1:7000")
	d.Unreachable(1, "127.0.0.1:7000")
	waitFor(t, "the revival watch of life L0 starts", gw.started)

	p1 := open(t, client(t, s.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) after Unreachable of L0 and a restart = %q, %v; want L1", got, err)
	}
	h.expect(t, "1=127.0.0.1:7001")
	d.Unreachable(1, "127.0.0.1:7001") // L1 is dead too
	close(gw.open)                     // the L0 revival now sees L1's put

	p2 := open(t, client(t, s.URL()), onDemand)
	if err := p2.Publish(1, "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	// "as soon as it appears": the limit is generous, the expected delay ms.
	select {
	case n := <-h.ch:
		if n != "1=127.0.0.1:7002" {
			t.Fatalf("the watcher heard %q; want 1=127.0.0.1:7002", n)
		}
	case <-time.After(20 * time.Second):
		got, err := d.Lookup(1)
		t.Fatalf("after Unreachable(1, L1) and a new life L2, the watcher heard nothing in 20s; Lookup(1) = %q, %v (L1 is the address reported unreachable)", got, err)
	}
	if got, err := d.Lookup(1); err != nil || got != "127.0.0.1:7002" {
		t.Fatalf("Lookup(1) once the watcher heard of L2 = %q, %v", got, err)
	}
}

// Prefetch at an old revision (the fence's) after Unreachable reported
// that revision's life: Unreachable says "it drops it ..., so that the
// next Resolve reads the key again, linearizably". The peer's key is gone
// (its lease expired); Prefetch puts the dead address back, and Resolve
// answers it from memory.
func TestPrefetchAtAnOlderRevisionLeavesAReportedDeadLifeOut(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	fence := modRevision(t, tc, key)
	d := open(t, client(t, s.URL()), onDemand)
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	p0.Close() // the process died: its key is gone
	if got := stored(t, tc, key); got != "(absent)" {
		t.Fatalf("key holds %q", got)
	}
	d.Unreachable(1, "127.0.0.1:7001")
	if got, err := d.Lookup(1); err == nil {
		t.Fatalf("Lookup(1) right after Unreachable = %q; want no address", got)
	}
	if err := d.Prefetch(request(t), fence); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Lookup(1); err == nil {
		t.Errorf("Lookup(1) after Unreachable of its only life (key deleted) and a Prefetch at an older revision = %q, nil; want no address", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if got, err := d.Resolve(ctx, 1); err == nil {
		t.Errorf("Resolve(1) (key deleted, its life reported unreachable) = %q, nil; want a wait for a new life (here, the context's end)", got)
	}
}

// holdFirstRead holds the reads of key (single-key reads only) until release,
// then makes them even if their context ended meanwhile.
type holdFirstRead struct {
	clientv3.KV
	key     string
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (k *holdFirstRead) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if key == k.key && len(clientv3.OpGet(key, opts...).RangeBytes()) == 0 {
		hold := false
		k.once.Do(func() { hold = true })
		if hold {
			close(k.held)
			<-k.release
			return k.KV.Get(context.WithoutCancel(ctx), key, opts...)
		}
	}
	return k.KV.Get(ctx, key, opts...)
}

// "Each newer life replaces in the address cache the older one it may
// hold before the watchers hear of it, so that Lookup answers what the
// watchers were last told". A fetch in flight is answered by Prefetch's
// Offer of an older life (read at the fence's revision); the fetch then
// reads the newer life and tells the watchers of it, while the newer life
// goes into the cache on a goroutine of its own (keepNewer, spawned):
// a watcher that looks the peer up may find the older life.
func TestWatchersHearOfANewerLifeOnlyOnceTheCacheHoldsIt(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	fence := modRevision(t, tc, key)
	p1 := open(t, client(t, s.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	c := client(t, s.URL())
	k := &holdFirstRead{KV: c.KV, key: key, held: make(chan struct{}), release: make(chan struct{})}
	c.KV = k
	d := open(t, c, onDemand)
	type seen struct{ news, lookup string }
	got := make(chan seen, 8)
	stop := d.Watch(func(peer int, addr string) {
		a, err := d.Lookup(peer)
		if err != nil {
			a = err.Error()
		}
		got <- seen{addr, a}
	})
	defer stop()
	res := make(chan string, 1)
	go func() {
		a, err := d.Resolve(request(t), 1) // a context that can end: the fetch runs on a goroutine of its own
		res <- fmt.Sprint(a, " ", err)
	}()
	waitFor(t, "the fetch's read is held", k.held)
	if err := d.Prefetch(request(t), fence); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		t.Logf("Resolve answered by Prefetch's Offer: %s", r)
	case <-time.After(patience):
		t.Fatal("Prefetch's Offer did not answer the fetch in flight")
	}
	close(k.release)
	for {
		select {
		case sn := <-got:
			t.Logf("watcher heard %s; Lookup then = %s", sn.news, sn.lookup)
			if sn.news == "127.0.0.1:7101" {
				if sn.lookup != "127.0.0.1:7101" {
					t.Fatalf("the watcher was told of the newer life %s, and Lookup then answered %s", sn.news, sn.lookup)
				}
				return
			}
		case <-time.After(patience):
			t.Fatal("the watcher never heard of the newer life")
		}
	}
}

// Lookup "answers what the last fetch of the peer found wrong with its
// value or key format, or, if none did, a NotPublishedError"; a fetch is
// "Resolve, Lookup's background fetch, Prefetch". A garbled value found
// by Resolve, then corrected and read by Prefetch: once the address is
// dropped (Unreachable; MaxEntries or IdleTimeout alike), Lookup answers
// the garbled value's error, which is not a NotPublishedError, though the
// last fetch found the value valid.
func TestLookupForgetsAGarbledValueThatPrefetchFoundCorrected(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	if _, err := tc.Put(request(t), key, "epcache-life=x 127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	d := open(t, client(t, s.URL()), onDemand)
	if _, err := d.Resolve(request(t), 1); err == nil {
		t.Fatal("Resolve(1) of a garbled value succeeded")
	}
	if _, err := tc.Put(request(t), key, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	if err := d.Prefetch(request(t), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Lookup(1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Lookup(1) after Prefetch = %q, %v", got, err)
	}
	d.Unreachable(1, "127.0.0.1:7001")
	if _, err := d.Lookup(1); err != nil && !errors.Is(err, directory.ErrNotPublished) {
		t.Fatalf("Lookup(1) of a dropped address whose last fetch (Prefetch) found it valid: %v; want a NotPublishedError (or the address)", err)
	}
}

// The other half of the promise above: a Prefetch at an older revision,
// which reads the valid value written before the garbled one, leaves the
// garbled value's error for Lookup to answer.
func TestPrefetchAtAnOlderRevisionKeepsANewerGarbledError(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	if _, err := tc.Put(request(t), key, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	fence := modRevision(t, tc, key)
	if _, err := tc.Put(request(t), key, "epcache-life=x 127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	d := open(t, client(t, s.URL()), onDemand)
	_, rerr := d.Resolve(request(t), 1)
	if rerr == nil {
		t.Fatal("Resolve(1) of a garbled value succeeded")
	}
	if err := d.Prefetch(request(t), fence); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Lookup(1); err == nil || err.Error() != rerr.Error() {
		t.Fatalf("Lookup(1) after a Prefetch at the revision before the garbled write = %q, %v; want Resolve's %v", got, err, rerr)
	}
}

// A peer with keys of both formats ("answered with its key of this
// format ... by both calls") is reported unreachable after its process
// died (its v2 key gone, the old format's key left by an older etcddir
// still there), and restarts. Unreachable: "it watches peer's key for a
// life newer than the one reported, which, as soon as it appears,
// replaces in the address cache any older life held ..., and then the
// watchers are told of it". The revival reads the key once, finds only
// the old format's, and ends: the restart is not followed.
func TestUnreachableOfAPeerWithAnOldKeyFollowsItsRestart(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	if _, err := tc.Put(request(t), prefix+"1", "127.0.0.1:9001"); err != nil {
		t.Fatal(err)
	}
	p0 := open(t, client(t, s.URL()), onDemand)
	if err := p0.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	c := client(t, s.URL())
	k := newCountingKV(c.KV)
	c.KV = k
	d := open(t, c, onDemand)
	h := listen(t, d)
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	h.expect(t, "1=127.0.0.1:7001")
	p0.Close() // the process dies: its v2 key goes
	d.Unreachable(1, "127.0.0.1:7001")
	key := etcddir.Key(prefix, 1)
	eventually(t, "the revival reads the key while it is absent", func() bool { return len(k.readsOf(key)) >= 2 })
	p1 := open(t, client(t, s.URL()), onDemand)
	if err := p1.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-h.ch:
		if n != "1=127.0.0.1:7101" {
			t.Fatalf("the watcher heard %s", n)
		}
	case <-time.After(20 * time.Second):
		_, err := d.Lookup(1)
		t.Fatalf("the restart of a peer reported unreachable was not news within 20s (Lookup(1) then: %v)", err)
	}
}

// Watch's f calls runtime.Goexit (t.FailNow in a test's watcher, say) on
// its first call: the doc forbids only stop and Close in f. The
// directory goes on: a later publication is found by Lookup and Resolve,
// and the other watchers hear of it.
func TestAWatcherThatCallsGoexitStopsNothingElse(t *testing.T) {
	forModes(t, func(t *testing.T, mode etcddir.Mode) {
		s := server(t)
		pub := open(t, client(t, s.URL()), onDemand)
		d := open(t, client(t, s.URL()), inMode(mode))
		var once sync.Once
		var called atomic.Bool
		stop := d.Watch(func(peer int, addr string) {
			called.Store(true)
			once.Do(runtime.Goexit)
		})
		defer stop()
		if err := pub.Publish(1, "127.0.0.1:7001"); err != nil {
			t.Fatal(err)
		}
		if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
			t.Fatalf("Resolve(1) = %q, %v", got, err)
		}
		eventually(t, "the watcher is called", called.Load)
		h := listen(t, d)
		if err := pub.Publish(2, "127.0.0.1:7002"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if got, err := d.Resolve(ctx, 2); err != nil || got != "127.0.0.1:7002" {
			t.Fatalf("Resolve(2) after a watcher called Goexit = %q, %v", got, err)
		}
		select {
		case n := <-h.ch:
			if n != "2=127.0.0.1:7002" {
				t.Fatalf("the other watcher heard %s", n)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the other watcher heard nothing of peer 2 in 20s after a watcher called Goexit")
		}
	})
}

// Close: "Close stops the directory's watches and fetches". Prefetch
// overlapping Close goes on reading etcd, and after Close it reads every
// page and reports success.
func TestPrefetchOverlappingOrAfterCloseFails(t *testing.T) {
	s := server(t)
	prefix := "/test/" + t.Name() + "/"
	pub := open(t, client(t, s.URL()), onDemand)
	for p := range 4 {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	c := client(t, s.URL())
	k := newCountingKV(c.KV)
	var ranges atomic.Int32
	held := make(chan struct{})
	k.hold = func(key string) bool {
		if !strings.HasPrefix(key, prefix+"v2/") {
			return false
		}
		if ranges.Add(1) == 2 {
			close(held)
			return true
		}
		return false
	}
	c.KV = k
	d := open(t, c, func(o *etcddir.Options) { o.Mode, o.PageSize, o.Prefix = etcddir.OnDemand, 1, prefix })
	done := make(chan error, 1)
	go func() { done <- d.Prefetch(context.Background(), 0) }()
	waitFor(t, "Prefetch reads its second page", held)
	d.Close()
	before := d.Counters().Ranges
	close(k.release)
	var err error
	select {
	case err = <-done:
	case <-time.After(patience):
		t.Fatal("Prefetch overlapping Close did not return")
	}
	after := d.Counters().Ranges
	t.Logf("Prefetch overlapping Close: %v; ranges after Close returned: %d", err, after-before)
	if err == nil || !strings.Contains(err.Error(), "directory closed") || after > before {
		t.Errorf("Prefetch overlapping Close returned %v and made %d range requests after Close returned; want it stopped by Close with an error", err, after-before)
	}
	before = d.Counters().Ranges
	err = d.Prefetch(context.Background(), 0)
	after = d.Counters().Ranges
	if err == nil || !strings.Contains(err.Error(), "directory closed") || after > before {
		t.Errorf("Prefetch after Close = %v, made %d range requests; want an error and no request", err, after-before)
	}
}
