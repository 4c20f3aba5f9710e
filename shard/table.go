// Package shard is the engine of [github.com/epcache/epcache/epcache]: a
// sharded, open-addressed hash table of [Slot]s, each moving through the
// atomic state machine described on [Status]. It is public so that epcache's
// generic code inlines its hit path into users' programs, and so that its
// tests and benchmarks can reach it; its API follows epcache's needs and
// may change with them. Use package epcache.
//
// Reads take no lock: [Table.Get], the hit path of a cache in one frame,
// probes an immutable snapshot of the shard's array of slot groups (a
// control word of seven one-byte tags and seven slot pointers per cache line,
// matched eight bytes at a time) and makes one atomic load of the slot's
// state. Inserting a new key
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

// The shard is picked by the low bits of the hash, the home group by the
// high bits (the top of h·n, a multiply rather than a mask, so that arrays
// need not be powers of two) and the tag by bits 32 to 38: none overlap.
const (
	minSlots = 7
	// A shard's array is rebuilt when an insertion would fill more than
	// 13/16 of its slots, to a size it fills to 5/8: the load stays between
	// the two, about 0.72 on average, which keeps the 64-byte groups of
	// seven slots near 12.7 bytes an entry. Powers of two would have let it
	// fall to 0.4.
	maxLoadNum, maxLoadDen = 13, 16
	refillNum, refillDen   = 5, 8
)

// Table maps keys of type K to [Slot]s holding values of type V.
// A Table is safe for concurrent use. Its zero value is not usable: call [New].
//
// The fields a hit reads come first, in one cache line that nothing writes
// but Close: a hit loads the receiver's kind, hash keys, shard base and mask
// and hit state, then the shard's array, one group and the slot.
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
	leaseMiss  func(context.Context, K, *Slot[K, V], Ticket) (*Slot[K, V], Ticket, error)
	owner      any                      // what Acquire gives Slot.Lease (SetOwner)
	aged       [IdleSteps + 1]*State[V] // the aged Ready states (age.go)
	evicting   *State[V]                // a value InvalidateState is removing (age.go)
	published  *State[V]                // the state Publish stores: ready, or cooled (SetProbation)
}

