// Package shard is the concurrent table under [github.com/epcache/epcache]: a
// sharded, open-addressed hash table of [Slot]s, each moving through the
// atomic state machine described on [Status].
//
// Reads take no lock: [Table.Get], the hit path of a cache in one frame,
// probes an immutable snapshot of the shard's cell array and makes one atomic
// load of the slot's state. Inserting a new key
// takes its shard's mutex for a few nanoseconds; growing a shard builds a new
// array under that mutex while readers go on probing the old one, so growth
// never blocks a reader and never blocks another shard. No lock is held while
// a value is being created: a creation is a Claim of one slot by CAS.
//
// Slots are never moved, and a slot leaves the table only when it holds
// nothing: when a shard's array fills up it is rebuilt, and Empty slots and
// remembered failures that have expired are marked Dead (by CAS, so a
// concurrent Claim either wins and keeps the slot or loses and looks the key
// up again) and left behind. Memory therefore follows the keys that hold a
// value, a creation or a failure still answered, not every key ever seen.
package shard

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"iter"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Options configures a [Table].
type Options[K comparable] struct {
	// Shards is the number of shards, rounded up to a power of two; 0 picks
	// 4×GOMAXPROCS. Shards only spread insertions and growth: reads never
	// lock, so more shards do not make hits faster.
	Shards int
	// Hash, if set, replaces the built-in hash. The table passes its result
	// through its own seeded mix, so it need not spread its bits; it must
	// return equal hashes for equal keys. A Hash that always returns 0 is
	// slow but correct.
	Hash func(K) uint64
}

// MaxShards is the largest shard count a table accepts.
const MaxShards = 1 << 16

// The shard is picked by the low bits of the hash and the cell by the high
// bits (the top of h·n, a multiply rather than a mask, so that arrays need
// not be powers of two): the two never overlap.
const (
	minCells = 8
	// A shard's array is rebuilt when an insertion would fill more than
	// 13/16 of it, to a size it fills to 5/8: the load stays between the
	// two, about 0.72 on average, which keeps the 16-byte cells near 22
	// bytes an entry. Powers of two would have let it fall to 0.4. Cells
	// carry the hash, so the longer probes of a high load mostly stay in
	// one cache line and touch no slot but the one that matches.
	maxLoadNum, maxLoadDen = 13, 16
	refillNum, refillDen   = 5, 8
)

// Table maps keys of type K to [Slot]s holding values of type V.
// A Table is safe for concurrent use. Its zero value is not usable: call [New].
//
// The fields a hit reads come first, in one cache line that nothing writes
// but Close: a hit loads the receiver's kind, hash keys, shard base and mask
// and hit state, then the shard's array, a cell and the slot.
type Table[K comparable, V any] struct {
	kind       keyKind
	shardMask  uint64
	shard0     unsafe.Pointer           // &shards[0]: no bounds check on a masked index
	hit        atomic.Pointer[State[V]] // ready while open, closedMark once closed
	seeds      seeds
	shards     []shardPadded[K, V]
	custom     func(K) uint64
	ready      *State[V] // the one Ready state of this table
	dead       *State[V] // the one Dead state of this table
	sealed     *State[V] // the one Sealed state of this table
	closedMark *State[V] // never a slot's state: what hit holds once closed
	miss       func(context.Context, K) (V, error)
}

type shard[K comparable, V any] struct {
	mu     sync.Mutex
	cells  atomic.Pointer[array[K, V]]
	used   int  // occupied cells of the current array; guarded by mu
	closed bool // set by Seal; guarded by mu
}

// shardPadded keeps each shard's mutex and array pointer on cache lines of
// their own. 128 bytes, not 64: Intel and AMD cores prefetch cache lines in
// adjacent pairs, so two shards 64 bytes apart still contend.
type shardPadded[K comparable, V any] struct {
	shard[K, V]
	_ [128 - shardSize]byte
}

// shardSize is the size of shard[K, V], whose fields do not depend on K or
// V; spelled out because the size of a generic type is not a constant. A test
// checks that the two agree.
const shardSize = unsafe.Sizeof(struct {
	mu     sync.Mutex
	cells  unsafe.Pointer
	used   int
	closed bool
}{})

