package shard

import (
	"errors"
	"sync/atomic"
	"unsafe"
)

// Leases keep a value alive after it has left the table.
//
// A Ready slot's value may be leased: [Slot.Lease] hands out a [Ticket],
// and [Slot.EndLease] gives it back. The owner of a value that leaves the
// table (Invalidate, Seal) calls [Slot.Abandon] once; from then on no
// lease is handed out, and the value is released by whoever ends its last
// lease: Abandon's caller if none was held, else the EndLease that ends the
// last one. So a value is never released while leased, and released once.
//
// The leases of a slot live in a table made by its first lease, so that a
// slot never leased costs one pointer. The table has eight tickets, one
// word each:
//
//	bit 63: gone (the value has left the table: no new lease)
//	bit 62: held
//	bit 61: watched (see Watch)
//	bits 0-57: generation, advanced by every EndLease (and wrapping)
//
// A lease claims a free ticket by CAS, and ends by a CAS that clears held
// and advances the generation, which must be the one it was handed: a
// Ticket ended twice finds another generation (or held clear) and gets
// ErrLeaseEnded, even if the ticket has been handed out again meanwhile. So
// a lease costs one CAS to take and one to end, on one cache line of the
// slot's own, and nothing else: no lock, no allocation. More than eight
// leases of one value at once take overflow leases, which allocate.
//
// (The first ticket was tried in the slot itself, to save the lease
// table's cache line: no faster, measured, and it would make a slot of an
// 8-byte key and a pointer take a 48-byte allocation instead of 32.)
//
// Abandon sets gone in every ticket (and in the overflow count), counting
// those held, and adds the count to drain; every EndLease that finds gone
// set in its ticket (it was counted) subtracts one. The party that brings
// drain to 0 releases the value: Abandon itself if it counted nothing, or
// if every counted lease ended before it added its count.
const leaseTickets = 8

const (
	ticketGone    = 1 << 63
	ticketHeld    = 1 << 62
	ticketWatched = 1 << 61
	ticketGen     = 1<<58 - 1 // a Ticket holds the generation in its top 59 bits
	extraGone     = 1 << 62   // in leaseTable.extra, above any count
)

// leaseTable holds a slot's leases, and the rarer things a slot may need
// beside them, so that a slot that needs none costs one pointer.
type leaseTable struct {
	tickets [leaseTickets]atomic.Uint64
	extra   atomic.Uint64 // overflow leases outstanding, | extraGone
	drain   atomic.Int64  // see the comment above
	// straggler is the *Flight[V] of the straggler marked on this slot
	// (see Slot.MarkStraggler): written before the slot is published,
	// read after it is invalidated, so the state's CAS orders the two.
	straggler any
	// handle is the *Handle[K, V] of the slot, if Track made one: written
	// before the slot is published, read after it leaves the table.
	handle any
	_      [leaseTablePad]byte
}

// leaseTablePad makes a lease table 128 bytes, an allocation size class
// whose objects start on a 128-byte boundary: the tickets have a cache line
// of their own. At 96 bytes, two tables, usually of values leased around
// the same time (a table is made by its value's first lease), shared a
// line, and leases of two different peers on two Ps wrote it in turn:
// Acquire and Release on GOMAXPROCS 2 took 35-50 ns against 16.5 on one.
const leaseTablePad = 128 - 8*leaseTickets - 8 - 8 - 4*unsafe.Sizeof(uintptr(0)) // straggler and handle: two words each

// abandoned is the lease table of a slot whose value left the table before
// its first lease: every ticket is gone.
var abandoned = func() *leaseTable {
	tb := new(leaseTable)
	for i := range tb.tickets {
		tb.tickets[i].Store(ticketGone)
	}
	tb.extra.Store(extraGone)
	return tb
}()

// Ticket is one lease of a slot's value, handed out by [Slot.Lease]. Its
// zero value is no lease. Two words, so that a lease passes in registers.
type Ticket struct {
	v     uint64       // generation<<5 | overflowBit | validBit | index
	extra *atomic.Bool // an overflow lease's: held
}

const (
	indexMask   = 7
	validBit    = 1 << 3
	overflowBit = 1 << 4 // with extra set
)

// ticketOf, genOf and ticketIndex make and take apart a ticket's word.
// They are generic functions rather than methods for the reason tagOf
// gives: the lease's hit path (Table.Lease, Slot.EndFirstLease) calls them.
func ticketOf[W ~uint64](gen W, j int) Ticket {
	return Ticket{v: uint64(gen)<<5 | validBit | uint64(j)}
}
func genOf[W ~uint64](v W) W         { return v >> 5 }
func ticketIndex[W ~uint64](v W) int { return int(v & indexMask) }

