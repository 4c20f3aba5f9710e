package shard_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzTable decodes its input into a sequence of insertions, claims,
// publications, failures, invalidations, lookups and bursts of new keys
// (which grow the shard and compact its Empty slots away), and checks the
// table after every step against a sequential model: a map from key to the
// value or failure it holds. The first byte picks the hash (seeded, always
// 0, or 3 buckets) and the shard count; then each pair of bytes is one
// operation (see tableOp) and its key.
//
// Beyond the values, it checks the slot invariants the cache relies on: a
// key that holds a value or a failure keeps its slot (same address) through
// growth; a slot that left the table can no longer be claimed, so a value is
// never published where no lookup finds it; and Seal reports exactly the
// slots that hold something.
//
// With the top bit of the first byte set, programs also draw the operations
// of ages and leases (after topForget): the clock hand's Cool, the idle
// sweep's Age, a use's Touch, InvalidateState with the state a step saw
// (stale or not), a Hand's walk, and leases of the values (Lease, the hit
// path's Table.Lease, EndLease, Want, and Abandon after every
// invalidation). The model keeps each value's age and leases: Touch makes
// it young, Cool cools a young value and reports any aged one, Age reports
// it expired after IdleSteps steps, InvalidateState succeeds only with the
// state the value is in and no lease held, the hit path leases only a
// young value, two laps of the hand see every slot, Leased counts the
// leases held, a lease held when its value was marked watched never ends
// on TryEnd's fast path (nor does the one after it, on the same
// ticket: the want is served once), and the last lease of a value that left the table says so. With the next bit set too, the
// table puts values on probation (SetProbation): they are published cooled.
//
// The seed corpus is in testdata/fuzz/FuzzTable.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 1, 3, 5, 3, 1, 3, 7, 0, 4, 3})
	f.Add([]byte{1, 1, 0, 1, 1, 7, 255, 8, 0, 9, 0, 4, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 401 {
			return
		}
		runTableOps(t, data)
	})
}

// tableOp is an operation of FuzzTable, chosen by the first byte of a pair.
type tableOp uint8

const (
	topInsert       tableOp = iota // LoadOrInsert: an Empty slot at most
	topPublish                     // claim and publish a new value
	topAbandon                     // claim, then settle back to Empty
	topInvalidate                  // Invalidate the key's slot
	topInvalidateIf                // InvalidateIf, matching the held value or another
	topLoad                        // Load, Lookup and Get
	topBurst                       // insert 1-32 new keys, Empty or published: growth and compaction
	topStaleClaim                  // claim the slot an earlier step saw for the key
	topFail                        // claim, then settle to a remembered failure
	topForget                      // Forget a remembered failure
	// Operations of programs with the top bit of their first byte set, so
	// that the programs of the committed corpus before them keep their
	// meaning.
	topTouch           // a use: Touch
	topCool            // the clock hand's step: Cool
	topAge             // the idle sweep's step: Age
	topInvalidateState // InvalidateState with the state the last step saw for the key, or the current one
	topWalk            // walk the table with All: every slot once, every slot that holds something
	topLease           // lease the key's value, on the hit path if it is young
	topEndLease        // end the key's oldest lease, or that of a value that left the table
	topWatch           // mark the key's value watched
	numTableOps
)

// numBaseTableOps is the number of operations of programs without the top
// bit.
const numBaseTableOps = topTouch

// ageCooled and ageIdle are ages in the model: 0 is young, ageCooled the
// clock hand's cooled, ageIdle+n idle for n sweeps, up to IdleSteps.
const (
	ageCooled = 1
	ageIdle   = 1
)

// seenState is a state a step saw for a key, with its age in the model
// (-1: not a value).
type seenState struct {
	st  *shard.State[int]
	age int
}

// drainingLease is a lease of a value that left the table.
type drainingLease struct {
	s  *shard.Slot[int, int]
	tk shard.Ticket
}

