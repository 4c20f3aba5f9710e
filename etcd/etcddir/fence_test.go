package etcddir_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/transport/directory"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Keys are in peer order, so that a range of peers is a range of keys,
// and name their format.
func TestKeyFormat(t *testing.T) {
	const prefix = "/job/"
	for peer, want := range map[int]string{
		0:                     "/job/v2/0000000000",
		7:                     "/job/v2/0000000007",
		1234567:               "/job/v2/0001234567",
		directory.MaxSize - 1: "/job/v2/2147483646",
	} {
		if got := etcddir.Key(prefix, peer); got != want {
			t.Errorf("Key(%q, %d) = %q; want %q", prefix, peer, got, want)
		}
	}
	var keys []string
	for _, p := range []int{0, 1, 2, 9, 10, 11, 99, 100, 1000, 99999, 100000} {
		keys = append(keys, etcddir.Key(prefix, p))
	}
	if !slices.IsSorted(keys) {
		t.Errorf("keys in peer order are not in key order: %q", keys)
	}
	if f := etcddir.FenceKey(prefix); f != "/job/v2/fence" || f < etcddir.Key(prefix, directory.MaxSize-1) {
		t.Errorf("FenceKey = %q; want it after every peer's key", f)
	}
}

// PublishAll writes many peers in one transaction per 128, all bound to
// the process's one lease; Close revokes it, and every key goes.
func TestPublishAllOneLease(t *testing.T) {
	const size, n = 300, 200
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size = size })
	w := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size = size })
	addrs := map[int]string{}
	for p := range n {
		addrs[p] = fmt.Sprintf("127.0.0.1:%d", 10000+p)
	}
	if err := d.PublishAll(addrs); err != nil {
		t.Fatal(err)
	}
	if err := d.Publish(n, "127.0.0.1:9999"); err != nil {
		t.Fatal(err)
	}
	c := d.Counters()
	if c.Txns != 2 || c.Puts != 1 || c.Grants != 1 {
		t.Errorf("PublishAll of %d peers and a Publish: %d transactions, %d puts, %d leases; want 2, 1, 1", n, c.Txns, c.Puts, c.Grants)
	}
	resp, err := tc.Get(request(t), etcddir.Key(prefix, 0), clientv3.WithRange(etcddir.Key(prefix, size)))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != n+1 {
		t.Fatalf("etcd holds %d keys; want %d", len(resp.Kvs), n+1)
	}
	for _, kv := range resp.Kvs {
		if kv.Lease != resp.Kvs[0].Lease {
			t.Fatalf("%s is bound to lease %x, %s to %x; want one lease per process", kv.Key, kv.Lease, resp.Kvs[0].Key, resp.Kvs[0].Lease)
		}
	}
	eventually(t, "a mirror sees them all", lookupIs(w, n, "127.0.0.1:9999"))
	for p := range n {
		if got, err := w.Lookup(p); err != nil || got != addrs[p] {
			t.Fatalf("Lookup(%d) = %q, %v; want %q", p, got, err, addrs[p])
		}
	}
	d.Close()
	resp, err = tc.Get(request(t), etcddir.Key(prefix, 0), clientv3.WithRange(etcddir.Key(prefix, size)), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("after Close, etcd holds %d keys (%v); want none", resp.Count, err)
	}
}