// Valid reports whether t was handed out by Lease (whether or not it has
// ended since).
func (t Ticket) Valid() bool { return t.v&validBit != 0 }

// ErrLeaseEnded is returned by [Slot.EndLease] for a ticket already ended.
var ErrLeaseEnded = errors.New("shard: lease already ended")

// leaseTable returns s's lease table, making it if s has none.
func (s *Slot[K, V]) leaseTable() *leaseTable {
	if tb := s.leases.Load(); tb != nil {
		return tb
	}
	tb := new(leaseTable)
	if s.leases.CompareAndSwap(nil, tb) {
		return tb
	}
	return s.leases.Load()
}

// Lease hands out a lease of s's value, unless the value has left the table
// (ok is false). The caller checks first that s is Ready: a lease taken
// while an Abandon runs is counted by it. It takes no lock, and allocates
// only s's first lease table and leases beyond eight at once.
func (s *Slot[K, V]) Lease() (t Ticket, ok bool) {
	tb := s.leaseTable()
	for j := range leaseTickets {
		p := &tb.tickets[j]
		w := p.Load()
		if w&ticketGone != 0 {
			return Ticket{}, false
		}
		if w&ticketHeld == 0 && p.CompareAndSwap(w, w|ticketHeld) {
			return ticketOf(w&ticketGen, j), true
		}
	}
	for {
		e := tb.extra.Load()
		if e&extraGone != 0 {
			return Ticket{}, false
		}
		if tb.extra.CompareAndSwap(e, e+1) {
			held := new(atomic.Bool)
			held.Store(true)
			return Ticket{v: validBit | overflowBit, extra: held}, true
		}
	}
}

// EndLease ends the lease t of s. last reports that the value had left the
// table and this was its last lease: the caller releases it. A ticket that
// has ended already gives ErrLeaseEnded and changes nothing; so does the
// zero Ticket.
func (s *Slot[K, V]) EndLease(t Ticket) (last bool, err error) {
	last, _, err = s.EndWatchedLease(t)
	return last, err
}

// EndWatchedLease is EndLease that also reports whether the lease was
// watched (Watch): an eviction found the value leased, and the caller tells
// it that the value may be free now. An overflow lease (the ninth of a
// value at once, and later) reports watched, as Watch does not mark it.
func (s *Slot[K, V]) EndWatchedLease(t Ticket) (last, watched bool, err error) {
	if s.EndFirstLease(t) {
		return false, false, nil
	}
	if !t.Valid() {
		return false, false, ErrLeaseEnded
	}
	if t.extra != nil {
		if !t.extra.CompareAndSwap(true, false) {
			return false, false, ErrLeaseEnded
		}
		tb := s.leases.Load() // not nil: it counted the overflow lease
		if tb == nil {
			return false, false, ErrLeaseEnded
		}
		if tb.extra.Add(^uint64(0))&extraGone != 0 {
			return tb.drain.Add(-1) == 0, true, nil
		}
		return false, true, nil
	}
	tb := s.leases.Load()
	if tb == nil {
		return false, false, ErrLeaseEnded // not a ticket of s
	}
	p := &tb.tickets[ticketIndex(t.v)]
	gen := genOf(t.v)
	for {
		w := p.Load()
		if w&ticketHeld == 0 || w&ticketGen != gen {
			return false, false, ErrLeaseEnded
		}
		if p.CompareAndSwap(w, w&ticketGone|(gen+1)&ticketGen) { // and the want served
			watched = w&ticketWatched != 0
			if w&ticketGone != 0 {
				return tb.drain.Add(-1) == 0, watched, nil
			}
			return false, watched, nil
		}
	}
}

// EndFirstLease ends t if it is a lease of s's first ticket and the value
// has not left the table, and otherwise reports false, changing nothing:
// the caller calls EndLease. It is the common case of EndLease, one
// compare-and-swap, small enough to inline.
func (s *Slot[K, V]) EndFirstLease(t Ticket) bool {
	if t.v&(overflowBit|validBit|indexMask) != validBit {
		return false
	}
	tb := s.leases.Load()
	gen := genOf(t.v)
	return tb != nil && tb.tickets[0].CompareAndSwap(ticketHeld|gen, (gen+1)&ticketGen)
}

