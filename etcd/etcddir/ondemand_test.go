package etcddir_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/etcd/etcdtest"
	"github.com/epcache/epcache/transport/directory"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func onDemand(o *etcddir.Options) { o.Mode = etcddir.OnDemand }

// An OnDemand process fetches a peer when it first asks for it, and
// answers Lookup from what it fetched, without a round trip.
func TestResolveFetchesOnDemand(t *testing.T) {
	s := server(t)
	a := open(t, client(t, s.URL()), nil)
	b := open(t, client(t, s.URL()), onDemand)
	if err := a.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	got, err := b.Resolve(request(t), 1)
	if err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) = %q, %v; want a's address", got, err)
	}
	if got, err := b.Lookup(1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Lookup(1) after Resolve = %q, %v; want the address Resolve fetched", got, err)
	}
	if _, err := b.Resolve(request(t), 4); !errors.Is(err, directory.ErrUnknownPeer) {
		t.Fatalf("Resolve(4) of 4 peers: %v; want ErrUnknownPeer", err)
	}
	before := b.Counters()
	for range 10 {
		if _, err := b.Resolve(request(t), 1); err != nil {
			t.Fatal(err)
		}
	}
	if after := b.Counters(); after.Requests() != before.Requests() || after.Fetches != 1 {
		t.Fatalf("Resolve of a peer held: %d requests more, %d fetches in all; want none more, 1 fetch", after.Requests()-before.Requests(), after.Fetches)
	}
	// A Lookup of a peer not fetched says "not yet" and fetches it in the
	// background, for a transport that only calls Lookup and retries.
	if err := a.Publish(2, "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lookup(2); !errors.Is(err, directory.ErrNotPublished) {
		t.Fatalf("Lookup(2), never fetched: %v; want not published", err)
	}
	eventually(t, "Lookup finds what its background fetch found", lookupIs(b, 2, "127.0.0.1:7002"))
	t.Logf("b's counters: %+v", b.Counters())
}

// However many goroutines of however many layers of one process ask for
// one peer at once, etcd sees one request for it, and its reply answers
// them all: 64 goroutines in each of two layers (one calls Resolve, the
// other Lookup and then Resolve, as a transport checking its directory
// first) ask for each of four peers while etcd's answer is held back.
// Then the same for a peer that has not published yet: one read and one
// watch of its key, whatever the number of askers.
func TestResolveCoalescesAcrossLayers(t *testing.T) {
	const peers, perLayer = 4, 64
	s := server(t)
	prefix := "/test/" + t.Name() + "/"
	pub := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size = 8 })
	for p := range peers {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	c := client(t, s.URL())
	kv := newCountingKV(c.KV)
	kv.hold = func(key string) bool { return strings.HasPrefix(key, prefix+"v2/") }
	w := newCountingWatcher(c.Watcher)
	c.KV, c.Watcher = kv, w
	d := open(t, c, func(o *etcddir.Options) { o.Size, o.Mode = 8, etcddir.OnDemand })

	layers := []func(ctx context.Context, peer int) (string, error){
		d.Resolve,
		func(ctx context.Context, peer int) (string, error) {
			if addr, err := d.Lookup(peer); err == nil {
				return addr, nil
			}
			return d.Resolve(ctx, peer)
		},
	}
	askAll := func(peer int, want string) *sync.WaitGroup {
		var wg sync.WaitGroup
		for _, layer := range layers {
			for range perLayer {
				wg.Go(func() {
					if got, err := layer(request(t), peer); err != nil || got != want {
						t.Errorf("peer %d: %q, %v; want %q", peer, got, err, want)
					}
				})
			}
		}
		return &wg
	}
	var all []*sync.WaitGroup
	for p := range peers {
		all = append(all, askAll(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)))
	}
	eventually(t, "every asker has called Resolve (the second layer's after a Lookup that missed)", func() bool {
		return d.Counters().Resolves >= int64(peers*len(layers)*perLayer)
	})
	close(kv.release)
	for _, wg := range all {
		wg.Wait()
	}
	for p := range peers {
		if reads := kv.readsOf(etcddir.Key(prefix, p)); len(reads) != 1 {
			t.Errorf("peer %d, asked for by %d goroutines at once: %d reads of its key; want 1", p, len(layers)*perLayer, len(reads))
		}
	}
	if got := d.Counters().Fetches; got != peers {
		t.Errorf("Counters().Fetches = %d; want %d, one per peer", got, peers)
	}

	// A peer that has not published: every asker waits on one watch.
	const late = 5
	wg := askAll(late, "127.0.0.1:7005")
	eventually(t, "the fetch of the late peer watches its key", func() bool { return w.watchesOf(etcddir.Key(prefix, late)) == 1 })
	if err := pub.Publish(late, "127.0.0.1:7005"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	key := etcddir.Key(prefix, late)
	if reads, watches := kv.readsOf(key), w.watchesOf(key); len(reads) != 1 || watches != 1 {
		t.Errorf("the late peer, asked for by %d goroutines: %d reads and %d watches of its key; want 1 and 1", len(layers)*perLayer, len(reads), watches)
	}
	if got := d.Counters().Fetches; got != peers+1 {
		t.Errorf("Counters().Fetches = %d; want %d, one per peer", got, peers+1)
	}
	t.Logf("counters: %+v", d.Counters())
}

