package etcddir_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/epcache/epcache/etcd/etcddir"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The tests of a peer's lives (see the package doc): a publication writes
// only while it is its peer's newest life, and every new life is news to
// the watchers. The processes whose lives are at stake run in each mode:
// a Mirror hears of newer lives from its watch of the prefix, an OnDemand
// process from its watch of its own keys.

// forModes runs f once per mode, as a subtest.
func forModes(t *testing.T, f func(t *testing.T, mode etcddir.Mode)) {
	for _, m := range []etcddir.Mode{etcddir.Mirror, etcddir.OnDemand} {
		t.Run("mode="+m.String(), func(t *testing.T) { f(t, m) })
	}
}

func inMode(m etcddir.Mode) func(*etcddir.Options) { return func(o *etcddir.Options) { o.Mode = m } }

// counted returns a condition that holds once f(d's counters) reaches n.
func counted(d *etcddir.Directory, f func(etcddir.Counters) int64, n int64) func() bool {
	return func() bool { return f(d.Counters()) >= n }
}

func superseded(c etcddir.Counters) int64 { return c.Superseded }
func renewals(c etcddir.Counters) int64   { return c.LeaseRenewals }

// A zombie: a process cut off from etcd for longer than its TTL, whose
// lease etcd let lapse, and which the resource manager restarted
// elsewhere. When the zombie reaches etcd again it must not write its old
// address over the restarted process's (issue 24, 7: it did, with a plain
// Put, and the restarted process, whose lease stayed alive, never wrote
// again). The zombie's news are held, so that only the guard on its own
// write, not its mirror, can stop it.
func TestZombieDoesNotOverwriteTheRestartedProcess(t *testing.T) {
	forModes(t, testZombieDoesNotOverwriteTheRestartedProcess)
}

func testZombieDoesNotOverwriteTheRestartedProcess(t *testing.T, mode etcddir.Mode) {
	s := server(t)
	tc := client(t, s.URL())
	key := etcddir.Key("/test/"+t.Name()+"/", 1)
	w := open(t, client(t, s.URL()), nil)
	z := startZombie(t, s.URL(), true, mode)
	if err := z.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watcher sees the zombie-to-be", lookupIs(w, 1, "127.0.0.1:7001"))
	lapse(t, tc, key)
	eventually(t, "the watcher sees its lease lapse", withdrawn(w, 1))
	restarted := open(t, client(t, s.URL()), inMode(mode))
	if err := restarted.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watcher sees the restart", lookupIs(w, 1, "127.0.0.1:7101"))

	z.heal()
	eventually(t, "the zombie takes a new lease and writes its address again or gives its life up", counted(z.Directory, renewals, 1))
	if got := stored(t, tc, key); got != "127.0.0.1:7101" {
		t.Fatalf("once the zombie reached etcd again (%s), etcd holds %q for peer 1; want the restarted process's \"127.0.0.1:7101\"", z.deeds, got)
	}
	if got := z.Counters().Superseded; got != 1 {
		t.Errorf("the zombie's Counters().Superseded = %d; want 1: it found the newer life in the key", got)
	}
	if got, err := w.Lookup(1); err != nil || got != "127.0.0.1:7101" {
		t.Fatalf("the watcher's Lookup(1) = %q, %v; want the restarted process's address", got, err)
	}
	t.Logf("the zombie's deeds once healed: %v", z.deeds)
}

// The restarted process came and went while the zombie was away: the key
// is absent when the zombie reaches etcd again, and etcd alone cannot say
// that a newer life was there. The zombie's mirror heard of it, and that
// ends the zombie's life: it does not publish its old address again.
func TestZombieThatHeardOfANewerLifeStaysAway(t *testing.T) {
	forModes(t, testZombieThatHeardOfANewerLifeStaysAway)
}