// The fence: one coordinator follows the peers' keys and writes the fence
// when all are in; every process waits on that one key, then reads every
// address at the fence's revision, page by page, and answers Lookup of
// every peer without a fetch. What it costs is counted: the coordinator
// hears one event per peer, each other process one per key it watches.
func TestFenceThenPrefetch(t *testing.T) {
	const size = 5
	s := server(t)
	var dirs []*etcddir.Directory
	for range size {
		dirs = append(dirs, open(t, client(t, s.URL()), func(o *etcddir.Options) {
			o.Size, o.Mode, o.PageSize = size, etcddir.OnDemand, 2
		}))
	}
	fences := make([]int64, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	var coordinated int64
	var coordErr error
	wg.Go(func() { coordinated, coordErr = dirs[0].CoordinateFence(request(t)) })
	for i, d := range dirs {
		wg.Go(func() { fences[i], errs[i] = d.Fence(request(t)) })
	}
	for i, d := range dirs {
		if err := d.Publish(i, fmt.Sprintf("127.0.0.1:%d", 7000+i)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if coordErr != nil {
		t.Fatal(coordErr)
	}
	for i := range size {
		if errs[i] != nil || fences[i] != coordinated {
			t.Fatalf("process %d's Fence: %d, %v; want the coordinator's %d", i, fences[i], errs[i], coordinated)
		}
	}
	for i, d := range dirs {
		before := d.Counters()
		if err := d.Prefetch(request(t), coordinated); err != nil {
			t.Fatal(err)
		}
		after := d.Counters()
		if pages := after.Ranges - before.Ranges; pages != 3 {
			t.Errorf("process %d's Prefetch of %d keys, 2 a page: %d range requests; want 3", i, size, pages)
		}
		for p := range size {
			if got, err := d.Lookup(p); err != nil || got != fmt.Sprintf("127.0.0.1:%d", 7000+p) {
				t.Fatalf("process %d: Lookup(%d) after Prefetch = %q, %v", i, p, got, err)
			}
		}
		if after.Fetches != 0 {
			t.Errorf("process %d fetched %d peers; want none, Prefetch read them all", i, after.Fetches)
		}
		t.Logf("process %d: %+v", i, after)
	}
	// Each process watches its own key (one event: its own write) and the
	// fence's (one); the coordinator the peers' keys too (one each).
	for i, d := range dirs {
		want := int64(2)
		if i == 0 {
			want += size
		}
		if got := d.Counters().Events; got > want {
			t.Errorf("process %d heard %d events; want at most %d", i, got, want)
		}
	}
	// A fence that exists is answered at once, coordinator or not.
	if rev, err := dirs[3].CoordinateFence(request(t)); err != nil || rev != coordinated {
		t.Errorf("a second CoordinateFence: %d, %v; want %d", rev, err, coordinated)
	}
}

// A compaction during a fence: the coordinator's watch of the peers' keys
// and a process's watch of the fence key each start from a revision etcd
// compacted away; each reads its keys again and the fence completes.
func TestFenceThroughACompaction(t *testing.T) {
	const size = 3
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	peerKeys := func(key string) bool { return key == etcddir.Key(prefix, 0) }
	fenceKey := func(key string) bool { return key == etcddir.FenceKey(prefix) }

	cc := client(t, s.URL())
	cw := newCountingWatcher(cc.Watcher)
	cw.hold = peerKeys
	cc.Watcher = cw
	coord := open(t, cc, func(o *etcddir.Options) { o.Size, o.Mode = size, etcddir.OnDemand })

	wc := client(t, s.URL())
	ww := newCountingWatcher(wc.Watcher)
	ww.hold = fenceKey
	wc.Watcher = ww
	waiter := open(t, wc, func(o *etcddir.Options) { o.Size, o.Mode = size, etcddir.OnDemand })

	var coordinated, fenced int64
	var coordErr, fenceErr error
	var wg sync.WaitGroup
	wg.Go(func() { coordinated, coordErr = coord.CoordinateFence(request(t)) })
	wg.Go(func() { fenced, fenceErr = waiter.Fence(request(t)) })
	<-cw.held // the coordinator has read the peers' keys (none), and not yet watched them
	<-ww.held // the waiter has read the fence key (absent), and not yet watched it
	pub := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size = size })
	for p := range size {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	compact := func() {
		// A revision of its own, and the history before it gone.
		resp, err := tc.Put(request(t), "/test/"+t.Name()+"-other", "x")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tc.Compact(request(t), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
	}
	compact()
	close(cw.release)
	// The coordinator reads again and writes the fence; the waiter, held
	// before its watch, has not seen it: compact again, past the fence.
	eventually(t, "the coordinator writes the fence", func() bool { return stored(t, tc, etcddir.FenceKey(prefix)) != "(absent)" })
	compact()
	close(ww.release)
	wg.Wait()
	if coordErr != nil || fenceErr != nil || fenced != coordinated {
		t.Fatalf("CoordinateFence: %d, %v; Fence: %d, %v", coordinated, coordErr, fenced, fenceErr)
	}
	if coord.Reloads() < 1 || waiter.Reloads() < 1 {
		t.Errorf("reloads: coordinator %d, waiter %d; want each at least 1, after its watch hit the compaction", coord.Reloads(), waiter.Reloads())
	}
	// The fence's revision was compacted away: Prefetch reads the newest.
	if err := waiter.Prefetch(request(t), fenced); err != nil {
		t.Fatal(err)
	}
	for p := range size {
		if got, err := waiter.Lookup(p); err != nil || got != fmt.Sprintf("127.0.0.1:%d", 7000+p) {
			t.Fatalf("Lookup(%d) after Prefetch = %q, %v", p, got, err)
		}
	}
	v := stored(t, tc, etcddir.FenceKey(prefix))
	if r, err := strconv.ParseInt(v, 10, 64); err != nil || r != coordinated {
		t.Errorf("the fence key holds %q; want the revision %d", v, coordinated)
	}
}

// A garbled fence is an error, not a wait.
func TestGarbledFence(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	if _, err := tc.Put(request(t), etcddir.FenceKey(prefix), "soon"); err != nil {
		t.Fatal(err)
	}
	d := open(t, client(t, s.URL()), onDemand)
	_, err := d.Fence(request(t))
	if err == nil || !strings.Contains(err.Error(), "fence") {
		t.Fatalf("Fence with a garbled fence key: %v; want an error naming it", err)
	}
	t.Log(err)
	if _, err := d.Fence(context.Background()); err == nil {
		t.Fatal("a second Fence succeeded")
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