// A peer that never publishes: Resolve ends with its caller's context,
// with an error that names the peer and wraps both the context's error
// and "not published"; the fetch, which nobody waits for any more, stops.
// The short deadline is the subject, and nothing else waits on it.
func TestResolveOfAPeerThatNeverPublishes(t *testing.T) {
	s := server(t)
	d := open(t, client(t, s.URL()), onDemand)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := d.Resolve(ctx, 2)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, directory.ErrNotPublished) || !strings.Contains(err.Error(), "peer 2") {
		t.Fatalf("Resolve of a peer that never publishes: %v; want an error naming peer 2, wrapping DeadlineExceeded and ErrNotPublished", err)
	}
	t.Log(err)
	eventually(t, "the fetch nobody waits for stops", func() bool { return d.Counters().Abandoned == 1 })
	// And a caller whose context never ends waits until the peer is there.
	done := make(chan error, 1)
	go func() {
		addr, err := d.Resolve(context.Background(), 2)
		if err == nil && addr != "127.0.0.1:7002" {
			err = fmt.Errorf("address %q", addr)
		}
		done <- err
	}()
	eventually(t, "a second fetch waits", func() bool { return d.Counters().Fetches == 2 })
	if err := open(t, client(t, s.URL()), nil).Publish(2, "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// etcd restarted while Resolves wait for a peer: they resume, and the
// peer's address reaches them once it publishes.
func TestResolvesWaitThroughAnEtcdRestart(t *testing.T) {
	s, err := etcdtest.Start("")
	if err != nil {
		t.Fatal(err)
	}
	url := s.URL()
	cd := client(t, url)
	d := open(t, cd, onDemand)
	const askers = 3
	results := make(chan error, askers)
	for range askers {
		go func() {
			addr, err := d.Resolve(request(t), 1)
			if err == nil && addr != "127.0.0.1:7001" {
				err = fmt.Errorf("address %q", addr)
			}
			results <- err
		}()
	}
	// The guard's watch and the fetch's.
	eventually(t, "the fetch watches peer 1's key", func() bool { return d.Counters().Watches >= 2 })
	s.Stop()
	s2, err := s.Restart()
	if err != nil {
		t.Fatal(err)
	}
	cp := client(t, url)
	p := open(t, cp, nil)
	t.Cleanup(func() {
		d.Close()
		p.Close()
		cd.Close()
		cp.Close()
		s2.Close()
	})
	if err := p.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	for range askers {
		if err := <-results; err != nil {
			t.Fatalf("a Resolve waiting through the restart: %v", err)
		}
	}
	t.Logf("counters: %+v", d.Counters())
}

// Unreachable drops the address it names, and only that one: the next
// Resolve reads the key again, linearizably, and the watchers hear of the
// newer life, found by the watch Unreachable starts, even on the same
// address (a restart on a fixed port). A report about an old address
// leaves a newer one alone.
func TestUnreachableFetchesTheNewerLife(t *testing.T) {
	s := server(t)
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	c := client(t, s.URL())
	kv := newCountingKV(c.KV)
	c.KV = kv
	d := open(t, c, onDemand)
	var mu sync.Mutex
	var heard []string
	stop := d.Watch(func(peer int, addr string) {
		mu.Lock()
		heard = append(heard, fmt.Sprintf("%d=%s", peer, addr))
		mu.Unlock()
	})
	defer stop()
	heardOf := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), heard...)
	}

	first := open(t, client(t, s.URL()), nil)
	if err := first.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	if r := kv.readsOf(key); len(r) != 1 || !r[0] {
		t.Fatalf("the first fetch's reads (true: serializable): %v; want one serializable read", r)
	}
	eventually(t, "the watcher hears of the first life", func() bool { return len(heardOf()) == 1 })

	// The peer restarts on the same address: a new life.
	restarted := open(t, client(t, s.URL()), nil)
	if err := restarted.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	d.Unreachable(1, "127.0.0.1:9999") // not the address held: nothing dropped
	if got := d.Counters().Cached; got != 1 {
		t.Fatalf("after a report about an address it does not hold, the directory holds %d addresses; want 1", got)
	}
	d.Unreachable(1, "127.0.0.1:7001")
	eventually(t, "the watcher hears of the new life on the same address", func() bool { return len(heardOf()) == 2 })
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) after Unreachable = %q, %v", got, err)
	}
	if r := kv.readsOf(key); len(r) < 2 || slices.Contains(r[1:], true) {
		t.Fatalf("reads of peer 1's key (true: serializable): %v; want every read after Unreachable linearizable", r)
	}
	if h := heardOf(); h[0] != "1=127.0.0.1:7001" || h[1] != "1=127.0.0.1:7001" {
		t.Fatalf("the watcher heard %q; want peer 1's first life and its restart", h)
	}

	// A newer life on a new address, fetched; then a late report about
	// the old address changes nothing.
	again := open(t, client(t, s.URL()), nil)
	if err := again.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	d.Unreachable(1, "127.0.0.1:7001")
	eventually(t, "the newest life is fetched", func() bool {
		got, err := d.Resolve(request(t), 1)
		return err == nil && got == "127.0.0.1:7101"
	})
	d.Unreachable(1, "127.0.0.1:7001")
	if got, err := d.Lookup(1); err != nil || got != "127.0.0.1:7101" {
		t.Fatalf("after a late report about the old address, Lookup(1) = %q, %v; want the newer address", got, err)
	}
}