func testZombieThatHeardOfANewerLifeStaysAway(t *testing.T, mode etcddir.Mode) {
	s := server(t)
	tc := client(t, s.URL())
	key := etcddir.Key("/test/"+t.Name()+"/", 1)
	w := open(t, client(t, s.URL()), nil)
	z := startZombie(t, s.URL(), false, mode)
	if err := z.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watcher sees the zombie-to-be", lookupIs(w, 1, "127.0.0.1:7001"))
	lapse(t, tc, key)
	restarted := open(t, client(t, s.URL()), inMode(mode))
	if err := restarted.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	if !restarted.Unpublish(1) {
		t.Fatal("the restarted process's Unpublish of its own address reported false")
	}
	eventually(t, "the zombie hears of the newer life", counted(z.Directory, superseded, 1))

	z.heal()
	eventually(t, "the zombie takes a new lease", counted(z.Directory, renewals, 1))
	if got := stored(t, tc, key); got != "(absent)" {
		t.Fatalf("once the zombie reached etcd again (%s), etcd holds %q for peer 1; want nothing: its life ended when it heard of a newer one", z.deeds, got)
	}
	eventually(t, "the watcher sees peer 1 withdrawn", withdrawn(w, 1))
}

// Both lives lose their leases; the older (a zombie) reaches etcd first
// and writes into the absent key; then the newer does. The newer must win
// (a write guarded only by "absent or mine" would leave it superseded by
// the zombie's later write, and the zombie superseded by the newer life:
// nobody), and the zombie, once it hears of it, must give its life up.
func TestNewerLifeWinsOverAZombieThatWroteFirst(t *testing.T) {
	forModes(t, testNewerLifeWinsOverAZombieThatWroteFirst)
}

func testNewerLifeWinsOverAZombieThatWroteFirst(t *testing.T, mode etcddir.Mode) {
	s := server(t)
	tc := client(t, s.URL())
	key := etcddir.Key("/test/"+t.Name()+"/", 1)
	w := open(t, client(t, s.URL()), nil)
	z := startZombie(t, s.URL(), true, mode)
	if err := z.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	zLife := modRevision(t, tc, key)
	lapse(t, tc, key)
	n := startZombie(t, s.URL(), false, mode)
	if err := n.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	nLife := modRevision(t, tc, key)
	eventually(t, "the watcher sees the newer life", lookupIs(w, 1, "127.0.0.1:7101"))
	lapse(t, tc, key)
	eventually(t, "the watcher sees its lease lapse", withdrawn(w, 1))

	z.heal()
	eventually(t, "the zombie writes into the absent key", counted(z.Directory, renewals, 1))
	if got, want := stored(t, tc, key), fmt.Sprintf("epcache-life=%d 127.0.0.1:7001", zLife); got != want {
		t.Fatalf("the zombie's republication: etcd holds %q; want %q", got, want)
	}
	n.heal()
	eventually(t, "the newer life takes its key back", counted(n.Directory, renewals, 1))
	want := fmt.Sprintf("epcache-life=%d 127.0.0.1:7101", nLife)
	if got := stored(t, tc, key); got != want {
		t.Fatalf("the newer life's republication: etcd holds %q; want %q", got, want)
	}
	z.hear()
	// The zombie's last write came after the newer life's first: it
	// deletes the key if its own write still holds it, which it does not.
	eventually(t, "the zombie hears of the newer life and withdraws what it wrote", counted(z.Directory, superseded, 1))
	if got := stored(t, tc, key); got != want {
		t.Fatalf("after the zombie gave its life up (%s), etcd holds %q; want %q", z.deeds, got, want)
	}
	eventually(t, "the watcher sees the newer life", lookupIs(w, 1, "127.0.0.1:7101"))
}

// A process restarted on the same address (a fixed port) before its old
// lease expired is news: a transport that remembers a failure to reach
// the old process forgets it (issue 24, 8: the watchers heard nothing, as
// the address had not changed, and tcp peers stayed locked out for
// ErrorTTL). A rewrite of the same life is not news.
func TestRestartOnTheSameAddressIsNews(t *testing.T) {
	s := server(t)
	w := open(t, client(t, s.URL()), nil)
	var mu sync.Mutex
	heard := map[int][]string{}
	stop := w.Watch(func(peer int, addr string) {
		mu.Lock()
		heard[peer] = append(heard[peer], addr)
		mu.Unlock()
	})
	defer stop()
	heardOf := func(peer int) []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), heard[peer]...)
	}

	old := open(t, client(t, s.URL()), nil)
	if err := old.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watcher hears of the first life", func() bool { return len(heardOf(1)) == 1 })
	restarted := open(t, client(t, s.URL()), nil) // old's lease is still alive
	if err := restarted.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	// Events come in revision order: once the watcher has heard of peer 2,
	// it has seen the restart of peer 1.
	if err := restarted.Publish(2, "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watcher hears of peer 2", func() bool { return len(heardOf(2)) == 1 })
	if h := heardOf(1); len(h) != 2 {
		t.Fatalf("the watcher heard of peer 1 %d times (%q); want 2: its first life and its restart on the same address", len(h), h)
	}
}