type shard[K comparable, V any] struct {
	mu     sync.Mutex
	cells  atomic.Pointer[array[K, V]]
	used   int  // filled slots of the current array; guarded by mu
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

// array is one immutable-shape snapshot of a shard's slots, in groups of
// seven: slots are only ever filled (nil → slot, under the shard mutex) or
// replaced by a fresh slot of the same key (renew), never emptied, so a
// group that has an empty slot ends every probe that reaches it.
//
// An array is the first of 1+n groups allocated together: the first holds n
// in its control word, the others are the groups proper. Keeping n in the
// groups' own allocation, rather than in a header that points to them, saves
// a lookup one dependent load.
type array[K comparable, V any] struct {
	head group[K, V]
}

// group is one 64-byte cache line: a control word and seven slot pointers,
// the layout of a Swiss table's group and of xsync's bucket. Byte j of the
// control word is 0 while slot j is empty, and 0x80 | seven bits of the
// key's hash (its tag) once it is filled. A lookup loads the control word,
// matches the tag in all seven bytes at once (SWAR) and reads the slot
// pointer beside it: one line of the array, and the slot's, for a hit,
// where a linear probe over 16-byte cells read 1.24 lines of cells and
// mispredicted the end of its probe at 65,536 peers.
//
// Go puts an 8-byte header before small objects that hold pointers and are
// larger than 512 bytes, so the groups of such arrays start 8 bytes into a
// line: the control word and six slots share a line, and a hit on the
// seventh slot reads two. Smaller and large (over 32 KiB) arrays are
// aligned.
type group[K comparable, V any] struct {
	ctrl  atomic.Uint64
	slots [groupSlots]atomic.Pointer[Slot[K, V]]
}

// groupLayout mirrors group[K, V], whose size and offsets do not depend on
// K or V, for Get's pointer arithmetic: the size of a generic type is not a
// constant. TestGroupLayout checks that the two agree.
type groupLayout struct {
	_     atomic.Uint64 // ctrl
	slots [groupSlots]unsafe.Pointer
}

const (
	groupSize   = unsafe.Sizeof(groupLayout{})         // 64 bytes, one cache line, on 64-bit platforms
	slotsOffset = unsafe.Offsetof(groupLayout{}.slots) // where the slot pointers begin
	ptrSize     = unsafe.Sizeof(unsafe.Pointer(nil))   // the size of a slot pointer
)

const (
	groupSlots = 7
	lowBytes   = 0x0001010101010101 // one in each of the seven control bytes
	highBits   = 0x0080808080808080 // the high bit of each of the seven control bytes
)

// The word helpers below (tagOf to byteIndex, and mum, mix and r8 in
// hash.go, lineAt in lease.go) take a type parameter W
// ~uint64 for one reason: so that they inline into the generic code that a
// user's program compiles. Go 1.26 inlines a non-generic function of shard
// into an instantiation of shard's generic code only where the package
// being compiled imports shard itself; a user's program imports epcache,
// not shard, and there each of these, plain, would be a call on the hit
// path (four calls a Get). A generic function's body
// travels with the generic code that calls it. TestHitPathMakesNoCalls
// builds a program that imports epcache alone and checks the hit paths.

// tagOf is the control byte of a slot whose key hashes to h.
func tagOf[W ~uint64](h W) W { return 0x80 | (h>>32)&0x7f }

// tagsOf is h's tag in each of the seven control bytes, for matches.
func tagsOf[W ~uint64](h W) W { return tagOf(h) * lowBytes }

// matches returns the control bytes of ctrl equal to the tag in tags, as
// their high bits, and possibly a few others just above a match (a borrow
// of the subtraction): candidates, which the key comparison sorts out.
func matches[W ~uint64](ctrl, tags W) W {
	x := ctrl ^ tags
	return (x - lowBytes) &^ x & highBits
}

// empties returns the empty control bytes of ctrl, as their high bits:
// every filled byte has its high bit set.
func empties[W ~uint64](ctrl W) W { return ^ctrl & highBits }

// byteIndex is the control byte, and so the slot, that the lowest set high
// bit of m marks.
func byteIndex[W ~uint64](m W) W { return W(bits.TrailingZeros64(uint64(m))) >> 3 }

// newArray returns an array of at least n slots.
func newArray[K comparable, V any](n int) *array[K, V] {
	groups := (n + groupSlots - 1) / groupSlots
	gs := make([]group[K, V], 1+groups)
	gs[0].ctrl.Store(uint64(groups))
	return (*array[K, V])(unsafe.Pointer(&gs[0]))
}

// groups is the number of groups.
func (a *array[K, V]) groups() uint64 { return a.head.ctrl.Load() }

// capacity is the number of slots.
func (a *array[K, V]) capacity() uint64 { return a.groups() * groupSlots }

// home is the group where the probe for hash h starts: the high bits of
// h·n, as the low bits of h choose the shard.
func (a *array[K, V]) home(h uint64) uint64 {
	hi, _ := bits.Mul64(h, a.groups())
	return hi
}

// next is the group after g, wrapping around.
func (a *array[K, V]) next(g uint64) uint64 {
	if g++; g == a.groups() {
		return 0
	}
	return g
}

// group returns group g, for g < groups.
//
// Safety: a points at the first of 1+groups groups of one allocation, and
// g+1 <= groups stays inside it.
func (a *array[K, V]) group(g uint64) *group[K, V] {
	return (*group[K, V])(unsafe.Add(unsafe.Pointer(a), uintptr(g+1)*unsafe.Sizeof(a.head)))
}

// slot returns slot j of g, for j < groupSlots.
//
// Safety: j < groupSlots indexes g.slots.
func (g *group[K, V]) slot(j uint64) *atomic.Pointer[Slot[K, V]] {
	return (*atomic.Pointer[Slot[K, V]])(unsafe.Add(unsafe.Pointer(&g.slots), uintptr(j)*unsafe.Sizeof(g.slots[0])))
}

// probe looks for key, whose hash is h, in a without a lock, and returns
// its slot's pointer in the array, or nil.
func (t *Table[K, V]) probe(a *array[K, V], h uint64, key K) *atomic.Pointer[Slot[K, V]] {
	tags := tagsOf(h)
	for g := a.home(h); ; g = a.next(g) {
		grp := a.group(g)
		ctrl := grp.ctrl.Load()
		for m := matches(ctrl, tags); m != 0; m &= m - 1 {
			if p := grp.slot(byteIndex(m)); t.equal(p.Load().key, key) {
				return p
			}
		}
		if empties(ctrl) != 0 {
			return nil
		}
	}
}

// put stores s, whose key hashes to h, in the first empty slot of a from
// h's home. Called with the shard mutex held, on an array with an empty
// slot: the pointer first, then its control byte, so that a reader that
// sees the tag finds the slot.
func (a *array[K, V]) put(h uint64, s *Slot[K, V]) {
	for g := a.home(h); ; g = a.next(g) {
		grp := a.group(g)
		ctrl := grp.ctrl.Load()
		if e := empties(ctrl); e != 0 {
			j := byteIndex(e)
			grp.slot(j).Store(s)
			grp.ctrl.Store(ctrl | tagOf(h)<<(8*j))
			return
		}
	}
}

// each calls f with every slot of a, in order.
func (a *array[K, V]) each(f func(*Slot[K, V]) bool) bool {
	for g := range a.groups() {
		grp := a.group(g)
		for j := range uint64(groupSlots) {
			if s := grp.slot(j).Load(); s != nil && !f(s) {
				return false
			}
		}
	}
	return true
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
		aged:       newAged[V](),
		evicting:   &State[V]{age: 255},
	}
	if opt.Hash != nil {
		t.kind = kindCustom
	}
	t.shard0 = unsafe.Pointer(&t.shards[0])
	t.hit.Store(t.ready)
	t.published = t.ready
	for i := range t.shards {
		t.shards[i].cells.Store(newArray[K, V](minSlots))
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
	return t.locate(t.Hash(key), key)
}

// SetMiss sets the function Get hands its misses to. Call it once, before
// the table is used; without it, a miss is an error.
func (t *Table[K, V]) SetMiss(miss func(ctx context.Context, key K) (V, error)) { t.miss = miss }

// SetLeaseMiss sets the function that answers an Acquire that found no
// value to lease. If a removal took the value as the lease was taken,
// stale is its slot and tk that lease, which the function must end (and
// release the value, if EndLease says it was the last lease); otherwise
// stale is nil. Call it before the table is used.
func (t *Table[K, V]) SetLeaseMiss(miss func(ctx context.Context, key K, stale *Slot[K, V], tk Ticket) (*Slot[K, V], Ticket, error)) {
	t.leaseMiss = miss
}

// SetOwner sets the owner that Acquire and Lease give Slot.Lease, for
// Slot.Owner to return. Call it before the table is used.
func (t *Table[K, V]) SetOwner(owner any) { t.owner = owner }

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
	var str string // key, if a string
	isStr := false // constant false where K is larger or smaller than a string
	switch {
	case unsafe.Sizeof(key) <= 8 && t.kind == kindInteger:
		hi, lo := bits.Mul64(integerBits(key)^t.seeds.ka, t.seeds.kb)
		h = hi ^ lo
	case unsafe.Sizeof(key) == unsafe.Sizeof("") && t.kind == kindString:
		str, isStr = stringOf(key), true
		if n := uint64(len(str)); n-8 <= 24 {
			// hashString's cases for 8 to 32 bytes, written out (too large
			// for the inliner): peer names and addresses of those lengths
			// are hashed without a call, and nothing is spilled around
			// one. TestStringKeysCompareByContent checks that the two
			// agree at every length.
			//
			// Safety: 8-byte reads within the n bytes at p: at 0 and n-8,
			// and for n > 16 at 8 and n-16 too.
			p := unsafe.Pointer(unsafe.StringData(str))
			seed, a := t.seeds.s0, r8[uint64](p)
			if n > 16 { // hashString's loop, once
				seed = mum(a^t.seeds.s1, r8[uint64](unsafe.Add(p, 8))^seed)
				a = r8[uint64](unsafe.Add(p, n-16))
			}
			h = mum(mixC^n, mum(a^t.seeds.s1, r8[uint64](unsafe.Add(p, n-8))^seed))
		} else {
			h = hashString(str, &t.seeds)
		}
	default:
		return t.getOther(ctx, key) // Config.Hash and composite keys
	}
	// locate, written out: the inliner finds it too large, and a call here
	// would cost as much as the probe (TestHitPathMakesNoCalls keeps it so).
	// Safety: h&shardMask < len(shards), whose first element is at shard0.
	a := (*shard[K, V])(unsafe.Add(t.shard0, uintptr(h&t.shardMask)*unsafe.Sizeof(shardPadded[K, V]{}))).cells.Load()
	// The groups are addressed with unsafe.Pointer arithmetic rather than
	// the generic helpers probe uses: those make the compiler load and
	// nil-check a sub-dictionary at each use in the loop.
	//
	// Safety: as array.group and group.slot; groupLayout is the layout of
	// every group[K, V] (TestGroupLayout).
	base := unsafe.Pointer(a)
	n := (*atomic.Uint64)(base).Load() // the header's control word: the number of groups
	g, _ := bits.Mul64(h, n)
	tags := tagsOf(h)
probe:
	for {
		grp := unsafe.Add(base, uintptr(g+1)*groupSize)
		ctrl := (*atomic.Uint64)(grp).Load()
		for m := matches(ctrl, tags); m != 0; m &= m - 1 {
			s := (*Slot[K, V])(atomic.LoadPointer((*unsafe.Pointer)(unsafe.Add(grp, slotsOffset+uintptr(byteIndex(m))*ptrSize))))
			// t.equal, written out: a generic call here loads and
			// nil-checks a sub-dictionary on every candidate, and joins
			// its two comparisons through a flag kept on the stack.
			if unsafe.Sizeof(key) == unsafe.Sizeof("") && isStr {
				// Safety: K is string-kinded.
				ks := *(*string)(unsafe.Pointer(&s.key))
				if len(ks) != len(str) {
					continue
				}
				if unsafe.StringData(ks) != unsafe.StringData(str) {
					if ks != str {
						continue
					}
				}
			} else if s.key != key {
				continue
			}
			// One comparison answers both "Ready" and "not closed": Close
			// swaps hit for a state no slot ever holds.
			if s.state.Load() == t.hit.Load() {
				return s.value, nil
			}
			break probe
		}
		if empties(ctrl) != 0 {
			break
		}
		if g++; g == n {
			g = 0
		}
	}
	return t.missed(ctx, key)
}

