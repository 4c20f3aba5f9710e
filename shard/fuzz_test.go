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
	numTableOps
)

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
}

func runTableOps(t *testing.T, data []byte) {
	hashes := []func(int) uint64{nil, func(int) uint64 { return 0 }, func(k int) uint64 { return uint64(k % 3) }}
	tb := newTable[int, int](t, shard.Options[int]{Hash: hashes[int(data[0])%3], Shards: 1 + int(data[0]/3%2)})
	m := &tableModel{
		values: map[int]int{}, failed: map[int]bool{},
		slots: map[int]*shard.Slot[int, int]{}, seen: map[int]*shard.Slot[int, int]{},
		next: burstBase,
	}
	data = data[1:]
	for i := 0; i+1 < len(data); i += 2 {
		op, arg := tableOp(data[i]%byte(numTableOps)), int(data[i+1])
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
			delete(m.values, key)
			delete(m.slots, key)
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
