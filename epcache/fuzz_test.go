package epcache_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzCache decodes its input into a sequence of operations on one cache and
// checks every result, and the whole of Stats after every step, against a
// sequential reference model. The first byte picks the hash variant and
// whether failures are remembered (ErrorTTL) and retried, and with its top
// bit set the lifecycle options (see fuzzConfig): MaxEntries of 1, 2 or 4
// and IdleTimeout; then each pair of bytes is one operation (see fuzzOp)
// and its argument. It runs in a synctest bubble, so that ErrorTTL, retry
// waits, contexts that end and idle sweeps follow the fake clock and the
// model can predict them exactly; after every step it waits until every
// goroutine of the cache (an eviction's Release, a sweep) is done. At the
// end the ledger checks that every value was released exactly once.
//
// The model cannot say which value CLOCK evicts, nor at which sweep a value
// goes, so it learns both by observation (the value's Release) and checks
// that each was allowed: an eviction only by a creation that found the
// cache full, at its start, of a value held by no lease; an idle removal
// only of a value unleased and unused for IdleTimeout to 5/4 of it, at the
// time its Release ran; no unleased value unused for longer still held.
// Everything else it predicts: whether a creation evicts or waits for room
// (and leaves on its context, with an error that wraps it), whether an Offer
// finds room, and Stats.Room. A meter counts each value from the start of
// its Create (or the return of its Offer) to the return of its Release: it
// never exceeds MaxEntries.
//
// The seed corpus is in testdata/fuzz/FuzzCache; `make fuzz-short` runs the
// fuzzer briefly, `make stress` for longer.
func FuzzCache(f *testing.F) {
	f.Add([]byte{0x00, 0, 1, 0, 1, 2, 1, 0, 1, 1, 1})
	f.Add([]byte{0x05, 5, 0x13, 0, 3, 0, 3, 6, 9, 0, 3, 7, 3, 0, 3})
	// Extended programs: an Offer answers a creation whose Create runs on,
	// its value goes while rebuilds come, Close races a last lease's end.
	f.Add([]byte{0x03, 15, 1, 2, 1, 13, 1, 17, 1, 16, 1, 0, 1, 10, 2, 18, 2, 0, 3})
	f.Add([]byte{0xf3, 15, 1, 10, 2, 2, 1, 17, 3, 6, 9, 16, 1, 0, 1, 18, 2})
	f.Add([]byte{0xb3, 0, 1, 0, 2, 2, 1, 15, 3, 2, 3, 0, 4, 2, 2, 17, 4})
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
	// Operations of lifecycle programs only (fuzzConfig), so that the
	// programs of the committed corpus before them keep their meaning.
	opGetWait     // Get with a context that ends after 2-4ms: a wait for room may end by it
	opAcquireWait // the same for Acquire
	numFuzzOps
)

// Operations of extended programs only (fuzzConfig.extended).
const (
	opAnswer    = numFuzzOps + iota // a Get whose Create blocks, answered by an Offer: its Create runs on
	opFinish                        // the key's Create that an Offer answered returns a value, now unwanted
	opChurn                         // Invalidate the key while other keys come and go, rebuilding the shard
	opCloseLast                     // end the key's last lease of a value given up, with a Release that blocks, as Close runs
	numExtOps
)

// numBaseOps is the number of operations of programs without the lifecycle
// options.
const numBaseOps = opGetWait

var errFuzz = errors.New("fuzz: peer refused")

const (
	fuzzTTL       = 5 * time.Millisecond
	fuzzRetryWait = time.Millisecond
	fuzzKeys      = 16 // few enough to collide, enough that the shard's array grows and compacts
	fuzzIdle      = 8 * time.Millisecond
)

// fuzzConfig is the first byte of a FuzzCache program:
//
//	bits 0-1: the hash variant
//	bit 2:    ErrorTTL
//	bit 3:    Retry (two attempts, 1ms apart)
//	bits 4-5: MaxEntries 0 (none), 1, 2 or 4, with bit 7
//	bit 6:    IdleTimeout of 8ms (a sweep every 2ms), with bit 7
//	bit 7:    lifecycle: the options of bits 4-6, and the operations after opOffer
//
// Bits 4-6 mean nothing without bit 7, so that the committed corpus, whose
// first bytes predate them, keeps its meaning. Hash variant 3 (bits 0-1 both
// set), the seeded hash like variant 0, marks an extended program: a cache
// of one shard, whose operations include those after numFuzzOps.
type fuzzConfig byte