// locate probes the array of h's shard for key, without a lock, and
// returns its slot, in any state, or nil: probe for readers, whose groups
// it addresses with unsafe.Pointer arithmetic rather than the generic
// helpers probe uses, for the reason Get gives.
func (t *Table[K, V]) locate(h uint64, key K) *Slot[K, V] {
	// Safety: h&shardMask < len(shards), whose first element is at shard0.
	a := (*shard[K, V])(unsafe.Add(t.shard0, uintptr(h&t.shardMask)*unsafe.Sizeof(shardPadded[K, V]{}))).cells.Load()
	// Safety: as array.group and group.slot; groupLayout is the layout of
	// every group[K, V] (TestGroupLayout).
	base := unsafe.Pointer(a)
	n := (*atomic.Uint64)(base).Load() // the header's control word: the number of groups
	g, _ := bits.Mul64(h, n)
	tags := tagsOf(h)
	for {
		grp := unsafe.Add(base, uintptr(g+1)*groupSize)
		ctrl := (*atomic.Uint64)(grp).Load()
		for m := matches(ctrl, tags); m != 0; m &= m - 1 {
			s := (*Slot[K, V])(atomic.LoadPointer((*unsafe.Pointer)(unsafe.Add(grp, slotsOffset+uintptr(byteIndex(m))*ptrSize))))
			if t.equal(s.key, key) {
				return s
			}
		}
		if empties(ctrl) != 0 {
			return nil
		}
		if g++; g == n {
			g = 0
		}
	}
}

