package epcache_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzCache decodes its input into a sequence of operations on one cache and
// checks every result, and the whole of Stats after every step, against a
// sequential reference model. The first byte picks the hash variant and
// whether failures are remembered (ErrorTTL) and retried; then each pair of
// bytes is one operation (see fuzzOp) and its argument. It runs in a
// synctest bubble, so that ErrorTTL and retry waits follow the fake clock
// and the model can predict them exactly. At the end the ledger checks that
// every value was released exactly once.
//
// The seed corpus is in testdata/fuzz/FuzzCache; `make fuzz-short` runs the
// fuzzer briefly, `make stress` for longer.
func FuzzCache(f *testing.F) {
	f.Add([]byte{0x00, 0, 1, 0, 1, 2, 1, 0, 1, 1, 1})
	f.Add([]byte{0x05, 5, 0x13, 0, 3, 0, 3, 6, 9, 0, 3, 7, 3, 0, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 401 {
			return
		}
		synctest.Test(t, func(t *testing.T) { runCacheOps(t, data) })
	})
}

// fuzzOp is an operation of FuzzCache, chosen by the first byte of a pair.
type fuzzOp uint8

const (
	opGet fuzzOp = iota
	opLoad
	opInvalidate
	opCompareAndInvalidate      // with the held value: a fresh failure report
	opCompareAndInvalidateStale // with a value already replaced: a late report
	opFailNext                  // the next 1-3 attempts to create the key fail
	opSleep                     // 0-15ms of fake time: remembered failures expire
	opForget
	opAll // All and Len against the model
	opClose
	opAcquire      // Get plus a lease, kept by the model
	opReleaseLease // release the key's oldest lease
	opOffer        // offer a value made elsewhere
	numFuzzOps
)

var errFuzz = errors.New("fuzz: peer refused")

const (
	fuzzTTL       = 5 * time.Millisecond
	fuzzRetryWait = time.Millisecond
	fuzzKeys      = 16 // few enough to collide, enough that the shard's array grows and compacts
)

// cacheModel is the sequential specification of a Cache.
type cacheModel struct {
	held     map[int]*conn     // ready values
	failed   map[int]time.Time // remembered failures and the time they expire
	stale    map[int]*conn     // each key's last value given up
	fails    map[int]int       // attempts to create the key that will fail, in the model
	creates  map[int]int       // the same, for the real Create
	leases   map[int][]epcache.Lease[int, *conn]
	leased   map[*conn]int  // leases held on each value
	given    map[*conn]bool // values given up while leased: released by their last lease
	closed   bool
	ttl      bool
	retry    bool
	expected epcache.Stats
	ledger   *ledger
}

func runCacheOps(t *testing.T, data []byte) {
	hash := hashVariants[int(data[0]%4)%len(hashVariants)].hash
	m := &cacheModel{
		held: map[int]*conn{}, failed: map[int]time.Time{}, stale: map[int]*conn{},
		fails: map[int]int{}, creates: map[int]int{},
		leases: map[int][]epcache.Lease[int, *conn]{}, leased: map[*conn]int{}, given: map[*conn]bool{},
		ttl: data[0]&4 != 0, retry: data[0]&8 != 0,
	}
	l := newLedger()
	m.ledger = l
	c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
		cfg.Create = func(_ context.Context, key int) (*conn, error) {
			l.enter(key)
			defer l.leave(key)
			if m.creates[key] > 0 { // the Get that started this waits: no race
				m.creates[key]--
				return nil, errFuzz
			}
			return l.newConn(key), nil
		}
		if m.ttl {
			cfg.ErrorTTL = fuzzTTL
		}
		if m.retry {
			cfg.Retry = func(attempt int, _ error) (time.Duration, bool) { return fuzzRetryWait, attempt < 2 }
		}
	})
	data = data[1:]
	for i := 0; i+1 < len(data); i += 2 {
		op, arg := fuzzOp(data[i]%byte(numFuzzOps)), int(data[i+1])
		key := arg % fuzzKeys
		step := fmt.Sprintf("step %d: op %d key %d", i/2, op, key)
		m.apply(t, c, op, key, arg, step)
		require.Equal(t, m.expected, c.Stats(), "%s: Stats", step)
		if t.Failed() {
			t.FailNow()
		}
	}
	m.apply(t, c, opClose, 0, 0, "final Close")
	// Every lease still held ends now: the values given up are released.
	for key := range fuzzKeys {
		for len(m.leases[key]) > 0 {
			m.apply(t, c, opReleaseLease, key, key, "final lease releases")
		}
	}
	require.Zero(t, c.Stats().Lingering)
	// newCache's cleanup has the ledger check every release.
}

// giveUp is the model of a value leaving the cache: released now, or by
// its last lease.
func (m *cacheModel) giveUp(t *testing.T, v *conn, step string) {
	st := &m.expected
	st.Ready--
	if m.leased[v] > 0 {
		assert.Zero(t, v.released.Load(), "%s: released while leased", step)
		m.given[v] = true
		st.Lingering++
		return
	}
	assert.EqualValues(t, 1, v.released.Load(), "%s: released when given up", step)
	st.Releases++
	st.Live--
}