// array is one immutable-shape snapshot of a shard's cells: cells are only
// ever filled (nil → slot, under the shard mutex), never cleared, so a
// reader's linear probe always ends at a nil cell.
//
// An array is the first of 1+n cells allocated together: the first holds n
// in its hash field, the others are the cells proper. Keeping n in the
// cells' own allocation, rather than in a header that points to them, saves
// a lookup one dependent load.
type array[K comparable, V any] struct {
	head cell[K, V]
}

// cell keeps a copy of its slot's hash beside the pointer, so that a probe
// passes over other keys' cells without touching their slots: on a hit the
// only slot read is the one that matches.
type cell[K comparable, V any] struct {
	hash uint64 // written before slot is stored; immutable once it is
	slot atomic.Pointer[Slot[K, V]]
}

func newArray[K comparable, V any](n int) *array[K, V] {
	cells := make([]cell[K, V], 1+n)
	cells[0].hash = uint64(n)
	return (*array[K, V])(unsafe.Pointer(&cells[0]))
}

// len is the number of cells.
func (a *array[K, V]) len() uint64 { return a.head.hash }

// home is the cell where the probe for hash h starts; see homeOf.
func (a *array[K, V]) home(h uint64) uint64 { return homeOf(h, a.head.hash) }

// homeOf is the cell of n where the probe for hash h starts: the high bits
// of h·n, as the low bits of h choose the shard. (Starting probes at the
// first cell of a cache line instead saved a line in 7% of hits at 65,536
// peers and cost 40% more cells probed: slower.)
func homeOf(h, n uint64) uint64 {
	hi, _ := bits.Mul64(h, n)
	return hi
}

// next is the cell after i, wrapping around.
func (a *array[K, V]) next(i uint64) uint64 {
	if i++; i == a.head.hash {
		return 0
	}
	return i
}

// at returns cell i, for i < len.
//
// Safety: a points at the first of 1+len cells of one allocation, and
// i+1 <= len stays inside it.
func (a *array[K, V]) at(i uint64) *cell[K, V] {
	return (*cell[K, V])(unsafe.Add(unsafe.Pointer(a), uintptr(i+1)*unsafe.Sizeof(a.head)))
}

// put fills the empty cell i with s, whose key hashes to h. Called with the
// shard mutex held.
func (a *array[K, V]) put(i, h uint64, s *Slot[K, V]) {
	c := a.at(i)
	c.hash = h
	c.slot.Store(s)
}

// New returns an empty table with a fresh random hash seed.
func New[K comparable, V any](opt Options[K]) (*Table[K, V], error) {
	n := opt.Shards
	switch {
	case n < 0:
		return nil, fmt.Errorf("shard: Shards is %d; want 0 (default) or a positive count", n)
	case n > MaxShards:
		return nil, fmt.Errorf("shard: Shards is %d; want at most %d", n, MaxShards)
	case n == 0:
		n = 4 * runtime.GOMAXPROCS(0)
	}
	n = ceilPow2(n)
	t := &Table[K, V]{
		shards:     make([]shardPadded[K, V], n),
		shardMask:  uint64(n - 1),
		kind:       kindOf[K](),
		seeds:      newSeeds(),
		custom:     opt.Hash,
		ready:      &State[V]{},
		dead:       &State[V]{flight: &Flight[V]{kind: flightDead}},
		sealed:     &State[V]{flight: &Flight[V]{kind: flightSealed}},
		closedMark: &State[V]{flight: &Flight[V]{kind: flightSealed}},
	}
	if opt.Hash != nil {
		t.kind = kindCustom
	}
	t.shard0 = unsafe.Pointer(&t.shards[0])
	t.hit.Store(t.ready)
	for i := range t.shards {
		t.shards[i].cells.Store(newArray[K, V](minCells))
	}
	return t, nil
}

func ceilPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// Hash returns the table's seeded hash of key.
func (t *Table[K, V]) Hash(key K) uint64 {
	if t.kind == kindInteger {
		return mix(integerBits(key), &t.seeds)
	}
	return t.hashOther(key)
}

// hashOther hashes every key kind but integers.
func (t *Table[K, V]) hashOther(key K) uint64 {
	switch t.kind {
	case kindString:
		return hashString(stringOf(key), &t.seeds)
	case kindCustom:
		return mix(t.custom(key), &t.seeds)
	default:
		return maphash.Comparable(t.seeds.mapSd, key)
	}
}

func (t *Table[K, V]) shardOf(h uint64) *shard[K, V] {
	return &t.shards[h&t.shardMask].shard
}