func (b fuzzConfig) lifecycle() bool { return b&0x80 != 0 }

func (b fuzzConfig) extended() bool { return b&3 == 3 }

func (b fuzzConfig) maxEntries() int {
	if !b.lifecycle() {
		return 0
	}
	return [4]int{0, 1, 2, 4}[b>>4&3]
}

func (b fuzzConfig) idle() time.Duration {
	if !b.lifecycle() || b&0x40 == 0 {
		return 0
	}
	return fuzzIdle
}

// releaseTimes records when each value's Release ran, on whichever
// goroutine ran it (an eviction's, a sweep's), and any Release of a value
// a lease held.
type releaseTimes struct {
	mu     sync.Mutex
	at     map[*record]time.Time // by record, so as not to keep released values reachable
	leased []*record
}

func (r *releaseTimes) record(v *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at[v.record] = time.Now()
	if v.leases.Load() != 0 {
		r.leased = append(r.leased, v.record)
	}
}

func (r *releaseTimes) of(v *conn) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at[v.record]
}

// cacheModel is the sequential specification of a Cache.
type cacheModel struct {
	held     map[int]*conn              // ready values
	failed   map[int]time.Time          // remembered failures and the time they expire
	stale    map[int]weak.Pointer[conn] // each key's last value given up, held weakly (see reachable)
	fails    map[int]int                // attempts to create the key that will fail, in the model
	creates  map[int]int                // the same, for the real Create
	leases   map[int][]epcache.Lease[int, *conn]
	leased   map[*conn]int  // leases held on each value
	given    map[*conn]bool // values given up while leased: released by their last lease
	closed   bool
	ttl      bool
	retry    bool
	expected epcache.Stats
	ledger   *ledger

	// The lifecycle options.
	maxEntries int
	idle       time.Duration
	lastUse    map[*conn]time.Time // held values: their last use (a lease counts until it ends)
	released   *releaseTimes
	meter      *meter
	evicts     bool // the step's creation found the cache full: it evicts a value at its start

	// Extended programs: creations answered by an Offer whose Create runs
	// on (stragglers, each holding a unit of room until it returns, and
	// blocking its key's next creation), and Releases made to block.
	stragglers map[int]straggler // by key
	gateMu     sync.Mutex
	gates      map[int]chan struct{} // the gate the key's next Create waits on, if any
	closing    chan struct{}         // closed just before Close: a Create still waiting returns an error
	churned    int                   // keys churned so far, from churnKeys up
	blockOn    atomic.Pointer[conn]  // its Release waits on unblock, set first
	unblock    chan struct{}
}

// straggler is a creation an Offer answered, whose Create runs on.
type straggler struct {
	gate    chan struct{} // closed to let its Create return
	offered *record       // the value that answered it, which its flight holds until then
	started time.Time     // when its Create began
}

// churnKeys is the first key opChurn uses: above every key of the model.
const churnKeys = 1 << 20