// getOther is Get for keys hashed by hashOther.
func (t *Table[K, V]) getOther(ctx context.Context, key K) (v V, err error) {
	if s := t.locate(t.hashOther(key), key); s != nil && s.state.Load() == t.hit.Load() {
		return s.value, nil
	}
	return t.missed(ctx, key)
}

// missed answers a Get that found no Ready value.
func (t *Table[K, V]) missed(ctx context.Context, key K) (v V, err error) {
	if ctx == NoMiss || t.miss == nil {
		// A lookup, which must not count as a use: an aged value is
		// still held.
		if s := t.locate(t.Hash(key), key); s != nil && isValue(s.state.Load()) && !t.Closed() {
			return s.value, nil
		}
		return v, errMiss
	}
	return t.miss(ctx, key)
}

// equal compares keys; two strings at one address are equal without a call
// to compare their bytes.
func (t *Table[K, V]) equal(a, b K) bool {
	if unsafe.Sizeof(a) == unsafe.Sizeof("") && t.kind == kindString && sameString(a, b) {
		return true
	}
	return a == b
}

// Acquire returns key's slot and a lease of its value if the slot is Ready
// and the table is not closed (see [Slot.Lease]), and otherwise whatever
// the function given to SetLeaseMiss returns; without that function (or
// from Lease), a miss is an error, and a lease that a removal raced (see
// Lease) is returned with it for the caller to end. A hit takes no lock,
// and allocates only what Slot.Lease does (a value's first lease table,
// its lines, a lease beyond every ticket): it is the whole hit path of a
// cache's Acquire in one call, so that Acquire can be a one-call wrapper
// that inlines into its callers, as Get's does.
func (t *Table[K, V]) Acquire(ctx context.Context, key K) (s *Slot[K, V], tk Ticket, err error) {
	// An integer key is hashed here, as Get hashes it: Hash does not
	// inline, and a call costs the lease as much as the mix itself.
	var h uint64
	if unsafe.Sizeof(key) <= 8 && t.kind == kindInteger {
		h = mix(integerBits(key), &t.seeds)
	} else {
		h = t.Hash(key)
	}
	// locate, written out as Get writes its probe: the call, and the
	// spills around it, cost a lease on one core about 0.4 ns of its 17
	// (bench/direct BenchmarkLease).
	a := (*shard[K, V])(unsafe.Add(t.shard0, uintptr(h&t.shardMask)*unsafe.Sizeof(shardPadded[K, V]{}))).cells.Load()
	base := unsafe.Pointer(a)
	n := (*atomic.Uint64)(base).Load()
	g, _ := bits.Mul64(h, n)
	tags := tagsOf(h)
probe:
	for {
		grp := unsafe.Add(base, uintptr(g+1)*groupSize)
		ctrl := (*atomic.Uint64)(grp).Load()
		for m := matches(ctrl, tags); m != 0; m &= m - 1 {
			s = (*Slot[K, V])(atomic.LoadPointer((*unsafe.Pointer)(unsafe.Add(grp, slotsOffset+uintptr(byteIndex(m))*ptrSize))))
			if t.equal(s.key, key) {
				break probe
			}
		}
		if empties(ctrl) != 0 {
			s = nil
			break
		}
		if g++; g == n {
			g = 0
		}
	}
	if s == nil || s.state.Load() != t.hit.Load() {
		return t.leaseMissed(ctx, key, nil, Ticket{})
	}
	// The first ticket of the caller's line, spelled out: free unless
	// the caller holds another lease of this value, or the value has no
	// lines and another goroutine holds one. A watched ticket, or a
	// value with none, goes the slow way.
	if tb := s.leases.Load(); tb != nil {
		var anchor byte
		hint := leaseHint[uint64](&anchor)
		p := &tb.tickets[0]
		h := tb.lines.Load()
		if h != nil {
			pid := procPin()
			procUnpin()
			p = &lineOf(tb, h, uint64(pid)).tickets[0]
		}
		if w := p.Load(); w&(ticketGone|ticketHeld|ticketWatched) == 0 {
			nw, moved := taken(w, hint), false
			if h == nil && w&(ticketRecordP|ticketHint) != hint {
				// Taken last by another goroutine, or never, or
				// the ticket asks every take for its P: the P each
				// ran on tells whether the line moved between
				// cores (see lease.go).
				pb := pidBits[uint64](procPin())
				procUnpin()
				nw, moved = takenOver(w, nw, hint, pb)
			}
			if p.CompareAndSwap(w, nw) {
				if moved {
					s.contended()
				}
				tk = Ticket{w: nw, e: nw &^ ticketHeld, p: (*uint64)(unsafe.Pointer(p))} // heldTicket and wordOf, which do not inline here
				if nw&ticketRecordP != 0 {
					tk.w |= ticketSlow // its end records its P (TryEndRecording)
				}
				if !t.Holds(s) {
					return t.leaseMissed(ctx, key, s, tk)
				}
				return s, tk, nil
			}
		}
	}
	var ok bool
	if tk, ok = s.Lease(t.owner); !ok {
		return t.leaseMissed(ctx, key, nil, Ticket{})
	}
	if !t.Holds(s) {
		return t.leaseMissed(ctx, key, s, tk)
	}
	return s, tk, nil
}