// Lookup returns key's slot, or nil if the table has none. It takes no lock,
// allocates nothing and writes nothing. The slot may be in any state,
// including Dead (then use [Table.LoadOrInsert]).
func (t *Table[K, V]) Lookup(key K) *Slot[K, V] {
	return t.find(t.Hash(key), key)
}

// SetMiss sets the function Get hands its misses to. Call it once, before
// the table is used; without it, a miss is an error.
func (t *Table[K, V]) SetMiss(miss func(ctx context.Context, key K) (V, error)) { t.miss = miss }

var errMiss = errors.New("shard: no ready value")

// NoMiss is the context to give Get for a lookup that must not miss into
// the function given to SetMiss: a miss then is an error (Load passes it).
var NoMiss context.Context = noMissCtx{context.Background()}

type noMissCtx struct{ context.Context }

func (noMissCtx) String() string { return "shard.NoMiss" }

// Get returns key's value if its slot is Ready and the table is not closed,
// and otherwise whatever the function given to SetMiss returns. A hit takes
// no lock, allocates nothing and writes nothing, and for an integer key
// calls nothing: it is the whole hit path of a cache in one call, so that a
// cache's own Get can be a one-call wrapper that inlines into its callers
// (a wrapper making two calls, a lookup and then its slow path, costs more
// than the inliner allows).
//
// The tests of unsafe.Sizeof(key) are constants in each instantiation of
// the generic code: they remove the string branches from the code for
// 8-byte keys and the integer branch from the code for strings, so that
// integer keys are hashed and probed with no call in the function, and
// nothing it holds (ctx, above all) is spilled to the stack around one.
func (t *Table[K, V]) Get(ctx context.Context, key K) (v V, err error) {
	var h uint64
	switch {
	case unsafe.Sizeof(key) <= 8 && t.kind == kindInteger:
		hi, lo := bits.Mul64(integerBits(key)^t.seeds.ka, t.seeds.kb)
		h = hi ^ lo
	case unsafe.Sizeof(key) == unsafe.Sizeof("") && t.kind == kindString:
		h = hashString(stringOf(key), &t.seeds)
	default:
		return t.getOther(ctx, key) // Config.Hash and composite keys
	}
	// find, written out: the inliner finds it too large, and a call here
	// would cost as much as the probe.
	// Safety: h&shardMask < len(shards), whose first element is at shard0.
	a := (*shard[K, V])(unsafe.Add(t.shard0, uintptr(h&t.shardMask)*unsafe.Sizeof(shardPadded[K, V]{}))).cells.Load()
	for i := a.home(h); ; i = a.next(i) {
		c := a.at(i)
		s := c.slot.Load()
		if s == nil {
			break
		}
		if c.hash == h && t.equal(s.key, key) {
			// One comparison answers both "Ready" and "not closed": Close
			// swaps hit for a state no slot ever holds.
			if s.state.Load() == t.hit.Load() {
				return s.value, nil
			}
			break
		}
	}
	return t.missed(ctx, key)
}

// getOther is Get for keys hashed by hashOther.
func (t *Table[K, V]) getOther(ctx context.Context, key K) (v V, err error) {
	if s := t.find(t.hashOther(key), key); s != nil && s.state.Load() == t.hit.Load() {
		return s.value, nil
	}
	return t.missed(ctx, key)
}

// missed answers a Get that found no Ready value.
func (t *Table[K, V]) missed(ctx context.Context, key K) (v V, err error) {
	if ctx == NoMiss || t.miss == nil {
		return v, errMiss
	}
	return t.miss(ctx, key)
}

// find probes the array of h's shard for key, without a lock, and returns
// its slot, in any state, or nil.
func (t *Table[K, V]) find(h uint64, key K) *Slot[K, V] {
	// Safety: h&shardMask < len(shards), whose first element is at shard0.
	a := (*shard[K, V])(unsafe.Add(t.shard0, uintptr(h&t.shardMask)*unsafe.Sizeof(shardPadded[K, V]{}))).cells.Load()
	for i := a.home(h); ; i = a.next(i) {
		c := a.at(i)
		s := c.slot.Load()
		if s == nil || c.hash == h && t.equal(s.key, key) {
			return s
		}
	}
}

// equal compares keys; two strings at one address are equal without a call
// to compare their bytes.
func (t *Table[K, V]) equal(a, b K) bool {
	if unsafe.Sizeof(a) == unsafe.Sizeof("") && t.kind == kindString && sameString(a, b) {
		return true
	}
	return a == b
}