func runCacheOps(t *testing.T, data []byte) {
	cfgByte := fuzzConfig(data[0])
	hash := hashVariants[int(data[0]%4)%len(hashVariants)].hash
	m := &cacheModel{
		held: map[int]*conn{}, failed: map[int]time.Time{}, stale: map[int]weak.Pointer[conn]{},
		fails: map[int]int{}, creates: map[int]int{},
		leases: map[int][]epcache.Lease[int, *conn]{}, leased: map[*conn]int{}, given: map[*conn]bool{},
		ttl: data[0]&4 != 0, retry: data[0]&8 != 0,
		maxEntries: cfgByte.maxEntries(), idle: cfgByte.idle(),
		lastUse: map[*conn]time.Time{}, released: &releaseTimes{at: map[*record]time.Time{}}, meter: new(meter),
		stragglers: map[int]straggler{}, gates: map[int]chan struct{}{}, closing: make(chan struct{}),
	}
	l := newLedger()
	m.ledger = l
	c := newCache(t, l, hash, func(cfg *epcache.Config[int, *conn]) {
		cfg.Create = func(_ context.Context, key int) (*conn, error) {
			m.meter.add()
			l.enter(key)
			defer l.leave(key)
			m.gateMu.Lock()
			gate := m.gates[key]
			delete(m.gates, key)
			m.gateMu.Unlock()
			if gate != nil { // opAnswer's: it ignores its context, as a dial may
				select {
				case <-gate:
					return l.newConn(key), nil
				case <-m.closing:
					m.meter.done()
					return nil, errFuzz
				}
			}
			if m.creates[key] > 0 { // the Get that started this waits: no race
				m.creates[key]--
				m.meter.done()
				return nil, errFuzz
			}
			return l.newConn(key), nil
		}
		cfg.Release = func(key int, v *conn) {
			if v == m.blockOn.Load() {
				<-m.unblock
			}
			m.released.record(v)
			l.release(key, v)
			m.meter.done()
		}
		if cfgByte.extended() {
			cfg.Shards = 1 // every insertion into one shard: rebuilds come often
		}
		if m.ttl {
			cfg.ErrorTTL = fuzzTTL
		}
		if m.retry {
			cfg.Retry = func(attempt int, _ error) (time.Duration, bool) { return fuzzRetryWait, attempt < 2 }
		}
		cfg.MaxEntries, cfg.IdleTimeout = m.maxEntries, m.idle
	})
	ops := byte(numBaseOps)
	if cfgByte.lifecycle() {
		ops = byte(numFuzzOps)
	}
	if cfgByte.extended() {
		ops = byte(numExtOps)
	}
	data = data[1:]
	for i := 0; i+1 < len(data); i += 2 {
		op, arg := fuzzOp(data[i]%ops), int(data[i+1])
		key := arg % fuzzKeys
		step := fmt.Sprintf("step %d (%v): op %d key %d", i/2, time.Since(fuzzEpoch), op, key)
		start := time.Now()
		m.evicts = false
		m.apply(t, c, op, key, arg, step)
		synctest.Wait() // an eviction's Release, a sweep: each has run to its end
		m.observe(t, start, step)
		m.check(t, c, step)
		if t.Failed() {
			t.FailNow()
		}
	}
	if cfgByte.extended() && !m.closed {
		m.checkReachable(t)
	}
	m.apply(t, c, opClose, 0, 0, "final Close")
	m.check(t, c, "final Close")
	// Every lease still held ends now: the values given up are released.
	for key := range fuzzKeys {
		for len(m.leases[key]) > 0 {
			m.apply(t, c, opReleaseLease, key, key, "final lease releases")
		}
	}
	st := c.Stats()
	require.Zero(t, st.Lingering)
	assert.Zero(t, st.Room, "room left taken once every value was released")
	assert.LessOrEqual(t, st.Evictions+st.IdleRemovals, st.Releases)
	assert.Zero(t, m.meter.live.Load(), "values whose Release never returned")
	m.released.mu.Lock()
	assert.Empty(t, m.released.leased, "values released while a lease held them")
	m.released.mu.Unlock()
	// newCache's cleanup has the ledger check every release.
}

// fuzzEpoch is the start of every synctest bubble's clock.
var fuzzEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// check compares Stats with the model after a step, and the meter with
// MaxEntries.
func (m *cacheModel) check(t *testing.T, c *epcache.Cache[int, *conn], step string) {
	if m.maxEntries > 0 {
		// Between steps the only creations running are the stragglers:
		// the room taken is theirs and the values not yet released, held
		// or lingering.
		m.expected.Room = m.expected.Live + int64(len(m.stragglers))
		require.LessOrEqual(t, m.used(), m.maxEntries, "%s: the model holds more than MaxEntries", step)
		assert.LessOrEqual(t, m.meter.peak.Load(), int64(m.maxEntries), "%s: values alive plus creations exceeded MaxEntries", step)
	}
	require.Equal(t, m.expected, c.Stats(), "%s: Stats", step)
	assert.Equal(t, m.expected.Live+int64(len(m.stragglers)), m.meter.live.Load(), "%s: values alive by the meter, and Creates running", step)
	m.released.mu.Lock()
	assert.Empty(t, m.released.leased, "%s: values released while a lease held them", step)
	m.released.mu.Unlock()
}