// MaxEntries bounds the addresses a process keeps; one dropped is fetched
// again when asked for.
func TestMaxEntriesBoundsTheAddresses(t *testing.T) {
	s := server(t)
	pub := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size = 8 })
	for p := range 8 {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode, o.MaxEntries = 8, etcddir.OnDemand, 2 })
	for p := range 8 {
		if got, err := d.Resolve(request(t), p); err != nil || got != fmt.Sprintf("127.0.0.1:%d", 7000+p) {
			t.Fatalf("Resolve(%d) = %q, %v", p, got, err)
		}
		if c := d.Counters().Cached; c > 2 {
			t.Fatalf("after %d peers, the directory holds %d addresses; want at most MaxEntries, 2", p+1, c)
		}
	}
	if got, err := d.Resolve(request(t), 0); err != nil || got != "127.0.0.1:7000" {
		t.Fatalf("Resolve(0) once dropped = %q, %v", got, err)
	}
	if got := d.Counters().Fetches; got != 9 {
		t.Errorf("Counters().Fetches = %d; want 9: eight peers, and the first again", got)
	}
}

// A job where one process uses the old key format (an etcddir from before
// format v2, simulated by a plain put of its key) fails with an error
// that says so, in either mode, whether the old key came before the
// asking or while it waited.
func TestMixedKeyFormatsFailClearly(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	if _, err := tc.Put(request(t), prefix+"3", "127.0.0.1:7003"); err != nil {
		t.Fatal(err)
	}
	od := open(t, client(t, s.URL()), onDemand)
	mi := open(t, client(t, s.URL()), nil)
	isOld := func(err error) bool {
		return err != nil && !errors.Is(err, directory.ErrNotPublished) && strings.Contains(err.Error(), "old key format")
	}
	for name, d := range map[string]*etcddir.Directory{"ondemand": od, "mirror": mi} {
		if _, err := d.Resolve(request(t), 3); !isOld(err) {
			t.Errorf("%s: Resolve of a peer of the old format: %v; want an error naming the old key format", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
		if _, err := d.Lookup(3); !isOld(err) {
			t.Errorf("%s: Lookup of a peer of the old format: %v", name, err)
		}
		if got := d.Malformed(); got != 1 {
			t.Errorf("%s: Malformed() = %d; want 1", name, got)
		}
	}
	// Peer 2 of the old format publishes while both wait for it.
	errs := make(chan error, 2)
	for _, d := range []*etcddir.Directory{od, mi} {
		go func() { _, err := d.Resolve(request(t), 2); errs <- err }()
	}
	eventually(t, "the OnDemand fetch of peer 2 watches its key", func() bool { return od.Counters().Watches >= 2 })
	if _, err := tc.Put(request(t), prefix+"2", "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; !isOld(err) {
			t.Errorf("Resolve waiting for peer 2 when it published under the old format: %v", err)
		}
	}
}

// A fetch whose watch starts from a revision etcd compacted away reads
// the key again, linearizably, and finds the peer; a garbled value is an
// error at once, not a wait.
func TestResolveThroughACompactionAndAGarbledValue(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	key := etcddir.Key(prefix, 1)
	c := client(t, s.URL())
	kv := newCountingKV(c.KV)
	w := newCountingWatcher(c.Watcher)
	w.hold = func(k string) bool { return k == key }
	c.KV, c.Watcher = kv, w
	d := open(t, c, onDemand)
	done := make(chan error, 1)
	go func() {
		addr, err := d.Resolve(request(t), 1)
		if err == nil && addr != "127.0.0.1:7001" {
			err = fmt.Errorf("address %q", addr)
		}
		done <- err
	}()
	<-w.held // the fetch read the key (absent), and has not watched it yet
	if err := open(t, client(t, s.URL()), nil).Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	// A revision after the publication's, and the history before it gone.
	resp, err := tc.Put(request(t), "/test/"+t.Name()+"-other", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tc.Compact(request(t), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	close(w.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r := kv.readsOf(key); len(r) != 2 || !r[0] || r[1] {
		t.Errorf("reads of the key (true: serializable): %v; want a serializable read, then, after the compaction, a linearizable one", r)
	}

	if _, err := tc.Put(request(t), etcddir.Key(prefix, 2), "epcache-life=x 127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	_, err = d.Resolve(request(t), 2)
	if err == nil || errors.Is(err, directory.ErrNotPublished) || !strings.Contains(err.Error(), "peer 2") {
		t.Fatalf("Resolve of a garbled value: %v; want an error naming peer 2", err)
	}
	t.Log(err)
}

// Open refuses what the modes cannot do.
func TestModeOptions(t *testing.T) {
	s := server(t)
	c := client(t, s.URL())
	for _, o := range []etcddir.Options{
		{Client: c, Prefix: "/p/", Size: 1, Mode: 7},
		{Client: c, Prefix: "/p/", Size: 1, MaxEntries: 5},
		{Client: c, Prefix: "/p/", Size: 1, IdleTimeout: time.Second},
		{Client: c, Prefix: "/p/", Size: 1, Mode: etcddir.OnDemand, MaxEntries: -1},
		{Client: c, Prefix: "/p/", Size: 1, PageSize: -1},
	} {
		if d, err := etcddir.Open(context.Background(), o); err == nil {
			d.Close()
			t.Errorf("Open(%+v) succeeded", o)
		} else {
			t.Log(err)
		}
	}
}

// hearing collects what a directory's watcher hears, in order.
type hearing struct {
	ch chan string
}

func listen(t *testing.T, d *etcddir.Directory) *hearing {
	h := &hearing{ch: make(chan string, 64)}
	stop := d.Watch(func(peer int, addr string) { h.ch <- fmt.Sprintf("%d=%s", peer, addr) })
	t.Cleanup(stop)
	return h
}

// next returns the next news; the limit only detects a hang.
func (h *hearing) next(t *testing.T) string {
	t.Helper()
	select {
	case n := <-h.ch:
		return n
	case <-time.After(patience):
		t.Fatalf("no news within %v", patience)
		return ""
	}
}

func (h *hearing) expect(t *testing.T, want string) {
	t.Helper()
	if got := h.next(t); got != want {
		t.Fatalf("the watcher heard %q; want %q", got, want)
	}
}

// A newer life replaces an older one in OnDemand's address cache,
// whichever way the directory learns of it. After Unreachable, a Resolve
// at once reads the dead process's address again (its lease has not
// expired); the watch Unreachable started then finds the restart, and
// from the moment the watcher hears of it, Lookup and Resolve answer it.
// Prefetch likewise: the newer life it tells the watchers of is the one
// Lookup answers when Prefetch returns.
func TestNewerLifeReplacesTheOlderInTheCache(t *testing.T) {
	s := server(t)
	d := open(t, client(t, s.URL()), onDemand)
	h := listen(t, d)

	dead := open(t, client(t, s.URL()), onDemand)
	if err := dead.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) = %q, %v", got, err)
	}
	h.expect(t, "1=127.0.0.1:7001")
	d.Unreachable(1, "127.0.0.1:7001")
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("Resolve(1) right after Unreachable, the dead process's lease alive = %q, %v; want its address read again", got, err)
	}
	restarted := open(t, client(t, s.URL()), onDemand)
	if err := restarted.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "1=127.0.0.1:7101")
	if got, err := d.Lookup(1); err != nil || got != "127.0.0.1:7101" {
		t.Fatalf("Lookup(1) once the watcher heard of the restart = %q, %v; want the restarted process's address", got, err)
	}
	if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7101" {
		t.Fatalf("Resolve(1) once the watcher heard of the restart = %q, %v; want the restarted process's address", got, err)
	}

	if err := dead.Publish(2, "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Resolve(request(t), 2); err != nil || got != "127.0.0.1:7002" {
		t.Fatalf("Resolve(2) = %q, %v", got, err)
	}
	h.expect(t, "2=127.0.0.1:7002")
	if err := restarted.Publish(2, "127.0.0.1:7102"); err != nil {
		t.Fatal(err)
	}
	if err := d.Prefetch(request(t), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Lookup(2); err != nil || got != "127.0.0.1:7102" {
		t.Fatalf("Lookup(2) after a Prefetch that read a newer life = %q, %v; want the newer life's address", got, err)
	}
	h.expect(t, "2=127.0.0.1:7102")
}

// With MaxEntries, a peer that has not published takes no room while it
// is waited for: Resolve of a published peer answers while Resolves of
// two unpublished ones wait, with room for one address, and so does the
// Lookup of another, through its background fetch.
func TestWaitForAnUnpublishedPeerTakesNoRoom(t *testing.T) {
	s := server(t)
	pub := open(t, client(t, s.URL()), onDemand)
	for _, p := range []int{2, 3} {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Mode, o.MaxEntries = etcddir.OnDemand, 1 })
	type result struct {
		peer int
		addr string
		err  error
	}
	waits := make(chan result, 2)
	for _, p := range []int{0, 1} {
		go func() {
			addr, err := d.Resolve(context.Background(), p)
			waits <- result{p, addr, err}
		}()
	}
	// The guard's watch, and at least one wait's.
	eventually(t, "both Resolves wait", func() bool { c := d.Counters(); return c.Resolves == 2 && c.Watches >= 2 })
	if got, err := d.Resolve(request(t), 3); err != nil || got != "127.0.0.1:7003" {
		t.Fatalf("Resolve(3) of a published peer while two unpublished are waited for = %q, %v; want its address", got, err)
	}
	if got, err := d.Lookup(3); err != nil || got != "127.0.0.1:7003" {
		t.Fatalf("Lookup(3) after its Resolve = %q, %v", got, err)
	}
	eventually(t, "Lookup(2) of a published peer finds it while two unpublished are waited for", lookupIs(d, 2, "127.0.0.1:7002"))
	for _, p := range []int{0, 1} {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		r := <-waits
		if want := fmt.Sprintf("127.0.0.1:%d", 7000+r.peer); r.err != nil || r.addr != want {
			t.Errorf("Resolve(%d) waiting for its publication = %q, %v; want %q", r.peer, r.addr, r.err, want)
		}
	}
	if c := d.Counters().Cached; c > 1 {
		t.Errorf("the directory holds %d addresses; want at most MaxEntries, 1", c)
	}
}