// Load returns key's value if its slot is Ready and the table is not closed.
// It takes no lock, allocates nothing and writes nothing; it is Get without
// the miss, and inlines into its callers.
func (t *Table[K, V]) Load(key K) (v V, ok bool) {
	v, err := t.Get(NoMiss, key)
	return v, err == nil
}

// Close makes the table stop answering, ahead of Seal: from now on Load
// reports no value. It changes no slot. It reports whether this call closed
// the table (false if it was closed).
func (t *Table[K, V]) Close() bool { return t.hit.CompareAndSwap(t.ready, t.closedMark) }

// Closed reports whether Close has been called.
func (t *Table[K, V]) Closed() bool { return t.hit.Load() != t.ready }

// LoadOrInsert returns key's slot, inserting an Empty one if the table has
// none (a Sealed one if the table is sealed). The returned slot is never
// Dead when returned, though compaction may make it Dead at any moment while
// it is Empty. Only the insertion locks, and only key's shard.
func (t *Table[K, V]) LoadOrInsert(key K) *Slot[K, V] {
	h := t.Hash(key)
	if s := t.find(h, key); s != nil && s.state.Load() != t.dead {
		return s
	}
	return t.insertSlow(key, h)
}

func (t *Table[K, V]) insertSlow(key K, h uint64) *Slot[K, V] {
	sh := t.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a := sh.cells.Load()
	if c := t.cellOf(a, key, h); c != nil {
		if s := c.slot.Load(); s.state.Load() != t.dead {
			return s
		}
		// An invalidated slot whose Invalidate has not yet replaced it.
		return t.renew(sh, c, key)
	}
	if uint64(sh.used+1)*maxLoadDen > a.len()*maxLoadNum {
		a = t.rebuild(sh, a)
	}
	i := a.home(h)
	for a.at(i).slot.Load() != nil {
		i = a.next(i)
	}
	s := t.newSlot(sh, key)
	a.put(i, h, s)
	sh.used++
	return s
}

// cellOf returns the cell of a that holds key, or nil. Called with the
// shard mutex held, or on a snapshot.
func (t *Table[K, V]) cellOf(a *array[K, V], key K, h uint64) *cell[K, V] {
	for i := a.home(h); ; i = a.next(i) {
		c := a.at(i)
		s := c.slot.Load()
		if s == nil {
			return nil
		}
		if c.hash == h && s.key == key {
			return c
		}
	}
}

func (t *Table[K, V]) newSlot(sh *shard[K, V], key K) *Slot[K, V] {
	s := &Slot[K, V]{key: key}
	if sh.closed {
		s.state.Store(t.sealed)
	}
	return s
}

// renew puts a fresh slot for key in c, whose slot is Dead. Called with the
// shard mutex held: cells change only under it.
func (t *Table[K, V]) renew(sh *shard[K, V], c *cell[K, V], key K) *Slot[K, V] {
	s := t.newSlot(sh, key)
	c.slot.Store(s)
	return s
}

// Publish moves a claimed slot to Ready with v. It reports false if the slot
// no longer holds claim, which cannot happen unless the table was sealed with
// the creation still in flight: the caller then still owns v.
func (t *Table[K, V]) Publish(s *Slot[K, V], claim *State[V], v V) bool {
	// A claimed slot has never been Ready (Invalidate ends a slot), so its
	// value is unused and nobody reads it until the CAS publishes it.
	s.value = v
	return s.state.CompareAndSwap(claim, t.ready)
}

// Invalidate moves a Ready slot to Dead and returns the value it held; the
// caller now owns that value. The key gets a fresh Empty slot, so the table
// keeps no reference to the value. ok is false when the slot was not Ready.
// Only the replacement takes the shard's mutex, after the value has left.
func (t *Table[K, V]) Invalidate(s *Slot[K, V]) (v V, ok bool) {
	return t.InvalidateIf(s, nil)
}