const (
	fuzzSmallKeys = 32
	burstBase     = 1000 // burst keys are burstBase+1, +2, …
	maxBurstKeys  = 512  // in all: lookups under the zero hash are linear
)

// tableModel is the sequential specification of a Table: what each key holds.
type tableModel struct {
	values map[int]int                   // published values
	failed map[int]bool                  // remembered failures
	slots  map[int]*shard.Slot[int, int] // the slot of each key that holds something
	seen   map[int]*shard.Slot[int, int] // the last slot any step got for the key
	next   int                           // the next value, and the next burst key

	// Ages and leases (programs with the top bit).
	ages      bool
	age       map[int]int            // held keys: their value's age
	states    map[int]seenState      // the last state a step saw for the key
	leases    map[int][]shard.Ticket // leases of each held key's value, oldest first
	watched   map[shard.Ticket]bool  // leases held when their value was marked watched
	draining  []drainingLease        // leases of values that left the table, oldest first
	published int                    // the age Publish gives a value: young, or cooled on probation (SetProbation)
}

func runTableOps(t *testing.T, data []byte) {
	hashes := []func(int) uint64{nil, func(int) uint64 { return 0 }, func(k int) uint64 { return uint64(k % 3) }}
	tb := newTable[int, int](t, shard.Options[int]{Hash: hashes[int(data[0])%3], Shards: 1 + int(data[0]/3%2)})
	m := &tableModel{
		values: map[int]int{}, failed: map[int]bool{},
		slots: map[int]*shard.Slot[int, int]{}, seen: map[int]*shard.Slot[int, int]{},
		next: burstBase,
		ages: data[0]&0x80 != 0, age: map[int]int{}, states: map[int]seenState{},
		leases: map[int][]shard.Ticket{}, watched: map[shard.Ticket]bool{},
	}
	ops := byte(numBaseTableOps)
	if m.ages {
		ops = byte(numTableOps)
		if data[0]&0x40 != 0 {
			tb.SetProbation()
			m.published = ageCooled
		}
	}
	data = data[1:]
	for i := 0; i+1 < len(data); i += 2 {
		op, arg := tableOp(data[i]%ops), int(data[i+1])
		step := fmt.Sprintf("step %d: op %d arg %d", i/2, op, arg)
		m.apply(t, tb, op, arg, step)
		m.check(t, tb, step, op == topBurst || i+3 >= len(data))
		if t.Failed() {
			t.FailNow()
		}
	}
	m.seal(t, tb)
}

var errRemembered = errors.New("remembered failure")