// Two Publish calls of one peer at once, in one process: the first's
// write reaches etcd, and it is held before it hears so, while the second
// runs as far as it can. Both return nil, so the address must be in etcd,
// bound to a live lease (issue 24, 9: the first, installing its
// publication last, revoked the lease of the second, which held the key:
// nothing was left).
func TestConcurrentPublishesOfOnePeerKeepItsAddress(t *testing.T) {
	forModes(t, testConcurrentPublishesOfOnePeerKeepItsAddress)
}

func testConcurrentPublishesOfOnePeerKeepItsAddress(t *testing.T, mode etcddir.Mode) {
	s := server(t)
	tc := client(t, s.URL())
	key := etcddir.Key("/test/"+t.Name()+"/", 1)
	c := client(t, s.URL())
	gate := newGatePut(c.KV, key)
	c.KV = gate
	d := open(t, c, inMode(mode))

	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = d.Publish(1, "127.0.0.1:7001") })
	<-gate.landed
	wg.Go(func() { errs[1] = d.Publish(1, "127.0.0.1:7002") })
	eventually(t, "the second Publish stores its address or waits for the first", func() bool {
		select {
		case <-gate.second:
			return true
		default:
			return waitingInPublish()
		}
	})
	close(gate.release)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("Publish: %v, %v", errs[0], errs[1])
	}
	resp, err := tc.Get(request(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatal("both Publish calls returned nil, and etcd holds no address for peer 1")
	}
	kv := resp.Kvs[0]
	ttl, err := tc.TimeToLive(request(t), clientv3.LeaseID(kv.Lease))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL <= 0 {
		t.Fatalf("peer 1's address %q is bound to lease %x, which is gone (TTL %d)", kv.Value, kv.Lease, ttl.TTL)
	}
	eventually(t, "the directory sees what etcd holds", lookupIs(d, 1, string(kv.Value)))
}

// A process whose life a newer one replaced (a restart elsewhere) and
// which then unpublishes its peer, as on its way out, withdraws nothing:
// the newer life is not its to withdraw.
func TestSupersededProcessUnpublishesNothing(t *testing.T) {
	forModes(t, testSupersededProcessUnpublishesNothing)
}

func testSupersededProcessUnpublishesNothing(t *testing.T, mode etcddir.Mode) {
	s := server(t)
	tc := client(t, s.URL())
	key := etcddir.Key("/test/"+t.Name()+"/", 1)
	old := open(t, client(t, s.URL()), inMode(mode))
	if err := old.Publish(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	restarted := open(t, client(t, s.URL()), inMode(mode))
	if err := restarted.Publish(1, "127.0.0.1:7101"); err != nil {
		t.Fatal(err)
	}
	if old.Unpublish(1) {
		t.Error("the replaced process's Unpublish reported true")
	}
	if got := stored(t, tc, key); got != "127.0.0.1:7101" {
		t.Fatalf("after the replaced process's Unpublish, etcd holds %q for peer 1; want the restarted process's \"127.0.0.1:7101\"", got)
	}
	if !restarted.Unpublish(1) || stored(t, tc, key) != "(absent)" {
		t.Fatal("the restarted process's Unpublish of its own life withdrew nothing")
	}
}

// An OnDemand process hears of newer lives of every peer it publishes,
// however its range of peers grew: its watch of its own keys covers
// peers published after it started, from just before their writes.
func TestOnDemandHearsOfNewerLivesOfEveryPeerItPublishes(t *testing.T) {
	s := server(t)
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode = 8, etcddir.OnDemand })
	for _, p := range []int{2, 0, 5} {
		if err := d.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.PublishAll(map[int]string{7: "127.0.0.1:7007", 6: "127.0.0.1:7006"}); err != nil {
		t.Fatal(err)
	}
	other := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size = 8 })
	for _, p := range []int{0, 5, 7} {
		if err := other.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7100+p)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the process hears of the three newer lives", counted(d, superseded, 3))
	if got := d.Counters().Superseded; got != 3 {
		t.Fatalf("Superseded = %d; want 3", got)
	}
}
