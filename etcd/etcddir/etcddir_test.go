package etcddir_test

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// server starts an embedded etcd for the test.
func server(t *testing.T) *etcdtest.Server {
	t.Helper()
	s, err := etcdtest.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// patience bounds every wait of these tests and every request of their
// directories and clients: it only detects a hang, so that no outcome
// depends on how busy the machine is. The tests that exercise a timeout or
// a TTL set their own, short, where nothing else depends on it.
const patience = 2 * time.Minute

// client is one process's connection to etcd. DialTimeout also bounds the
// wait for a lease's first keep-alive, after which the client gives the
// lease up and etcddir publishes again.
func client(t *testing.T, url string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: patience})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// open opens a directory whose leases outlast the test: a live process
// never loses its address to a keep-alive that a busy machine delayed.
func open(t *testing.T, c *clientv3.Client, opt func(*etcddir.Options)) *etcddir.Directory {
	t.Helper()
	o := etcddir.Options{Client: c, Prefix: "/test/" + t.Name() + "/", Size: 4, TTL: time.Hour, Timeout: patience}
	if opt != nil {
		opt(&o)
	}
	d, err := etcddir.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// eventually polls cond until it holds; the limit only detects a hang.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(patience); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, patience)
		}
	}
}

func lookupIs(d *etcddir.Directory, peer int, want string) func() bool {
	return func() bool { got, err := d.Lookup(peer); return err == nil && got == want }
}

func withdrawn(d *etcddir.Directory, peer int) func() bool {
	return func() bool {
		_, err := d.Lookup(peer)
		var np *directory.NotPublishedError
		return errors.As(err, &np) && np.Withdrawn
	}
}