// Watch marks s's value as watched by an eviction that found it leased:
// every lease of it held now, and the next lease of each of its free
// tickets, ends through EndLease rather than EndFirstLease's one-CAS path,
// so that its caller (which returns to its own slow path too) can tell the
// eviction that the value may be free. The end of a lease clears its
// ticket's mark: a value watched once does not send every later lease to
// the slow path (it did, and in a hot set that the clock hand kept finding
// leased, the ends of leases were a third of the evictions' CPU). It takes
// no lock and changes nothing else.
func (s *Slot[K, V]) Watch() {
	tb := s.leaseTable()
	for j := range tb.tickets {
		tb.tickets[j].Or(ticketWatched)
	}
}

// Abandon marks s's value as gone from the table: no lease is handed out
// any more. Its owner calls it once, having taken the value out of the
// table (Invalidate, Seal). releaseNow reports that no lease holds the
// value: the caller releases it. Otherwise the last EndLease reports last.
func (s *Slot[K, V]) Abandon() (releaseNow bool) {
	tb := s.leases.Load()
	if tb == nil {
		if s.leases.CompareAndSwap(nil, abandoned) {
			return true // never leased
		}
		tb = s.leases.Load()
	}
	var held int64
	for j := range tb.tickets {
		if tb.tickets[j].Or(ticketGone)&ticketHeld != 0 {
			held++
		}
	}
	held += int64(tb.extra.Or(extraGone) &^ extraGone)
	return tb.drain.Add(held) == 0
}

// Leased reports how many leases of s's value are held now. It reads each
// ticket once, without a lock: a snapshot for statistics and tests.
func (s *Slot[K, V]) Leased() int {
	tb := s.leases.Load()
	if tb == nil {
		return 0
	}
	n := 0
	for j := range tb.tickets {
		if tb.tickets[j].Load()&ticketHeld != 0 {
			n++
		}
	}
	return n + int(tb.extra.Load()&^extraGone)
}

// A claimer that wants a lease of the value it creates (epcache's Acquire)
// gets one taken by the creator before the value is published, so that no
// Invalidate can come between the creation and the lease: otherwise the
// claimer would have to create again, and the value it made would have
// existed for nobody. The claimer may leave (its context) before or after
// the creator takes the lease; the state word arbitrates, and whoever loses
// the race ends the lease.
type flightLease struct {
	wanted bool          // set by the claimer before the creation starts
	state  atomic.Uint32 // leaseNone, leaseLeft, leaseTaken, leaseHandedOver
	ticket Ticket        // written before state becomes leaseTaken
}

const (
	leaseNone       = iota // the creator has not leased, the claimer has not left
	leaseLeft              // the claimer will not take a lease: the creator takes none
	leaseTaken             // the creator leased the value for the claimer
	leaseHandedOver        // the claimer has the lease
)

// WantLease asks the creator of f to lease its value for the claimer. Call
// it before the creation starts.
func (f *Flight[V]) WantLease() { f.lease.wanted = true }

// LeaseFor leases s's value, about to be published, for the claimer of f,
// if it asked and is still there. The creator calls it just before
// Publish.
func (s *Slot[K, V]) LeaseFor(f *Flight[V]) {
	if !f.lease.wanted || f.lease.state.Load() != leaseNone {
		return
	}
	t, ok := s.Lease()
	if !ok {
		return
	}
	f.lease.ticket = t
	if !f.lease.state.CompareAndSwap(leaseNone, leaseTaken) {
		// The claimer left meanwhile: the value is not published yet, so
		// this lease cannot be its last.
		_, _ = s.EndLease(t)
	}
}

// TakeLease is the claimer's: after f's Done, it returns the lease its
// creator took for it, or ok false (it must lease the value itself).
func (f *Flight[V]) TakeLease() (t Ticket, ok bool) {
	if f.lease.state.CompareAndSwap(leaseTaken, leaseHandedOver) {
		return f.lease.ticket, true
	}
	f.lease.state.CompareAndSwap(leaseNone, leaseLeft)
	return Ticket{}, false
}

// ClaimerLeaves is the claimer's when it leaves before the outcome (its
// context, Close): the creator takes no lease for it, or, if the creator
// took one already, it is returned as t for the claimer to end.
func (f *Flight[V]) ClaimerLeaves() (t Ticket, taken bool) {
	if f.lease.state.CompareAndSwap(leaseNone, leaseLeft) {
		return Ticket{}, false
	}
	return f.TakeLease()
}