func (m *tableModel) apply(t *testing.T, tb *shard.Table[int, int], op tableOp, arg int, step string) {
	key := arg % fuzzSmallKeys
	switch op {
	case topInsert:
		s := tb.LoadOrInsert(key)
		m.seen[key] = s
		require.Equal(t, key, s.Key(), step)
		require.NotEqual(t, shard.Dead, s.State().Status(), "%s: LoadOrInsert returned a Dead slot", step)
	case topPublish, topAbandon, topFail:
		s := tb.LoadOrInsert(key)
		m.seen[key] = s
		claim, _, ok := s.Claim(s.State(), nil)
		_, held := m.values[key]
		// An Empty slot and a remembered failure can be claimed; a value cannot.
		require.Equal(t, !held, ok, "%s: Claim", step)
		if !ok {
			return
		}
		delete(m.failed, key)
		delete(m.slots, key)
		switch op {
		case topPublish:
			m.next++
			require.True(t, tb.Publish(s, claim, m.next), step)
			m.values[key], m.slots[key] = m.next, s
			m.age[key] = m.published
		case topAbandon:
			require.True(t, s.Settle(claim, nil), step)
		default:
			require.True(t, s.Settle(claim, shard.NewFailure[int](errRemembered, time.Now().Add(time.Hour))), step)
			m.failed[key], m.slots[key] = true, s
		}
	case topInvalidate, topInvalidateIf:
		s := tb.Lookup(key)
		want, held := m.values[key]
		if s == nil {
			require.False(t, held, "%s: a key with a value has no slot", step)
			return
		}
		m.seen[key] = s
		var v int
		var ok bool
		match := want
		if op == topInvalidate {
			v, ok = tb.Invalidate(s)
		} else {
			if arg&0x80 != 0 {
				match = want + 1 // a late report about another value
			}
			v, ok = tb.InvalidateIf(s, func(v int) bool { return v == match })
		}
		require.Equal(t, held && match == want, ok, "%s: Invalidate", step)
		if ok {
			assert.Equal(t, want, v, step)
			assert.Equal(t, shard.Dead, s.State().Status(), step)
			m.left(t, key, s, step)
		}
	case topLoad:
		// check covers every key after each step.
	case topBurst:
		for range 1 + arg%32 {
			if m.next >= burstBase+maxBurstKeys {
				break
			}
			m.next++
			k := m.next
			s := tb.LoadOrInsert(k)
			if k%4 == 0 {
				claim, _, ok := s.Claim(nil, nil)
				require.True(t, ok, "%s: claim of new key %d", step, k)
				require.True(t, tb.Publish(s, claim, k), step)
				m.values[k], m.slots[k] = k, s
			}
		}
	case topStaleClaim:
		s := m.seen[key]
		if s == nil {
			return
		}
		claim, _, ok := s.Claim(nil, nil)
		if !ok {
			return
		}
		// The claim won: the slot must still be the key's, or the value
		// published next would be lost.
		require.Same(t, s, tb.Lookup(key), "%s: a slot that left the table was claimed", step)
		_, held := m.values[key]
		require.False(t, held && m.slots[key] != s, "%s: two live slots for one key", step)
		m.next++
		require.True(t, tb.Publish(s, claim, m.next), step)
		m.values[key], m.slots[key] = m.next, s
		m.age[key] = m.published
		delete(m.failed, key)
	case topForget:
		s := tb.Lookup(key)
		if s == nil {
			require.False(t, m.failed[key], step)
			return
		}
		require.Equal(t, m.failed[key], s.Forget(s.State()), "%s: Forget", step)
		if m.failed[key] {
			delete(m.failed, key)
			delete(m.slots, key)
		}
	default:
		m.applyAges(t, tb, op, arg, step)
	}
}

// left is the model of key's value leaving the table from slot s: its
// owner abandons it, which releases it now if no lease holds it; its
// leases go on, and the last of them will release it.
func (m *tableModel) left(t *testing.T, key int, s *shard.Slot[int, int], step string) {
	delete(m.values, key)
	delete(m.slots, key)
	if !m.ages {
		return
	}
	leases := m.leases[key]
	assert.Equal(t, len(leases) == 0, s.Abandon(), "%s: Abandon releases a value no lease holds, and only such", step)
	for _, tk := range leases {
		m.draining = append(m.draining, drainingLease{s, tk})
	}
	_, ok := s.Lease(nil)
	assert.False(t, ok, "%s: a value that left the table was leased", step)
	for _, tk := range leases {
		delete(m.watched, tk)
	}
	delete(m.leases, key)
	delete(m.age, key)
}