// request returns a context for one of the test's own requests to etcd.
func request(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

// stored returns what etcd holds under key: its value, or "(absent)".
func stored(t *testing.T, c *clientv3.Client, key string) string {
	t.Helper()
	resp, err := c.Get(request(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "(absent)"
	}
	return string(resp.Kvs[0].Value)
}

// modRevision returns the revision of the last write of key.
func modRevision(t *testing.T, c *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := c.Get(request(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("etcd holds nothing under %q", key)
	}
	return resp.Kvs[0].ModRevision
}

// lapse revokes the lease that key is bound to, as etcd does when the
// keep-alives of the process that holds it stop reaching it for TTL.
func lapse(t *testing.T, c *clientv3.Client, key string) {
	t.Helper()
	resp, err := c.Get(request(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("lapse: etcd holds nothing under %q", key)
	}
	if _, err := c.Revoke(request(t), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
}

// Two processes: one publishes, the other sees it through its watch; the
// "not yet published" and "withdrawn" answers are the in-process
// directory's, which transports retry.
func TestPublishLookupUnpublish(t *testing.T) {
	s := server(t)
	a := open(t, client(t, s.URL()), nil)
	b := open(t, client(t, s.URL()), nil)

	_, err := b.Lookup(1)
	var np *directory.NotPublishedError
	if !errors.As(err, &np) || np.Withdrawn || np.Peer != 1 {
		t.Fatalf("Lookup before Publish: %v; want a NotPublishedError", err)
	}
	if _, err := b.Lookup(4); !errors.Is(err, directory.ErrUnknownPeer) {
		t.Fatalf("Lookup(4) of 4 peers: %v; want ErrUnknownPeer", err)
	}
	if err := a.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b sees a's address", lookupIs(b, 1, "127.0.0.1:7001"))
	if !b.Unpublish(1) {
		t.Fatal("Unpublish of a published peer reported false")
	}
	eventually(t, "a sees the withdrawal", func() bool {
		_, err := a.Lookup(1)
		return errors.As(err, &np) && np.Withdrawn
	})
	if b.Unpublish(1) {
		t.Fatal("a second Unpublish reported true")
	}
	if err := a.Publish(1, ""); err == nil {
		t.Fatal("Publish of an empty address succeeded")
	}
}

// A process that dies without a word (no keep-alive reaches etcd, then its
// client stops, as under SIGKILL) leaves the directory when its lease
// expires; when it comes back and publishes again, the watchers hear of it.
// The dying process's lease is short and nothing else in the test waits on
// it: its keep-alives never run, so none can come late and publish it
// again, and the watcher records what its Lookup answers when the watch
// tells of an address, however soon the lease expires after.
func TestDeadProcessLeavesAndComesBack(t *testing.T) {
	s := server(t)
	watcher := open(t, client(t, s.URL()), nil)
	var mu sync.Mutex
	var heard []string
	stop := watcher.Watch(func(peer int, addr string) {
		got, err := watcher.Lookup(peer)
		mu.Lock()
		heard = append(heard, fmt.Sprintf("%d=%s (Lookup %s, %v)", peer, addr, got, err))
		mu.Unlock()
	})
	defer stop()
	heardSoFar := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(heard)
	}

	dying := client(t, s.URL())
	dying.Lease = silentLease{dying.Lease}
	d, err := etcddir.Open(context.Background(), etcddir.Options{Client: dying, Prefix: "/test/" + t.Name() + "/", Size: 4, TTL: time.Second, Timeout: patience})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Publish(2, "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	dying.Close() // no revoke, no delete
	eventually(t, "the lease expires", func() bool {
		_, err := watcher.Lookup(2)
		var np *directory.NotPublishedError
		return errors.As(err, &np) && np.Withdrawn
	})
	t.Logf("the dead process left the directory %v after it published (lease TTL 1s)", time.Since(published).Round(time.Millisecond))
	d.Close()
	// The watch applies the put before the delete, and tells of it first.
	if h := heardSoFar(); len(h) != 1 || h[0] != "2=127.0.0.1:7002 (Lookup 127.0.0.1:7002, <nil>)" {
		t.Fatalf("before the restart, the watcher heard %q; want peer 2's address once, Lookup answering it", h)
	}

	back := open(t, client(t, s.URL()), nil)
	if err := back.Publish(2, "127.0.0.1:7102"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watcher hears of the restart", func() bool { return len(heardSoFar()) == 2 })
	if h := heardSoFar(); h[1] != "2=127.0.0.1:7102 (Lookup 127.0.0.1:7102, <nil>)" {
		t.Fatalf("after the restart, the watcher heard %q", h)
	}
}

// Garbage under the prefix is counted and explained, never mistaken for a
// peer: keys that are not of the v2 format (or name no peer in range),
// another format's, the old format's, and values that are empty or fail
// Validate. The fence key is none of these.
func TestGarbledEntries(t *testing.T) {
	s := server(t)
	c := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	ctx := context.Background()
	for k, v := range map[string]string{
		"abc":           "x",              // no key of etcddir
		"v2/07":         "127.0.0.1:1",    // not ten digits
		"v2/0000000099": "127.0.0.1:1",    // out of range
		"v2/-000000001": "127.0.0.1:1",    // not a number
		"v3/0000000000": "127.0.0.1:1",    // another format
		"2":             "127.0.0.1:1",    // the old format's peer 2
		"v2/0000000003": "",               // an empty address
		"v2/0000000001": "not an address", // fails Validate
		"v2/fence":      "1",              // the fence: no peer, not garbage
	} {
		if _, err := c.Put(ctx, prefix+k, v); err != nil {
			t.Fatal(err)
		}
	}
	d := open(t, c, func(o *etcddir.Options) {
		o.Validate = func(addr string) error { _, _, err := net.SplitHostPort(addr); return err }
	})
	if got := d.Malformed(); got != 8 {
		t.Fatalf("Malformed() = %d; want 8", got)
	}
	_, err := d.Lookup(1)
	if err == nil || errors.Is(err, directory.ErrNotPublished) {
		t.Fatalf("Lookup of a garbled address: %v; want an error that is not 'not published'", err)
	}
	t.Logf("garbled address: %v", err)
	if _, err := d.Lookup(3); err == nil {
		t.Fatal("Lookup of an empty address succeeded")
	}
	if _, err := d.Lookup(0); !errors.Is(err, directory.ErrNotPublished) {
		t.Fatalf("Lookup(0), only \"v2/07\" and \"v3/0000000000\" were put: %v; want not published", err)
	}
	_, err = d.Lookup(2)
	if err == nil || errors.Is(err, directory.ErrNotPublished) || !strings.Contains(err.Error(), "old key format") {
		t.Fatalf("Lookup(2) of a peer published under the old format: %v; want an error naming the old key format", err)
	}
	t.Logf("old format: %v", err)
}

// Bad options and an unreachable etcd get clear errors.
func TestOpenErrors(t *testing.T) {
	if _, err := etcddir.Open(context.Background(), etcddir.Options{}); err == nil {
		t.Fatal("Open with no client succeeded")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c := client(t, "http://"+addr)
	for _, o := range []etcddir.Options{
		{Client: c, Size: 1},
		{Client: c, Prefix: "/p/", Size: 0},
		{Client: c, Prefix: "/p/", Size: 1, TTL: time.Millisecond},
		{Client: c, Prefix: "/p/", Size: 1, Timeout: -1},
	} {
		if _, err := etcddir.Open(context.Background(), o); err == nil {
			t.Fatalf("Open(%+v) succeeded", o)
		} else {
			t.Log(err)
		}
	}
	start := time.Now()
	_, err = etcddir.Open(context.Background(), etcddir.Options{Client: c, Prefix: "/p/", Size: 1, Timeout: 500 * time.Millisecond})
	if err == nil {
		t.Fatal("Open against a closed port succeeded")
	}
	t.Logf("unreachable etcd: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
}

// etcd restarted mid-run: while it is away, Publish fails with a clear
// error (once Timeout has passed) and Lookup answers from the mirror; once
// it is back, the watch resumes and the publications are there. The short
// Timeout is hasty's alone, and only its Publish with etcd away depends on
// it: that one fails however slow the machine.
func TestEtcdRestart(t *testing.T) {
	s, err := etcdtest.Start("")
	if err != nil {
		t.Fatal(err)
	}
	url := s.URL()
	ca, cb, ch := client(t, url), client(t, url), client(t, url)
	a := open(t, ca, nil)
	b := open(t, cb, nil)
	ch.KV = &patientOpen{KV: ch.KV}
	hasty := open(t, ch, func(o *etcddir.Options) { o.Timeout = 500 * time.Millisecond })
	if err := a.Publish(0, "127.0.0.1:7000"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b sees a", lookupIs(b, 0, "127.0.0.1:7000"))

	s.Stop()
	start := time.Now()
	if err := hasty.Publish(1, "127.0.0.1:7001"); err == nil {
		t.Fatal("Publish with etcd away succeeded")
	} else {
		t.Logf("etcd away: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
	if got, err := b.Lookup(0); err != nil || got != "127.0.0.1:7000" {
		t.Fatalf("Lookup with etcd away: %q, %v; want the mirror's address", got, err)
	}

	s2, err := s.Restart()
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last registered first: this one closes the directories
	// while etcd still answers their revokes, then the clients (etcd waits
	// for their streams to end when it stops), then etcd.
	t.Cleanup(func() {
		for _, d := range []*etcddir.Directory{a, b, hasty} {
			d.Close()
		}
		for _, c := range []*clientv3.Client{ca, cb, ch} {
			c.Close()
		}
		s2.Close()
	})
	eventually(t, "b publishes once etcd is back", func() bool { return b.Publish(1, "127.0.0.1:7001") == nil })
	eventually(t, "a's watch resumes", lookupIs(a, 1, "127.0.0.1:7001"))
	if got, err := b.Lookup(0); err != nil || got != "127.0.0.1:7000" {
		t.Fatalf("a's publication after the restart: %q, %v", got, err)
	}
}

// Each garbled entry counts once, however often the mirror reads it
// (issue 24, 10: one garbled key counted 3 after two reloads), and stops
// counting once deleted or made valid.
func TestMalformedCountsEntriesNotReads(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	for k, v := range map[string]string{prefix + "abc": "x", etcddir.Key(prefix, 1): ""} {
		if _, err := tc.Put(request(t), k, v); err != nil {
			t.Fatal(err)
		}
	}
	c := client(t, s.URL())
	gw := &gatedWatch{Watcher: c.Watcher, open: make(chan struct{})}
	close(gw.open)
	c.Watcher = gw
	d := open(t, c, nil)
	if got := d.Malformed(); got != 2 {
		t.Fatalf("Malformed() after Open = %d; want 2", got)
	}
	eventually(t, "two reloads", func() bool {
		if d.Reloads() >= 2 {
			return true
		}
		gw.breakAll() // the watch ends; the mirror reads the prefix again
		return false
	})
	if got := d.Malformed(); got != 2 {
		t.Fatalf("Malformed() after %d reloads = %d; want 2, one per garbled entry", d.Reloads(), got)
	}
	if _, err := tc.Delete(request(t), prefix+"abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.Put(request(t), etcddir.Key(prefix, 1), "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the mirror sees peer 1's address", lookupIs(d, 1, "127.0.0.1:7001")) // after the delete, in revision order
	if got := d.Malformed(); got != 0 {
		t.Fatalf("Malformed() once the garbled entries were deleted or made valid = %d; want 0", got)
	}
}

// Close with etcd away waits for its revoke for Timeout at most. The
// process has one lease, whatever it publishes: one revoke. The revoke is
// never answered, as by an etcd that went away; everything else waits for
// etcd however long it takes, so that only Close depends on the short
// Timeout.
func TestCloseRevokesTheOneLeaseWithinTimeout(t *testing.T) {
	s := server(t)
	c := client(t, s.URL())
	c.KV = patientKV{c.KV}
	revokes := &unansweredRevoke{Lease: c.Lease}
	c.Lease = revokes
	const timeout = time.Second
	d, err := etcddir.Open(context.Background(), etcddir.Options{Client: c, Prefix: "/test/" + t.Name() + "/", Size: 4, TTL: time.Hour, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	for peer := range n {
		if err := d.Publish(peer, fmt.Sprintf("127.0.0.1:%d", 7000+peer)); err != nil {
			t.Fatal(err)
		}
	}
	if got := d.Counters().Grants; got != 1 {
		t.Errorf("%d publications granted %d leases; want 1, the process's", n, got)
	}
	start := time.Now()
	d.Close()
	t.Logf("Close with an unanswered revoke took %v (Timeout %v)", time.Since(start).Round(time.Millisecond), timeout)
	revokes.mu.Lock()
	deadlines := slices.Clone(revokes.deadlines)
	revokes.mu.Unlock()
	if len(deadlines) != 1 {
		t.Fatalf("Close revoked %d leases; want 1, the process's", len(deadlines))
	}
}

// A Publish whose write reached etcd when Close began, and which returned
// only after Close, fails and leaves nothing in etcd: Close revoked what it
// found, and the lease of that Publish was not among it.
func TestPublishOverlappingCloseLeavesNothing(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	key := etcddir.Key("/test/"+t.Name()+"/", 1)
	c := client(t, s.URL())
	gate := newGatePut(c.KV, key)
	c.KV = gate
	d := open(t, c, nil)
	done := make(chan error, 1)
	go func() { done <- d.Publish(1, "127.0.0.1:7001") }()
	<-gate.landed
	d.Close()
	close(gate.release)
	err := <-done
	if got := stored(t, tc, key); got != "(absent)" {
		t.Fatalf("Publish overlapping Close returned %v, and etcd still holds %q for peer 1 (until the lease's TTL); want nothing", err, got)
	}
	if err == nil {
		t.Fatal("Publish overlapping Close returned nil, and its address is not in etcd")
	}
	t.Logf("Publish overlapping Close: %v", err)
}

// The values readers accept (see "Values" in the package doc): a bare
// address, and one tagged with the life it continues, whose revision is no
// later than the value's own.
func TestValueFormats(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	for k, v := range map[int]string{
		0: "127.0.0.1:7000",
		1: "epcache-life=1 127.0.0.1:7001",
		2: "epcache-life=x 127.0.0.1:7002",
		3: "epcache-life=999999 127.0.0.1:7003",
	} {
		if _, err := tc.Put(request(t), etcddir.Key(prefix, k), v); err != nil {
			t.Fatal(err)
		}
	}
	d := open(t, client(t, s.URL()), nil)
	for peer, want := range []string{"127.0.0.1:7000", "127.0.0.1:7001"} {
		if got, err := d.Lookup(peer); err != nil || got != want {
			t.Errorf("Lookup(%d) = %q, %v; want %q", peer, got, err, want)
		}
	}
	for _, peer := range []int{2, 3} {
		_, err := d.Lookup(peer)
		if err == nil || errors.Is(err, directory.ErrNotPublished) {
			t.Errorf("Lookup(%d) of a garbled tag: %v; want an error that is not 'not published'", peer, err)
		}
		t.Logf("garbled tag: %v", err)
	}
	if got := d.Malformed(); got != 2 {
		t.Errorf("Malformed() = %d; want 2", got)
	}
	if err := d.Publish(0, "epcache-life=1 127.0.0.1:7000"); err == nil {
		t.Error("Publish of an address that begins with the tag succeeded")
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