// leaseMissed answers an Acquire that found no value to lease. stale is
// the slot of a value that a removal took as the lease tk was taken, or
// nil.
func (t *Table[K, V]) leaseMissed(ctx context.Context, key K, stale *Slot[K, V], tk Ticket) (*Slot[K, V], Ticket, error) {
	if ctx == leaseNoMiss || t.leaseMiss == nil {
		return stale, tk, errMiss
	}
	return t.leaseMiss(ctx, key, stale, tk)
}

// leaseNoMiss is the context Lease gives Acquire, so that its miss comes
// back rather than into the miss function. A context of its own, never
// NoMiss: a caller of a cache's Acquire may pass NoMiss, and must not get
// back a lease with an error.
var leaseNoMiss context.Context = &noMissCtx{context.Background()}

// Lease is Acquire without the miss: it returns key's slot and a lease of
// its value, if the slot is Ready and the table is not closed. With ok
// false and tk valid, a removal (InvalidateState) raced the lease: s no
// longer holds the value for the table, and the caller must end tk at once
// (and release the value, if EndLease says it was the last lease).
func (t *Table[K, V]) Lease(key K) (s *Slot[K, V], tk Ticket, ok bool) {
	s, tk, err := t.Acquire(leaseNoMiss, key)
	return s, tk, err == nil
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
	if s := t.locate(h, key); s != nil && s.state.Load() != t.dead {
		return s
	}
	return t.insertSlow(key, h)
}