// applyAges applies the operations of ages and leases.
func (m *tableModel) applyAges(t *testing.T, tb *shard.Table[int, int], op tableOp, arg int, step string) {
	key := arg % fuzzSmallKeys
	_, held := m.values[key]
	s := tb.Lookup(key)
	if op == topWalk {
		m.walk(t, tb, step)
		return
	}
	if op == topEndLease && arg&0x80 != 0 {
		m.endDraining(t, step)
		return
	}
	if s == nil {
		require.False(t, held, "%s: a key with a value has no slot", step)
		return
	}
	m.seen[key] = s
	st := s.State()
	age := -1
	if held {
		age = m.age[key]
		require.Equal(t, age == 0, tb.Young(st), "%s: key %d of age %d", step, key, age)
	}
	prev, seenBefore := m.states[key]
	m.states[key] = seenState{st, age}
	switch op {
	case topTouch:
		require.Equal(t, held, tb.Touch(s, st), "%s: Touch", step)
		if held {
			m.age[key] = 0
		}
	case topCool:
		require.Equal(t, held && age > 0, tb.Cool(s, st), "%s: Cool of age %d", step, age)
		if held && age == 0 {
			m.age[key] = ageCooled
		}
	case topAge:
		expired := held && age == ageIdle+shard.IdleSteps
		require.Equal(t, expired, tb.Age(s, st), "%s: Age of age %d", step, age)
		switch {
		case !held || expired:
		case age == 0:
			m.age[key] = ageIdle + 1 // a sweep ages a young value as a cooled one
		default:
			m.age[key] = age + 1
		}
	case topInvalidateState:
		use := seenState{st, age}
		if arg&0x40 != 0 && seenBefore {
			use = prev // the state an earlier step saw: stale unless nothing changed
		}
		m.states[key] = use
		v, ok := tb.InvalidateState(s, use.st)
		// Only with the state the value is in, and never from under a
		// lease: eviction and idle removal never take a leased value.
		want := held && use.age >= 0 && use.age == age && len(m.leases[key]) == 0
		require.Equal(t, want, ok, "%s: InvalidateState with a state of age %d, the value's %d, %d leases held", step, use.age, age, len(m.leases[key]))
		if ok {
			assert.Equal(t, m.values[key], v, step)
			assert.Equal(t, shard.Dead, s.State().Status(), step)
			m.left(t, key, s, step)
		}
	case topLease:
		hs, tk, ok := tb.Lease(key)
		require.Equal(t, held && age == 0, ok, "%s: the hit path's Lease of a value of age %d", step, age)
		if !held {
			return
		}
		if ok {
			require.Same(t, s, hs, step)
		} else {
			// The slow path, as the cache takes it: a use, then a lease.
			require.True(t, tb.Touch(s, st), step)
			m.age[key] = 0
			tk, ok = s.Lease(nil)
			require.True(t, ok, "%s: Lease of a held value", step)
		}
		m.leases[key] = append(m.leases[key], tk)
	case topEndLease:
		leases := m.leases[key]
		if len(leases) == 0 {
			return
		}
		tk := leases[0]
		m.leases[key] = leases[1:]
		want := m.watched[tk]
		if want {
			delete(m.watched, tk)
			require.False(t, shard.TryEnd[uint64](tk), "%s: a watched value's lease ended on the fast path", step)
		}
		last, watched, err := s.EndWatchedLease(tk)
		require.NoError(t, err, step)
		if want {
			assert.True(t, watched, "%s: the end of a watched lease did not say so", step)
		}
		assert.False(t, last, "%s: the end of a lease of a value still held released it", step)
		_, err = s.EndLease(tk)
		assert.ErrorIs(t, err, shard.ErrLeaseEnded, "%s: a lease ended twice", step)
	case topWatch:
		if held {
			s.Watch(nil)
			for _, tk := range m.leases[key] {
				m.watched[tk] = true
			}
		}
	}
}

// endDraining ends the oldest lease of a value that left the table: the
// last one of its value says so.
func (m *tableModel) endDraining(t *testing.T, step string) {
	if len(m.draining) == 0 {
		return
	}
	d := m.draining[0]
	m.draining = m.draining[1:]
	rest := 0
	for _, o := range m.draining {
		if o.s == d.s {
			rest++
		}
	}
	assert.False(t, shard.TryEnd[uint64](d.tk), "%s: a lease of a value that left the table ended on the fast path", step)
	last, err := d.s.EndLease(d.tk)
	require.NoError(t, err, step)
	assert.Equal(t, rest == 0, last, "%s: the last lease of a value that left the table", step)
	_, err = d.s.EndLease(d.tk)
	assert.ErrorIs(t, err, shard.ErrLeaseEnded, "%s: a lease ended twice", step)
}