// observe learns which held values the cache removed by itself during the
// step that started at start (an eviction, idle removals), and checks that
// each removal was allowed and that no value overstayed its IdleTimeout.
func (m *cacheModel) observe(t *testing.T, start time.Time, step string) {
	st := &m.expected
	evicted := false
	for _, key := range slices.Sorted(maps.Keys(m.held)) {
		v := m.held[key]
		if m.closed || v.released.Load() == 0 {
			continue
		}
		at, lastUse := m.released.of(v), m.lastUse[v]
		assert.Zero(t, m.leased[v], "%s: %v removed while leased", step, v)
		delete(m.held, key)
		delete(m.lastUse, v)
		m.stale[key] = weak.Make(v)
		st.Ready--
		st.Releases++
		st.Live--
		if m.evicts && !evicted && at.Equal(start) {
			evicted = true
			st.Evictions++
			continue
		}
		require.NotZero(t, m.idle, "%s: %v removed with no eviction due and no IdleTimeout", step, v)
		unused := at.Sub(lastUse)
		assert.GreaterOrEqual(t, unused, m.idle, "%s: %v removed as idle after %v unused", step, v, unused)
		assert.LessOrEqual(t, unused, m.idle*5/4, "%s: %v removed as idle only after %v unused", step, v, unused)
		st.IdleRemovals++
	}
	assert.Equal(t, m.evicts, evicted, "%s: the creation that found the cache full evicted no unleased value", step)
	if m.idle == 0 || m.closed {
		return
	}
	for _, v := range m.held {
		if m.leased[v] == 0 {
			assert.LessOrEqual(t, time.Since(m.lastUse[v]), m.idle*5/4, "%s: %v still held, unused since %v", step, v, m.lastUse[v].Sub(fuzzEpoch))
		}
	}
}

// used is the room taken between steps: the values not yet released,
// held or lingering (Close gave up the held ones).
func (m *cacheModel) used() int {
	if m.closed {
		return len(m.given)
	}
	return len(m.held) + len(m.given) + len(m.stragglers)
}

// straggling reports whether a Get of key waits for a straggler (a
// creation an Offer answered, whose Create still runs) before it may
// create.
func (m *cacheModel) straggling(key int) bool {
	_, held := m.held[key]
	_, running := m.stragglers[key]
	return running && !held && !m.closed
}

// evictable reports whether a held value is free of leases.
func (m *cacheModel) evictable() bool {
	for _, v := range m.held {
		if m.leased[v] == 0 {
			return true
		}
	}
	return false
}

// needsRoom reports what a Get or Acquire of key would do for room, in
// the state before it: whether it creates in a full cache, and if so
// whether it evicts a value (or else waits for room until its context
// ends).
func (m *cacheModel) needsRoom(key int) (full, evicts bool) {
	if m.closed || m.maxEntries == 0 || m.straggling(key) {
		return false, false
	}
	if _, ok := m.held[key]; ok {
		return false, false
	}
	if until, ok := m.failed[key]; ok && time.Now().Before(until) {
		return false, false
	}
	if m.used() < m.maxEntries {
		return false, false
	}
	return true, m.evictable()
}

// waitCtx is the context of opGetWait and opAcquireWait: it ends after
// 2-4ms, past a creation's retry wait (1ms).
func waitCtx(arg int) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Duration(2+arg/fuzzKeys%3)*time.Millisecond)
}