// In OnDemand mode, a transport that only calls Lookup learns what is
// wrong with a garbled value: once the fetch that Lookup starts has read
// it, Lookup answers the error Resolve gives, not "not published".
func TestLookupOfAGarbledValueSaysWhatIsWrong(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	for peer, v := range map[int]string{1: "epcache-life=x 127.0.0.1:7001", 2: ""} {
		if _, err := tc.Put(request(t), etcddir.Key(prefix, peer), v); err != nil {
			t.Fatal(err)
		}
	}
	d := open(t, client(t, s.URL()), onDemand)
	for _, p := range []int{1, 2} {
		var last error
		eventually(t, fmt.Sprintf("Lookup(%d) says what is wrong", p), func() bool {
			_, last = d.Lookup(p)
			return last != nil && !errors.Is(last, directory.ErrNotPublished)
		})
		t.Logf("Lookup(%d): %v", p, last)
		_, rerr := d.Resolve(request(t), p)
		if rerr == nil || rerr.Error() != last.Error() {
			t.Errorf("peer %d: Lookup says %v, Resolve %v; want one answer", p, last, rerr)
		}
		if !strings.Contains(last.Error(), fmt.Sprintf("peer %d", p)) {
			t.Errorf("Lookup(%d): %v; want an error naming the peer", p, last)
		}
	}
}

