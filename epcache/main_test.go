package epcache_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/epcache/epcache/epcache"
	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// creation goroutine, timer callback and waiter must be gone once each test
// has closed its caches.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// hang bounds a wait that only detects a hang: a test may wait this long
// for something that must happen, however slow or busy the machine, and
// fails only if it never does.
const hang = 2 * time.Minute

// hashVariants are the constructors every behaviour test runs against: the
// built-in seeded hash, and deliberately bad hashes, so that collisions are
// tested, not hoped for (the standard library's HashTrieMap tests do the same).
var hashVariants = []struct {
	name string
	hash func(int) uint64
}{
	{"seeded", nil},
	{"zero", func(int) uint64 { return 0 }},
	{"truncated", func(k int) uint64 { return uint64(k) & 3 }},
}

func eachHash(t *testing.T, test func(t *testing.T, hash func(int) uint64)) {
	for _, v := range hashVariants {
		t.Run("hash="+v.name, func(t *testing.T) { test(t, v.hash) })
	}
}

// conn stands for an endpoint: a distinct pointer per creation, which knows
// whether it was released, and how often. What the ledger checks lives in
// its record, which the ledger keeps: a ledger holds no conn, so that a
// test can find out whether the cache still holds one (ledger.reachable).
type conn struct {
	*record
	leases  atomic.Int32 // leases a test holds on it (tests that count them)
	metered atomic.Bool  // counted in a meter (TestLifecycleStress)
}

// record is what a ledger keeps of a conn.
type record struct {
	key      int
	gen      int64
	released atomic.Int32
	value    weak.Pointer[conn]
}

func (r *record) String() string { return fmt.Sprintf("conn(key=%d gen=%d)", r.key, r.gen) }

// newConn returns a conn that no ledger records.
func newConn(key int, gen int64) *conn {
	c := &conn{record: &record{key: key, gen: gen}}
	c.value = weak.Make(c)
	return c
}

// ledger records every creation and release made through a cache and checks
// the exactly-once contract: at most one Create in flight per key, and every
// created value released exactly once.
type ledger struct {
	gen atomic.Int64

	mu          sync.Mutex
	inflight    map[int]int
	maxInflight int
	created     []*record
	calls       map[int]int // Create calls per key
	keptBack    int         // values made for an Offer the cache refused: released by the caller
}

func newLedger() *ledger {
	return &ledger{inflight: map[int]int{}, calls: map[int]int{}}
}

// enter and leave bracket one Create call.
func (l *ledger) enter(key int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight[key]++
	l.calls[key]++
	l.maxInflight = max(l.maxInflight, l.inflight[key])
}

func (l *ledger) leave(key int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight[key]--
}

func (l *ledger) newConn(key int) *conn {
	c := newConn(key, l.gen.Add(1))
	l.mu.Lock()
	l.created = append(l.created, c.record)
	l.mu.Unlock()
	return c
}

// keepBack releases c, a value made for an Offer that the cache refused:
// it stayed the caller's.
func (l *ledger) keepBack(c *conn) {
	c.released.Add(1)
	l.mu.Lock()
	l.keptBack++
	l.mu.Unlock()
}

// reachable returns how many of the values made through l have been
// released and are still reachable after a full collection: values the
// cache still holds, since the ledger holds none (the caller must hold
// none either).
func (l *ledger) reachable() int {
	runtime.GC()
	runtime.GC()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.created {
		if r.released.Load() > 0 && r.value.Value() != nil {
			n++
		}
	}
	return n
}

// maxInflightOf is the most Creates of one key that were ever in flight at once.
func (l *ledger) maxInflightOf() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxInflight
}

func (l *ledger) callsFor(key int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[key]
}

// create is a Create that succeeds at once.
func (l *ledger) create(_ context.Context, key int) (*conn, error) {
	l.enter(key)
	defer l.leave(key)
	return l.newConn(key), nil
}

func (l *ledger) release(key int, c *conn) {
	if c.key != key {
		panic(fmt.Sprintf("Release(%d, %v): key does not match", key, c))
	}
	c.released.Add(1)
}

// checkClosed asserts, after Close, that every created value was released
// exactly once and that the stats agree.
func (l *ledger) checkClosed(t *testing.T, c *epcache.Cache[int, *conn]) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, cn := range l.created {
		if n := cn.released.Load(); n != 1 {
			t.Errorf("%v released %d times; want exactly 1", cn, n)
		}
	}
	if l.maxInflight > 1 {
		t.Errorf("up to %d Creates of one key were in flight at once; want at most 1", l.maxInflight)
	}
	st := c.Stats()
	if st.Creates+st.Offers != uint64(len(l.created)-l.keptBack) || st.Releases != st.Creates+st.Offers || st.Live != 0 {
		t.Errorf("after Close: Stats %+v with %d values made (%d of them offered and kept back); want Creates + Offers == Releases == made less kept back, and Live == 0",
			st, len(l.created), l.keptBack)
	}
}

// newCache builds a cache over l with the given hash; the caller adjusts cfg
// through opt. The cache is closed and checked when the test ends.
func newCache(t *testing.T, l *ledger, hash func(int) uint64, opt func(*epcache.Config[int, *conn])) *epcache.Cache[int, *conn] {
	t.Helper()
	cfg := epcache.Config[int, *conn]{Create: l.create, Release: l.release, Hash: hash}
	if opt != nil {
		opt(&cfg)
	}
	c, err := epcache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		l.checkClosed(t, c)
	})
	return c
}