func (t *Table[K, V]) insertSlow(key K, h uint64) *Slot[K, V] {
	sh := t.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a := sh.cells.Load()
	if p := t.probe(a, h, key); p != nil {
		return p.Load() // alive: see kill
	}
	if uint64(sh.used+1)*maxLoadDen > a.capacity()*maxLoadNum {
		a = t.rebuild(sh, a)
	}
	s := t.newSlot(sh, key)
	a.put(h, s)
	sh.used++
	return s
}

func (t *Table[K, V]) newSlot(sh *shard[K, V], key K) *Slot[K, V] {
	s := &Slot[K, V]{key: key}
	if sh.closed {
		s.state.Store(t.sealed)
	}
	return s
}

// renew puts a fresh slot for key at p, whose slot, old, is Dead. Called
// with the shard mutex held: arrays change only under it. The fresh slot
// starts Straggling if a straggler marked on old still runs (see
// Slot.MarkStraggler).
func (t *Table[K, V]) renew(sh *shard[K, V], p *atomic.Pointer[Slot[K, V]], old *Slot[K, V]) *Slot[K, V] {
	s := t.newSlot(sh, old.key)
	if !sh.closed {
		if st := old.stragglerState(); st != nil {
			s.state.Store(st)
		}
	}
	p.Store(s)
	return s
}

// Publish moves a claimed slot to Ready with v. It reports false if the slot
// no longer holds claim, which cannot happen unless the table was sealed with
// the creation still in flight: the caller then still owns v.
func (t *Table[K, V]) Publish(s *Slot[K, V], claim *State[V], v V) bool {
	// A claimed slot has never been Ready (Invalidate ends a slot), so its
	// value is unused and nobody reads it until the CAS publishes it.
	s.value = v
	return s.state.CompareAndSwap(claim, t.published)
}

// SetProbation makes Publish store values cooled rather than young (see
// [Table.Cool]): a value starts on probation, first in line for eviction
// unless it is used again, the probationary segment of SLRU and of
// W-TinyLFU's main space. A cache with a capacity cap calls it once, before
// any use: a value used once (a one-hit wonder, the tail of a Zipf
// distribution) then makes room sooner than one used twice. Its first hit
// after the creation takes the slow path once, to make it young.
func (t *Table[K, V]) SetProbation() { t.published = t.aged[0] }

// Invalidate moves a Ready slot to Dead and returns the value it held; the
// caller now owns that value. The key gets a fresh Empty slot (Straggling,
// if the value answered a straggler still running), so the table keeps no
// reference to the value. ok is false when the slot was not Ready. The
// change of state and the replacement take the shard's mutex together.
func (t *Table[K, V]) Invalidate(s *Slot[K, V]) (v V, ok bool) {
	return t.InvalidateIf(s, nil)
}

// InvalidateIf is Invalidate, done only if match (when not nil) reports true
// for the held value. match may be called more than once, never with a lock
// held. If match or the table's hash (Options.Hash) panics, the slot is
// left as it was.
func (t *Table[K, V]) InvalidateIf(s *Slot[K, V], match func(V) bool) (v V, ok bool) {
	return t.invalidate(s, match)
}