// InvalidateIf is Invalidate, done only if match (when not nil) reports true
// for the held value. match may be called more than once, never with a lock
// held. If match or the table's hash (Options.Hash) panics, the slot is
// left as it was.
func (t *Table[K, V]) InvalidateIf(s *Slot[K, V], match func(V) bool) (v V, ok bool) {
	// Hashed before the slot changes: once it is Dead, the caller owns the
	// value, and a panic in the caller's Hash would lose it.
	h := t.Hash(s.key)
	for {
		st := s.state.Load()
		if st != t.ready || (match != nil && !match(s.value)) {
			return v, false
		}
		if s.state.CompareAndSwap(st, t.dead) {
			v = s.value
			break
		}
	}
	sh := t.shardOf(h)
	sh.mu.Lock()
	if c := t.cellOf(sh.cells.Load(), s.key, h); c != nil && c.slot.Load() == s {
		t.renew(sh, c, s.key)
	}
	sh.mu.Unlock()
	return v, true
}

// rebuild replaces a full array with one holding its live slots at 5/8
// load. Slots that hold nothing worth keeping (Empty, or a remembered
// failure whose Until has passed) are marked Dead first, by CAS, so that a
// Claim racing with the rebuild either keeps its slot alive or fails and
// looks again; Dead ones are left behind. Called with sh.mu held.
func (t *Table[K, V]) rebuild(sh *shard[K, V], old *array[K, V]) *array[K, V] {
	live := 0
	now := time.Now()
	for i := range old.len() {
		if s := old.at(i).slot.Load(); s != nil && !t.reclaim(s, now) {
			live++
		}
	}
	a := newArray[K, V](max(minCells, (live+1)*refillDen/refillNum+1))
	copied := 0
	for i := range old.len() {
		c := old.at(i)
		s := c.slot.Load()
		// A slot may turn Dead meanwhile (an Invalidate), never back to
		// life (Seal, the only other writer of a Dead slot, takes the
		// mutex), so at most live slots are copied: they fit.
		if s == nil || s.state.Load() == t.dead {
			continue
		}
		j := a.home(c.hash)
		for a.at(j).slot.Load() != nil {
			j = a.next(j)
		}
		a.put(j, c.hash, s)
		copied++
	}
	sh.used = copied
	sh.cells.Store(a)
	return a
}

// reclaim makes s Dead if it holds nothing worth keeping at now: no value,
// no creation, no failure still to be answered. It reports whether s is
// Dead.
func (t *Table[K, V]) reclaim(s *Slot[K, V], now time.Time) bool {
	for {
		st := s.state.Load()
		switch {
		case st == t.dead:
			return true
		case st != nil && !st.expired(now):
			return false
		case s.state.CompareAndSwap(st, t.dead):
			return true
		}
	}
}

// All yields every slot in the table, in no particular order. It is weakly
// consistent, like sync.Map.Range: each shard is read from one snapshot, so
// no slot is yielded twice, but slots inserted during the iteration may be
// missed. It holds no lock while yield runs.
func (t *Table[K, V]) All() iter.Seq[*Slot[K, V]] {
	return func(yield func(*Slot[K, V]) bool) {
		for i := range t.shards {
			a := t.shards[i].cells.Load()
			for j := range a.len() {
				if s := a.at(j).slot.Load(); s != nil && !yield(s) {
					return
				}
			}
		}
	}
}

// ErrSealed is returned by a second [Table.Seal].
var ErrSealed = errors.New("shard: table already sealed")

// Seal closes the table: every slot, present and future, becomes Sealed, and
// seal is called, with no lock held, once for each slot that was not Empty,
// with the state it held (the caller releases Ready values). Claims
// fail from then on. The caller must make sure no creation is in flight, or
// its Publish will report false. A second Seal returns ErrSealed.
func (t *Table[K, V]) Seal(seal func(s *Slot[K, V], old *State[V])) error {
	type sealed struct {
		s   *Slot[K, V]
		old *State[V]
	}
	var batch []sealed
	for i := range t.shards {
		// The shard's mutex keeps a rebuild from running while its slots are
		// sealed: a rebuild decides which slots are Dead and sizes its array
		// by that, and a slot turned from Dead to Sealed under it would not fit.
		sh := &t.shards[i].shard
		sh.mu.Lock()
		if sh.closed {
			sh.mu.Unlock()
			return ErrSealed
		}
		sh.closed = true
		a := sh.cells.Load()
		batch = batch[:0]
		for j := range a.len() {
			if s := a.at(j).slot.Load(); s != nil {
				if old := s.state.Swap(t.sealed); old != nil && old != t.dead {
					batch = append(batch, sealed{s, old})
				}
			}
		}
		sh.mu.Unlock()
		for _, b := range batch {
			seal(b.s, b.old)
		}
	}
	return nil
}