// noRoom checks the outcome of a Get or Acquire that found the cache full
// of leased values: an error that wraps its context's, after waiting for
// room until its context ended.
func (m *cacheModel) noRoom(t *testing.T, err error, start time.Time, arg int, step string) {
	assert.ErrorIs(t, err, context.DeadlineExceeded, step)
	assert.ErrorContains(t, err, "no room", step)
	assert.Equal(t, time.Duration(2+arg/fuzzKeys%3)*time.Millisecond, time.Since(start), "%s: waited for room until its context ended", step)
	observe(&m.expected.RoomWait, time.Duration(2+arg/fuzzKeys%3)*time.Millisecond)
	m.expected.Cancels++
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
	case opGet, opGetWait:
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if op == opGetWait {
			ctx, cancel = waitCtx(arg)
		}
		defer cancel()
		full, evicts := m.needsRoom(key)
		if full && !evicts && op == opGet {
			return // it would wait for room for ever
		}
		if m.straggling(key) {
			if op == opGet {
				return // it would wait for the straggler for ever
			}
			start := time.Now()
			_, err := c.Get(ctx, key)
			m.leftStraggling(t, err, start, arg, step)
			return
		}
		start := time.Now()
		v, err := c.Get(ctx, key)
		if full {
			m.expected.RoomWaits++
			if evicts {
				observe(&m.expected.RoomWait, 0) // the eviction's Release takes no fake time
			}
			if !evicts {
				m.noRoom(t, err, start, arg, step)
				return
			}
			m.evicts = true
		}
		want, wantErr := m.get(key)
		if wantErr != nil {
			assert.Same(t, wantErr, err, step)
			assert.Nil(t, v, step)
			return
		}
		require.NoError(t, err, step)
		if want != nil {
			assert.Same(t, want, v, step)
			m.lastUse[v] = time.Now()
			return
		}
		// A creation: a new value of this key, never seen before.
		require.NotNil(t, v, step)
		assert.Equal(t, key, v.key, step)
		for _, old := range m.held {
			assert.NotSame(t, old, v, step)
		}
		m.held[key] = v
		m.lastUse[v] = time.Now()
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
			ok = c.CompareAndInvalidate(key, m.stale[key].Value()) // nil, if collected: never held
		}
		v, held := m.held[key]
		want := held && !m.closed && op != opCompareAndInvalidateStale
		require.Equal(t, want, ok, step)
		if want {
			delete(m.held, key)
			delete(m.lastUse, v)
			m.stale[key] = weak.Make(v)
			m.giveUp(t, v, step)
		}
	case opFailNext:
		m.fails[key] += 1 + arg/fuzzKeys%3
		m.creates[key] += 1 + arg/fuzzKeys%3
	case opSleep:
		time.Sleep(time.Duration(arg%16) * time.Millisecond)
	case opForget:
		// An expired failure is not reported, whether or not a rebuild
		// has dropped its slot yet.
		until, remembered := m.failed[key]
		inForce := remembered && time.Now().Before(until)
		assert.Equal(t, inForce && !m.closed, c.Forget(key), step)
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
		m.close(t, c, func() { require.NoError(t, c.Close(), step) }, step)
	case opAcquire, opAcquireWait:
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if op == opAcquireWait {
			ctx, cancel = waitCtx(arg)
		}
		defer cancel()
		full, evicts := m.needsRoom(key)
		if full && !evicts && op == opAcquire {
			return // it would wait for room for ever
		}
		if m.straggling(key) {
			if op == opAcquire {
				return // it would wait for the straggler for ever
			}
			start := time.Now()
			lease, err := c.Acquire(ctx, key)
			m.leftStraggling(t, err, start, arg, step)
			assert.Nil(t, lease.Value(), step)
			return
		}
		start := time.Now()
		lease, err := c.Acquire(ctx, key)
		if full {
			m.expected.RoomWaits++
			if evicts {
				observe(&m.expected.RoomWait, 0) // the eviction's Release takes no fake time
			}
			if !evicts {
				m.noRoom(t, err, start, arg, step)
				assert.Nil(t, lease.Value(), step)
				return
			}
			m.evicts = true
		}
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
		v.leases.Add(1)
		m.lastUse[v] = time.Now()
	case opReleaseLease:
		ls := m.leases[key]
		if len(ls) == 0 {
			return
		}
		lease := ls[0]
		ls[0] = epcache.Lease[int, *conn]{} // the slice must not keep the value reachable
		m.leases[key] = ls[1:]
		v := lease.Value()
		v.leases.Add(-1)
		lease.Release()
		if m.leased[v]--; m.leased[v] == 0 {
			delete(m.leased, v) // a map entry must not keep v reachable
		}
		if m.held[key] == v {
			m.lastUse[v] = time.Now() // used until now
		}
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
		want := !held && !m.closed && (m.maxEntries == 0 || m.used() < m.maxEntries)
		require.Equal(t, want, ok, step)
		if !want {
			m.ledger.keepBack(v) // still the caller's
			return
		}
		m.meter.add()
		m.held[key] = v
		m.lastUse[v] = time.Now()
		delete(m.failed, key)
		st.Offers++
		st.Live++
		st.Ready++
	case opAnswer:
		m.answer(t, c, key, step)
	case opFinish:
		s, ok := m.stragglers[key]
		if !ok {
			return
		}
		close(s.gate)
		synctest.Wait() // its value is made, and released: nobody wants it
		delete(m.stragglers, key)
		m.took(epcache.OutcomeOffered, time.Since(s.started))
		st.Creates++
		st.Releases++
	case opChurn:
		m.churn(t, c, key, arg, step)
	case opCloseLast:
		m.closeLast(t, c, key, step)
	}
}