func (t *Table[K, V]) invalidate(s *Slot[K, V], match func(V) bool) (v V, ok bool) {
	// Hashed before the slot changes: once it is Dead, the caller owns the
	// value, and a panic in the caller's Hash would lose it.
	h := t.Hash(s.key)
	for {
		st := s.state.Load()
		if !isValue(st) || (match != nil && !match(s.value)) {
			return v, false
		}
		if t.kill(s, st, h) {
			return s.value, true
		}
	}
}

// kill moves s from st, a state holding its value, to Dead and puts a fresh
// slot for its key, whose hash is h, in its place: the table keeps no
// reference to the value. It reports false, changing nothing, if s no
// longer holds st.
//
// Both steps are one, under the shard's mutex, so that no rebuild comes
// between them: a rebuild leaves Dead slots behind, and the fresh slot is
// what carries a straggler (Slot.MarkStraggler). So every slot in a shard's
// current array is alive: a slot turns Dead only under the mutex, and
// leaves the array in the same step (here, or in rebuild).
func (t *Table[K, V]) kill(s *Slot[K, V], st *State[V], h uint64) bool {
	sh := t.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !s.state.CompareAndSwap(st, t.dead) {
		return false
	}
	s.untrack()
	if testHookDead != nil {
		testHookDead(sh)
	}
	// A slot holding a value is in the array until it is Dead: rebuilds
	// keep it, and Seal, which takes the mutex too, would have changed st.
	if p := t.probe(sh.cells.Load(), h, s.key); p != nil && p.Load() == s {
		t.renew(sh, p, s)
	}
	return true
}

// testHookDead, set only by tests, runs right after kill has made a slot
// Dead, with the shard's mutex held.
var testHookDead func(sh any)

// rebuild replaces a full array with one holding its live slots at 5/8
// load. Slots that hold nothing worth keeping (Empty, or a remembered
// failure whose Until has passed) are marked Dead first, by CAS, so that a
// Claim racing with the rebuild either keeps its slot alive or fails and
// looks again; Dead ones are left behind. Called with sh.mu held.
//
// One walk of the old array collects the live slots, and the new array is
// filled from them: under churn most of a rebuild's work (an eviction
// leaves an Empty slot in the array, and the rebuild it leads to reclaims
// it), which a second walk of the old array, and a call per slot, doubled
// (BenchmarkMissUnderCap).
func (t *Table[K, V]) rebuild(sh *shard[K, V], old *array[K, V]) *array[K, V] {
	live := make([]*Slot[K, V], 0, sh.used)
	var now time.Time // read once a failure is met: most slots are values or Empty
	for g := range old.groups() {
		grp := old.group(g)
		for j := range uint64(groupSlots) {
			s := grp.slot(j).Load()
			if s == nil {
				continue
			}
			if isValue(s.state.Load()) {
				live = append(live, s) // a value, young, aged or being removed (whose kill waits for the mutex)
				continue
			}
			if now.IsZero() {
				now = time.Now()
			}
			if !t.reclaim(s, now) {
				live = append(live, s)
			}
		}
	}
	// No slot turns Dead meanwhile (kill takes the mutex) or back to
	// life, so exactly the live slots are copied: they fit. Groups keep
	// no hash, so each key is hashed again (Options.Hash, if set, is
	// called here, with the shard's mutex held).
	a := newArray[K, V](max(minSlots, (len(live)+1)*refillDen/refillNum+1))
	for _, s := range live {
		a.put(t.Hash(s.key), s)
	}
	sh.used = len(live)
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
			if !t.shards[i].cells.Load().each(yield) {
				return
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
//
// The sealed slots then leave the table, which starts afresh with empty
// arrays (a key looked up later gets a new Sealed slot): a closed table kept
// by its owner keeps no value reachable.
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
		batch = batch[:0]
		sh.cells.Load().each(func(s *Slot[K, V]) bool {
			if old := s.state.Swap(t.sealed); old != nil && old != t.dead {
				s.untrack()
				batch = append(batch, sealed{s, old})
			}
			return true
		})
		sh.cells.Store(newArray[K, V](minSlots))
		sh.used = 0
		sh.mu.Unlock()
		for _, b := range batch {
			seal(b.s, b.old)
		}
	}
	return nil
}