func (m *cacheModel) apply(t *testing.T, c *epcache.Cache[int, *conn], op fuzzOp, key, arg int, step string) {
	st := &m.expected
	switch op {
	case opGet:
		v, err := c.Get(context.Background(), key)
		want, wantErr := m.get(key)
		if wantErr != nil {
			assert.Same(t, wantErr, err, step)
			assert.Nil(t, v, step)
			return
		}
		require.NoError(t, err, step)
		if want != nil {
			assert.Same(t, want, v, step)
			return
		}
		// A creation: a new value of this key, never seen before.
		require.NotNil(t, v, step)
		assert.Equal(t, key, v.key, step)
		for _, old := range m.held {
			assert.NotSame(t, old, v, step)
		}
		m.held[key] = v
		st.Creates++
		st.Live++
		st.Ready++
	case opLoad:
		v, ok := c.Load(key)
		want, held := m.held[key]
		assert.Equal(t, held && !m.closed, ok, step)
		if ok {
			assert.Same(t, want, v, step)
		}
	case opInvalidate, opCompareAndInvalidate, opCompareAndInvalidateStale:
		var ok bool
		switch op {
		case opInvalidate:
			ok = c.Invalidate(key)
		case opCompareAndInvalidate:
			ok = c.CompareAndInvalidate(key, m.held[key])
		default:
			ok = c.CompareAndInvalidate(key, m.stale[key])
		}
		v, held := m.held[key]
		want := held && !m.closed && op != opCompareAndInvalidateStale
		require.Equal(t, want, ok, step)
		if want {
			delete(m.held, key)
			m.stale[key] = v
			m.giveUp(t, v, step)
		}
	case opFailNext:
		m.fails[key] += 1 + arg/fuzzKeys%3
		m.creates[key] += 1 + arg/fuzzKeys%3
	case opSleep:
		time.Sleep(time.Duration(arg%16) * time.Millisecond)
	case opForget:
		_, remembered := m.failed[key]
		assert.Equal(t, remembered && !m.closed, c.Forget(key), step)
		delete(m.failed, key)
	case opAll:
		got := map[int]*conn{}
		for k, v := range c.All() {
			assert.NotContains(t, got, k, "%s: All yields a key twice", step)
			got[k] = v
		}
		want := map[int]*conn{}
		if !m.closed {
			want = m.held
		}
		assert.Equal(t, want, got, step)
		assert.Equal(t, len(want), c.Len(), step)
	case opClose:
		require.NoError(t, c.Close(), step)
		if !m.closed {
			for _, v := range m.held {
				m.giveUp(t, v, step)
			}
		}
		m.closed = true
	case opAcquire:
		lease, err := c.Acquire(context.Background(), key)
		want, wantErr := m.get(key)
		if wantErr != nil {
			assert.Same(t, wantErr, err, step)
			assert.Nil(t, lease.Value(), step)
			return
		}
		require.NoError(t, err, step)
		v := lease.Value()
		if want == nil { // a creation
			require.NotNil(t, v, step)
			m.held[key] = v
			st.Creates++
			st.Live++
			st.Ready++
		} else {
			assert.Same(t, want, v, step)
		}
		m.leases[key] = append(m.leases[key], lease)
		m.leased[v]++
	case opReleaseLease:
		ls := m.leases[key]
		if len(ls) == 0 {
			return
		}
		lease := ls[0]
		m.leases[key] = ls[1:]
		v := lease.Value()
		lease.Release()
		m.leased[v]--
		if m.leased[v] == 0 && m.given[v] {
			delete(m.given, v)
			assert.EqualValues(t, 1, v.released.Load(), "%s: released by its last lease", step)
			st.Releases++
			st.Live--
			st.Lingering--
		} else {
			assert.Zero(t, v.released.Load(), "%s: released while leased or held", step)
		}
		assert.Panics(t, lease.Release, "%s: a lease released twice", step)
	case opOffer:
		v := m.offered(key)
		ok := c.Offer(key, v)
		_, held := m.held[key]
		want := !held && !m.closed
		require.Equal(t, want, ok, step)
		if !want {
			m.ledger.keepBack(v) // still the caller's
			return
		}
		m.held[key] = v
		delete(m.failed, key)
		st.Offers++
		st.Live++
		st.Ready++
	}
}

// offered makes a value for Offer, the way a transport accepts one.
func (m *cacheModel) offered(key int) *conn {
	return m.ledger.newConn(key)
}

// get is Get in the model: the held value, the remembered error, or a
// creation, whose attempts it plays out (with their retry waits on the fake
// clock). It returns a nil value and error when a new value is made.
func (m *cacheModel) get(key int) (*conn, error) {
	st := &m.expected
	if m.closed {
		return nil, epcache.ErrClosed
	}
	if v, ok := m.held[key]; ok {
		return v, nil
	}
	if until, ok := m.failed[key]; ok {
		if time.Now().Before(until) {
			st.ErrorHits++
			return nil, errFuzz
		}
		delete(m.failed, key) // expired: this Get creates
	}
	for attempt := 1; ; attempt++ {
		st.Attempts++
		if m.fails[key] == 0 {
			return nil, nil
		}
		m.fails[key]--
		if !m.retry || attempt == 2 {
			break
		}
	}
	st.CreateErrors++
	if m.ttl {
		m.failed[key] = time.Now().Add(fuzzTTL)
	}
	return nil, errFuzz
}