// answer is opAnswer: a Get of key whose Create blocks, answered by an
// Offer. The Get gets the offered value at once; the Create runs on
// (ignoring its context, as a dial may) until opFinish or Close, and until
// then no other creation of key starts. Only where the key is free: not
// held, no failure remembered or to come, no straggler, and room for the
// creation and the offered value.
func (m *cacheModel) answer(t *testing.T, c *epcache.Cache[int, *conn], key int, step string) {
	st := &m.expected
	if m.closed || m.fails[key] > 0 || (m.maxEntries > 0 && m.used()+2 > m.maxEntries) {
		return
	}
	if _, held := m.held[key]; held {
		return
	}
	if _, remembered := m.failed[key]; remembered {
		return // expired or not, it would make the model's bookkeeping of it differ
	}
	if _, running := m.stragglers[key]; running {
		return
	}
	gate := make(chan struct{})
	m.gateMu.Lock()
	m.gates[key] = gate
	m.gateMu.Unlock()
	ctx, cancel := context.WithCancel(context.Background()) // Create runs on its own goroutine
	defer cancel()
	got := make(chan *conn, 1)
	go func() {
		v, err := c.Get(ctx, key)
		assert.NoError(t, err, step)
		got <- v
	}()
	synctest.Wait() // its Create waits at the gate
	v := m.offered(key)
	require.True(t, c.Offer(key, v), "%s: an Offer answers a creation in flight", step)
	assert.Same(t, v, <-got, "%s: the Get that started the creation gets the offered value", step)
	m.stragglers[key] = straggler{gate, v.record, time.Now()}
	m.meter.add()
	m.held[key] = v
	m.lastUse[v] = time.Now()
	st.Attempts++
	st.Offers++
	st.Live++
	st.Ready++
}

// churn is opChurn: key is invalidated while another goroutine offers and
// invalidates fresh keys of the one shard, whose insertions rebuild its
// array again and again; each Offer the cache takes (it takes none when
// it is full) counts as an offer, released at once.
func (m *cacheModel) churn(t *testing.T, c *epcache.Cache[int, *conn], key, arg int, step string) {
	st := &m.expected
	n := 32 + arg%64
	first := churnKeys + m.churned
	m.churned += n
	offered := make(chan int, 1)
	go func() {
		taken := 0
		for k := first; k < first+n; k++ {
			v := m.ledger.newConn(k)
			if !c.Offer(k, v) {
				m.ledger.keepBack(v)
				continue
			}
			m.meter.add()
			taken++
			if !c.Invalidate(k) {
				t.Errorf("%s: churn key %d offered, then not held", step, k)
			}
		}
		offered <- taken
	}()
	m.apply(t, c, opInvalidate, key, arg, step)
	taken := <-offered
	st.Offers += uint64(taken)
	st.Releases += uint64(taken)
}

