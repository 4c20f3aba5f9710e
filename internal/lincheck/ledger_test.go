// Package lincheck_test checks that epcache's operations are linearizable,
// with porcupine. It is a module of its own so that porcupine stays out of
// the library's module graph; the ledger below is the part of epcache's own
// test ledger these histories need.
package lincheck_test

import (
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// long selects the long campaign (make stress).
var long = flag.Bool("long", false, "run the long linearizability campaign (make stress)")

// hang bounds a wait that only detects a hang, however slow the machine.
const hang = 2 * time.Minute

// hashVariants are the hashes every history runs against: the built-in
// seeded one, and bad ones, so that collisions are tested, not hoped for.
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

// conn stands for an endpoint: a distinct pointer per value made, which
// knows how often it was released and how many leases a client holds.
type conn struct {
	key      int
	gen      int64
	released atomic.Int32
	leases   atomic.Int32
}

func (c *conn) String() string { return fmt.Sprintf("conn(key=%d gen=%d)", c.key, c.gen) }

// ledger records every value made through a cache and checks the
// exactly-once contract: at most one Create in flight per key, and every
// value released exactly once.
type ledger struct {
	gen atomic.Int64

	mu       sync.Mutex
	inflight map[int]int
	overlap  bool
	made     []*conn
	keptBack int // values made for an Offer the cache refused
}

func newLedger() *ledger { return &ledger{inflight: map[int]int{}} }

// enter and leave bracket one Create call.
func (l *ledger) enter(key int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight[key]++; l.inflight[key] > 1 {
		l.overlap = true
	}
}

func (l *ledger) leave(key int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight[key]--
}

func (l *ledger) newConn(key int) *conn {
	c := &conn{key: key, gen: l.gen.Add(1)}
	l.mu.Lock()
	l.made = append(l.made, c)
	l.mu.Unlock()
	return c
}

// keepBack releases c, a value made for an Offer the cache refused.
func (l *ledger) keepBack(c *conn) {
	c.released.Add(1)
	l.mu.Lock()
	l.keptBack++
	l.mu.Unlock()
}

func (l *ledger) release(key int, c *conn) {
	if c.key != key {
		panic(fmt.Sprintf("Release(%d, %v): key does not match", key, c))
	}
	c.released.Add(1)
}

// checkClosed asserts, after Close, that every value was released exactly
// once, that no two Creates of a key overlapped, and that Stats agree.
func (l *ledger) checkClosed(t *testing.T, c *epcache.Cache[int, *conn]) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, cn := range l.made {
		if n := cn.released.Load(); n != 1 {
			t.Errorf("%v released %d times; want exactly 1", cn, n)
		}
	}
	if l.overlap {
		t.Errorf("two Creates of one key were in flight at once")
	}
	st := c.Stats()
	if st.Creates+st.Offers != uint64(len(l.made)-l.keptBack) || st.Releases != st.Creates+st.Offers || st.Live != 0 {
		t.Errorf("after Close: Stats %+v with %d values made (%d of them offered and kept back)", st, len(l.made), l.keptBack)
	}
}