// A peer with keys of both formats (its process of format v2 beside a key
// of the old format, left by a process of an older etcddir) is answered
// with its key of format v2, by Lookup and Resolve in both modes, and
// Lookup before any Resolve says nothing else; Malformed counts the old
// key.
func TestPeerWithKeysOfBothFormatsIsAnsweredByItsV2Key(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	if _, err := tc.Put(request(t), prefix+"1", "127.0.0.1:9001"); err != nil {
		t.Fatal(err)
	}
	pub := open(t, client(t, s.URL()), onDemand)
	if err := pub.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	forModes(t, func(t *testing.T, mode etcddir.Mode) {
		d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Mode, o.Prefix = mode, prefix })
		if _, err := d.Lookup(1); err != nil && !errors.Is(err, directory.ErrNotPublished) {
			t.Fatalf("Lookup(1) before any Resolve: %v; want the v2 key's address, or not yet", err)
		}
		eventually(t, "Lookup(1) answers the v2 key's address", lookupIs(d, 1, "127.0.0.1:7001"))
		if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
			t.Fatalf("Resolve(1) = %q, %v; want the v2 key's address", got, err)
		}
		if got := d.Malformed(); got != 1 {
			t.Errorf("Malformed() = %d; want 1, the old key", got)
		}
	})
}

var _ clientv3.KV = (*countingKV)(nil)