// walk walks the table with All, as the idle sweep does: no slot is
// yielded twice, and every slot that holds something for the model (a
// value, a remembered failure) is yielded.
func (m *tableModel) walk(t *testing.T, tb *shard.Table[int, int], step string) {
	seen := map[*shard.Slot[int, int]]bool{}
	for s := range tb.All() {
		require.False(t, seen[s], "%s: All yielded key %d twice", step, s.Key())
		seen[s] = true
	}
	for key, s := range m.slots {
		require.True(t, seen[s], "%s: All missed key %d", step, key)
	}
}

// check compares the small keys (every key the model knows of, if full)
// and the whole of All with the table.
func (m *tableModel) check(t *testing.T, tb *shard.Table[int, int], step string, full bool) {
	keys := func(yield func(int) bool) {
		for k := range fuzzSmallKeys {
			if !yield(k) {
				return
			}
		}
		for k := burstBase + 1; full && k <= m.next; k++ {
			if !yield(k) {
				return
			}
		}
	}
	for k := range keys {
		want, held := m.values[k]
		v, ok := tb.Load(k)
		require.Equal(t, held, ok, "%s: Load(%d)", step, k)
		if held {
			require.Equal(t, want, v, "%s: Load(%d)", step, k)
		}
		s := tb.Lookup(k)
		if m.ages && held && k < fuzzSmallKeys {
			require.Equal(t, m.age[k] == 0, tb.Young(s.State()), "%s: key %d of age %d", step, k, m.age[k])
			require.Equal(t, len(m.leases[k]), s.Leased(), "%s: leases of key %d", step, k)
		}
		if ms := m.slots[k]; ms != nil {
			require.Same(t, ms, s, "%s: key %d moved to another slot", step, k)
			wantStatus := shard.Ready
			if m.failed[k] {
				wantStatus = shard.Failed
			}
			require.Equal(t, wantStatus, s.State().Status(), "%s: key %d", step, k)
		} else if s != nil {
			st := s.State().Status()
			require.True(t, st == shard.Empty || st == shard.Dead, "%s: key %d holds nothing but its slot is %v", step, k, st)
		}
	}
	live := 0
	yielded := map[*shard.Slot[int, int]]bool{}
	for s := range tb.All() {
		require.False(t, yielded[s], "%s: All yielded a slot twice", step)
		yielded[s] = true
		if st := s.State().Status(); st == shard.Ready || st == shard.Failed {
			live++
			require.Same(t, m.slots[s.Key()], s, "%s: All yielded a live slot the model does not know", step)
		}
	}
	require.Equal(t, len(m.slots), live, "%s: live slots in All", step)
}

// seal seals the table and checks that exactly the slots holding a value or
// a failure are reported, and that nothing can be claimed afterwards.
func (m *tableModel) seal(t *testing.T, tb *shard.Table[int, int]) {
	reported := map[int]int{}
	require.NoError(t, tb.Seal(func(s *shard.Slot[int, int], old *shard.State[int]) {
		require.NotContains(t, reported, s.Key(), "Seal reported a key twice")
		reported[s.Key()] = -1
		if old.Status() == shard.Ready {
			reported[s.Key()] = s.Value()
		}
	}))
	want := map[int]int{}
	for k := range m.slots {
		want[k] = -1
		if v, ok := m.values[k]; ok {
			want[k] = v
		}
	}
	require.Equal(t, want, reported)
	for k := range m.slots {
		_, ok := tb.Load(k)
		require.False(t, ok)
		s := tb.LoadOrInsert(k)
		require.Equal(t, shard.Sealed, s.State().Status())
		_, _, ok = s.Claim(s.State(), nil)
		require.False(t, ok)
	}
}