// closeLast is opCloseLast: the key's oldest lease is made the last of a
// value given up (invalidated first, if the key holds it), and is ended on
// a goroutine of its own, with a Release that blocks, while Close runs:
// Close must not return before that Release has. Only where that lease is
// its value's only one.
func (m *cacheModel) closeLast(t *testing.T, c *epcache.Cache[int, *conn], key int, step string) {
	st := &m.expected
	ls := m.leases[key]
	if m.closed || len(ls) == 0 || m.leased[ls[0].Value()] != 1 {
		return
	}
	lease := ls[0]
	v := lease.Value()
	if m.held[key] == v {
		m.apply(t, c, opInvalidate, key, key, step)
	}
	ls[0] = epcache.Lease[int, *conn]{} // the slice must not keep the value reachable
	m.leases[key] = ls[1:]
	delete(m.leased, v) // its only lease
	m.unblock = make(chan struct{})
	m.blockOn.Store(v)
	ended := make(chan struct{})
	go func() {
		v.leases.Add(-1)
		lease.Release()
		close(ended)
	}()
	synctest.Wait() // its Release has begun, and waits
	closed := make(chan struct{})
	m.close(t, c, func() {
		go func() {
			assert.NoError(t, c.Close(), step)
			close(closed)
		}()
		synctest.Wait()
		select {
		case <-closed:
			t.Errorf("%s: Close returned while the Release of the last lease, begun before it, ran", step)
		default:
		}
		close(m.unblock)
		<-closed
	}, step)
	<-ended
	m.blockOn.Store(nil)
	delete(m.given, v)
	assert.EqualValues(t, 1, v.released.Load(), "%s: released by its last lease", step)
	st.Releases++
	st.Live--
	st.Lingering--
}

// checkReachable checks that the cache holds no value it has released:
// after a full collection, the only released values still reachable are
// those that answered a creation whose Create still runs (its flight holds
// the value that answered it). The model holds released values only
// weakly, and every value through the ledger's records.
func (m *cacheModel) checkReachable(t *testing.T) {
	answering := map[*record]bool{}
	for _, s := range m.stragglers {
		answering[s.offered] = true
	}
	runtime.GC()
	runtime.GC()
	m.ledger.mu.Lock()
	defer m.ledger.mu.Unlock()
	for _, r := range m.ledger.created {
		if r.released.Load() > 0 && r.value.Value() != nil && !answering[r] {
			t.Errorf("%v was released and is still reachable", r)
		}
	}
}

// close runs closeCache, which closes c, and makes the model closed: the
// stragglers' Creates, which wait for their gates or for this, return an
// error first, which counts nowhere (their flights were answered).
func (m *cacheModel) close(t *testing.T, c *epcache.Cache[int, *conn], closeCache func(), step string) {
	if !m.closed {
		close(m.closing)
	}
	closeCache()
	if !m.closed {
		for _, v := range m.held {
			m.giveUp(t, v, step)
		}
		for _, s := range m.stragglers { // answered by an Offer: so they count
			m.took(epcache.OutcomeOffered, time.Since(s.started))
		}
		clear(m.stragglers)
	}
	m.closed = true
}

// took counts a creation that ended with outcome after d in
// Stats.CreateLatency. On the fake clock a creation takes no time but its
// retry waits (and a straggler's until it returns).
func (m *cacheModel) took(outcome epcache.Outcome, d time.Duration) {
	observe(&m.expected.CreateLatency[outcome], d)
}

// observe counts d in h, as the cache does.
func observe(h *epcache.Histogram, d time.Duration) {
	i := 0
	for d > epcache.HistogramBound(i) {
		i++
	}
	h.Counts[i]++
	h.Sum += d
}

// leftStraggling checks the outcome of a Get or Acquire of a key that waits
// for a straggler, with a context that ends: it waited until its context ended,
// and got the context's error.
func (m *cacheModel) leftStraggling(t *testing.T, err error, start time.Time, arg int, step string) {
	assert.ErrorIs(t, err, context.DeadlineExceeded, step)
	assert.Equal(t, time.Duration(2+arg/fuzzKeys%3)*time.Millisecond, time.Since(start), "%s: waited for the straggler until its context ended", step)
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
	attempt := 1
	for ; ; attempt++ {
		st.Attempts++
		if m.fails[key] == 0 {
			m.took(epcache.OutcomeValue, time.Duration(attempt-1)*fuzzRetryWait)
			return nil, nil
		}
		m.fails[key]--
		if !m.retry || attempt == 2 {
			break
		}
	}
	m.took(epcache.OutcomeError, time.Duration(attempt-1)*fuzzRetryWait)
	st.CreateErrors++
	if m.ttl {
		m.failed[key] = time.Now().Add(fuzzTTL)
	}
	return nil, errFuzz
}
