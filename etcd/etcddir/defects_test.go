package etcddir_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/transport/directory"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
// two unpublished ones wait, with room for one address.
func TestWaitForAnUnpublishedPeerTakesNoRoom(t *testing.T) {
	s := server(t)
	pub := open(t, client(t, s.URL()), onDemand)
	if err := pub.Publish(3, "127.0.0.1:7003"); err != nil {
		t.Fatal(err)
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

// Prefetch reads every page at the revision it is given: with one key a
// page, a life published after the fence and a peer withdrawn after it
// are not in what it reads.
func TestPrefetchReadsEveryPageAtItsRevision(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	pub := open(t, client(t, s.URL()), onDemand)
	for p := range 4 {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	fence := modRevision(t, tc, etcddir.Key(prefix, 3))
	later := open(t, client(t, s.URL()), onDemand)
	if err := later.Publish(2, "127.0.0.1:7102"); err != nil {
		t.Fatal(err)
	}
	if !pub.Unpublish(3) {
		t.Fatal("Unpublish(3) withdrew nothing")
	}
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Mode, o.PageSize = etcddir.OnDemand, 1 })
	before := d.Counters()
	if err := d.Prefetch(request(t), fence); err != nil {
		t.Fatal(err)
	}
	if pages := d.Counters().Ranges - before.Ranges; pages != 4 {
		t.Errorf("Prefetch of 4 keys, 1 a page: %d range requests; want 4", pages)
	}
	for p := range 4 {
		if got, err := d.Lookup(p); err != nil || got != fmt.Sprintf("127.0.0.1:%d", 7000+p) {
			t.Errorf("Lookup(%d) after Prefetch at the fence's revision %d = %q, %v; want the address it had then", p, fence, got, err)
		}
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

// After Close, Resolve fails in either mode, even of a peer it holds.
func TestResolveFailsAfterClose(t *testing.T) {
	forModes(t, func(t *testing.T, mode etcddir.Mode) {
		s := server(t)
		pub := open(t, client(t, s.URL()), nil)
		if err := pub.Publish(1, "127.0.0.1:7001"); err != nil {
			t.Fatal(err)
		}
		d := open(t, client(t, s.URL()), inMode(mode))
		if got, err := d.Resolve(request(t), 1); err != nil || got != "127.0.0.1:7001" {
			t.Fatalf("Resolve(1) = %q, %v", got, err)
		}
		d.Close()
		if got, err := d.Resolve(request(t), 1); err == nil {
			t.Fatalf("Resolve(1) after Close = %q, nil; want an error", got)
		} else {
			t.Log(err)
		}
	})
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

// Mirror's Open survives a compaction between two pages of its first
// load: it reads the prefix again, as the mirror's reloads do.
func TestMirrorOpenThroughACompactionBetweenPages(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	pub := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size = 3 })
	for p := range 3 {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	c := client(t, s.URL())
	var compacted bool
	c.KV = &compactAfterFirstPage{KV: c.KV, prefix: prefix, compact: func() {
		// A revision of its own, and the history before it gone.
		resp, err := tc.Put(request(t), "/test/"+t.Name()+"-other", "x")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := tc.Compact(request(t), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			t.Error(err)
			return
		}
		compacted = true
	}}
	d, err := etcddir.Open(context.Background(), etcddir.Options{Client: c, Prefix: prefix, Size: 3, PageSize: 1, TTL: time.Hour, Timeout: patience})
	if err != nil {
		t.Fatalf("Open with a compaction between the pages of its load: %v", err)
	}
	defer d.Close()
	if !compacted {
		t.Fatal("no compaction between the pages")
	}
	for p := range 3 {
		if got, err := d.Lookup(p); err != nil || got != fmt.Sprintf("127.0.0.1:%d", 7000+p) {
			t.Errorf("Lookup(%d) = %q, %v", p, got, err)
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
