package shard

import (
	"errors"
	"runtime"
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
// slot never leased costs one pointer. A lease holds a ticket, one word:
//
//	bit 63: gone (the value has left the table: no new lease)
//	bit 62: held
//	bit 61: watched (see Watch)
//	bit 58: record P: every lease that takes or ends it records its P
//	bit 57: P fresh: the take that left this word recorded its P
//	bits 48-56: the hint of the goroutine that took it last (leaseHint)
//	bits 40-47: the P that a goroutine ran on when a take recorded it
//	bits 0-39: generation, advanced by every lease that takes it (and wrapping)
//
// A lease claims a free ticket by a CAS that sets held and advances the
// generation, and ends by a CAS that clears held, which must find the word
// it was handed: a Ticket ended twice finds held clear, or another
// generation, and gets ErrLeaseEnded, even if the ticket has been handed
// out again meanwhile. So a lease costs one CAS to take and one to end,
// and nothing else: no lock, no allocation.
//
// Where the tickets are decides whether leases scale with cores. The table
// has one line of eight tickets, enough while the value's leases come from
// one core. A line written from two cores moves between their caches at
// every lease, so the table counts the evidence of that, and only that:
// another goroutine on another P. A ticket records who took it last, a
// hint of the goroutine's identity (leaseHint: its g, the same at every
// call depth and across stack moves, on amd64 and arm64; elsewhere the
// block its stack is in), and a P. A value leased again and again by one
// goroutine pays nothing for it: a lease reads its P (procPin) only when
// its hint differs from the ticket's, or the ticket records P, and the
// fresh bit says whether the P a ticket holds is that of the take that
// left the word. The first ticket starts out recording a P at take-overs
// only, which says nothing of where the last lease ended (its goroutine
// may have moved while it held it) nor of the takes its goroutine made
// since without reading a P; so the first take-over from another
// goroutine (unless every P involved is 0: at GOMAXPROCS 1 all are) sets
// record P in the ticket, and from then on every take and every end of it
// writes the P it ran on (TryEndRecording): the ticket holds the P of the
// last write to its line. Evidence is then:
//
//   - a lease that takes the first ticket, recording P, over from a
//     goroutine with another hint whose write was on another P
//     (Table.Acquire, takenOver), once per take; or
//   - the same of any ticket of the first line, taken by a lease that
//     found the first ticket held (Slot.Lease), so that goroutines on two
//     Ps leasing beside one lease held long (across a blocking send) are
//     evidence too; or
//   - a lease that finds the first ticket held by a goroutine with another
//     hint whose take recorded another P (caught), once per hold: however
//     often the lease is retried while that one lease is held, it counts
//     once (the hold's generation is kept whole beside the count).
//
// A held ticket whose P is stale is no evidence either way: the lease that
// finds it sets record P in the ticket. Nothing else counts: one
// goroutine's nested leases (its own hint, held), at whatever depth,
// moving to another P or not; goroutines taking turns on one P, or each
// taking the ticket on the P where the last lease ended, wherever that
// lease was taken (the line is in that core's cache); two goroutines whose
// hints hash alike (one pair in 256: they are taken for one, and a third
// goroutine's leases count against both). A ticket that records P costs
// its leases a call and a read of the P at the end, until the value grows
// (the lines' tickets never record P). After growAfter pieces of
// evidence, at GOMAXPROCS above 1,
// the table grows lines of their own: linesPerP 128-byte lines of eight
// tickets for each P (GOMAXPROCS at the growth, at most maxLines lines in
// all: beyond 16 Ps, Ps share lines), made once, by one lease, however
// many reach the growth at once. A lease then takes a ticket on the
// first line of the P that runs it, which only that P writes while it
// holds fewer than eight leases of the value: two cores leasing one value
// write two lines, each of which stays in its core's cache, and the value
// scales with cores as a Get does. A goroutine that moves to another P
// before it ends its lease writes the old P's line once. The count is
// kept, not the GOMAXPROCS of the moment it was reached: a value whose
// evidence came while GOMAXPROCS was 1 (a goroutine moved between Ps as
// GOMAXPROCS fell) grows at its next evidence once GOMAXPROCS is above 1.
//
// Growth costs memory, which is why it waits for evidence of several
// cores: 128 bytes a line, lines a power of two, so that the allocation is
// a size class of its own with nothing rounded up (TestGrownTableMemory):
// beside the 128-byte table, 1 KiB at GOMAXPROCS 2, 2 KiB at 3 and 4,
// 4 KiB at 5 to 8, and 8 KiB at 9 and beyond (maxLines bounds it). A value
// leased from one core at a time, or at GOMAXPROCS 1, never grows.
//
// More than eight leases of one line held at once look for a free ticket
// on the other lines, and past them all take overflow leases, which
// allocate.
//
// Abandon stops the growth (no line is made after it), sets gone in every
// ticket of every line (and in the overflow count), counting those held,
// and adds the count to drain; every EndLease that finds gone set in its
// ticket (it was counted) subtracts one. The party that brings drain to 0
// releases the value: Abandon itself if it counted nothing, or if every
// counted lease ended before it added its count. Abandon so costs one
// atomic operation per ticket: 8 for a value that never grew, 8×(lines+1)
// for one that did.
const leaseTickets = 8

const (
	ticketGone    = 1 << 63
	ticketHeld    = 1 << 62
	ticketWatched = 1 << 61
	ticketRecordP = 1 << 58     // every lease that takes or ends the ticket records its P (see takenOver)
	ticketFresh   = 1 << 57     // ticketP is the P of the take that left the word
	ticketHint    = 0x1ff << 48 // who took the ticket last (leaseHint)
	ticketP       = 0xff << 40  // a P a take recorded (pidBits)
	ticketGen     = 1<<40 - 1
	// Bits of a Ticket's word, never of a ticket's: a lease whose Ticket
	// has one of them ends on EndLease's slow path (the fast path's CAS
	// cannot match).
	ticketSlow     = 1 << 60 // taken watched: its end must report it
	ticketOverflow = 1 << 59 // an overflow lease: its word is its own
	extraGone      = 1 << 62 // in leaseTable.extra, above any count
	extraNoted     = 1 << 61 // in leaseTable.extra: see Slot.Note
	extraCount     = extraNoted - 1
)

// pidBits is the ticket's P field for the P pid.
func pidBits[W ~uint64](pid int) W { return W(pid&0xff) << 40 }

// identityHint is the ticket hint of x, an identity of a goroutine: the
// top eight bits of x's multiplicative hash, which every bit of x moves
// (g structs lie a size class apart), with the field's top bit set, so
// never 0 (a ticket never taken has hint 0).
func identityHint[W ~uint64](x W) W {
	return (x*0x9e3779b97f4a7c15>>56 | 0x100) << 48
}

// growAfter is how many pieces of evidence of another goroutine on another
// P (see the comment at the top) a value needs before its table grows lines:
// a value leased from two cores now and then is not worth a kilobyte.
const growAfter = 16

// linesPerP is how many lines a table grows for each P: a P's leases take
// tickets on the first of its lines, and on the others when more than
// eight are held at once (goroutines that hold a lease across a blocking
// send), before they spill to another P's lines.
const linesPerP = 4

// maxLines bounds the lines a table grows: what a value leased from every
// core at once may cost.
const maxLines = 64

// leaseTable holds a slot's leases, and the rarer things a slot may need
// beside them, so that a slot that needs none costs one pointer.
type leaseTable struct {
	tickets [leaseTickets]atomic.Uint64 // the first line: every lease's, until lines are made
	extra   atomic.Uint64               // overflow leases outstanding, | extraGone, | extraNoted
	drain   atomic.Int64                // see the comment above
	lines   atomic.Pointer[leaseLine]   // the first of the lines made on contention, or sealedLines
	// contended counts, in its low bits (contendedCount), the evidence of
	// another goroutine on another P, up to growAfter, and holds, from
	// contendedHoldShift, the generation of the last hold of the first
	// ticket that counted (caught). Once grow made
	// lines, its bits from contendedMaskShift hold their mask, so that a
	// lease finds its P's line with the lines pointer, which is in the
	// same cache line, and does not read the first line's mask. Its top
	// bit records that Watch was ever called, for the lines made after it
	// (see grow).
	contended atomic.Uint64
	_         [leaseTablePad]byte
	// straggler is the *Flight[V] of the straggler marked on this slot
	// (see Slot.MarkStraggler): written before the slot is published,
	// read after it is invalidated, so the state's CAS orders the two.
	// An unsafe.Pointer, not an any, so that owner fits in the 128 bytes:
	// only the slot's methods, which know V, read it.
	straggler unsafe.Pointer
	// handle is the *Handle[K, V] of the slot, if Track made one: written
	// before the slot is published, read after it leaves the table.
	handle unsafe.Pointer
	// owner is what the call that made the table was given as owner (see
	// Slot.Owner): written before the table is published, never after.
	owner any
}

// leaseTablePad makes a lease table 128 bytes, an allocation size class
// whose objects start on a 128-byte boundary: the first line of tickets
// has a cache line of its own, and two tables (of values leased around the
// same time, whose tables are made then) share none.
const leaseTablePad = 128 - 8*leaseTickets - 8 - 8 - 8 - 8 - 4*unsafe.Sizeof(uintptr(0)) // lines: 8 bytes on 32-bit too (contended is 8-aligned); straggler and handle: a word each; owner: two

// Bits of leaseTable.contended.
const (
	contendedWatch     = 1 << 63
	contendedGrowing   = 1 << 55 // a lease is making the lines (grow)
	contendedHoldSeen  = 1 << 54 // a hold was counted: contendedHold is its generation
	contendedMaskShift = 48      // the lines' mask, 0 until grow stores it; maxLines-1 fits below contendedHoldSeen
	contendedMask      = (maxLines - 1) << contendedMaskShift
	// contendedHold: the generation of the last hold of the first ticket
	// that caught counted, whole (a ticket's generation is 40 bits).
	contendedHoldShift = 8
	contendedHold      = ticketGen << contendedHoldShift
	contendedCount     = 1<<contendedHoldShift - 1 // never above growAfter (contend)
)

// leaseLine is one P's line of tickets (see the comment above), 128
// bytes: adjacent-line prefetching pairs 64-byte lines, as shard's
// shardPadded says. The first line of a table's lines also holds their
// mask, in the half of its 128 bytes that no ticket is in, so that the
// lines are one allocation of 128 bytes times a power of two, a size class
// of that exact size whose objects start on a boundary of it: no line is
// shared with another object, and nothing is rounded up.
type leaseLine struct {
	tickets [leaseTickets]atomic.Uint64
	mask    atomic.Uint64 // of the first line: the number of lines less one, a power of two less one
	_       [128 - 8*leaseTickets - 8]byte
}

// lineAt returns line i (modulo their number) of the lines whose first is
// h.
func lineAt[W ~uint64](h *leaseLine, i W) *leaseLine {
	return line(h, i&W(h.mask.Load()))
}

// line returns line i of the lines whose first is h, i no greater than
// their mask.
//
// Safety: h is the first of mask+1 lines of one allocation (newLines), and
// i <= mask stays inside it.
func line[W ~uint64](h *leaseLine, i W) *leaseLine {
	return (*leaseLine)(unsafe.Add(unsafe.Pointer(h), uintptr(i)*unsafe.Sizeof(*h)))
}

// lineOf returns the first line of the P pid in tb, whose lines are h: the
// mask is contended's, which is no greater than h's (it is 0 until grow,
// having published h, stores h's, and h, once lines, never changes).
func lineOf[W ~uint64](tb *leaseTable, h *leaseLine, pid W) *leaseLine {
	return line(h, pid*linesPerP&(W(tb.contended.Load())>>contendedMaskShift&(maxLines-1)))
}

// newLines returns the first of n fresh lines, n a power of two.
func newLines(n int) *leaseLine {
	ls := make([]leaseLine, n)
	ls[0].mask.Store(uint64(n - 1))
	return &ls[0]
}

// sealedLines is what Abandon leaves in a table that has no lines, so
// that none is made afterwards: one line of tickets all gone.
var sealedLines = func() *leaseLine {
	h := newLines(1)
	for j := range leaseTickets {
		lineAt(h, uint64(0)).tickets[j].Store(ticketGone)
	}
	return h
}()

// abandoned is the lease table of a slot whose value left the table before
// its first lease: every ticket is gone.
var abandoned = func() *leaseTable {
	tb := new(leaseTable)
	for i := range tb.tickets {
		tb.tickets[i].Store(ticketGone)
	}
	tb.extra.Store(extraGone)
	tb.lines.Store(sealedLines)
	return tb
}()

// Ticket is one lease of a slot's value, handed out by [Slot.Lease]. Its
// zero value is no lease. Three words, so that a lease passes in
// registers: the ticket's word as the lease took it, the word its end
// leaves, and where the ticket is. The end word is kept, not computed, so
// that TryEnd is a compare-and-swap of three loaded fields and nothing
// else: a cache's Release, which calls it, then fits the inliner's budget.
type Ticket struct {
	w uint64  // held | hint | generation, as the lease left the ticket, | ticketSlow or ticketOverflow
	e uint64  // w without held: what the end leaves in the ticket
	p *uint64 // the ticket, an atomic.Uint64, only ever accessed atomically: a plain pointer, so that TryEnd's CAS takes the field as it is (see wordOf)
}

// heldTicket returns the Ticket of a lease that took p, leaving w in it.
func heldTicket(w uint64, p *uint64) Ticket { return Ticket{w: w, e: w &^ ticketHeld, p: p} }

// wordOf returns the word of ticket p, for a Ticket.
//
// Safety: atomic.Uint64 is one uint64; the Ticket's word is only ever
// accessed atomically, as p's.
func wordOf(p *atomic.Uint64) *uint64 { return (*uint64)(unsafe.Pointer(p)) }

// Valid reports whether t was handed out by Lease (whether or not it has
// ended since), or is Unheld's: false only for the zero Ticket.
func (t Ticket) Valid() bool { return t.p != nil }

// Unheld returns a Ticket that holds no lease and that no end ever ends:
// its word, gone and not held, never changes. It is what a cache hands out
// beside an error, so that a Release of it takes the cache's slow path and
// is reported there, where the zero Ticket would be dereferenced.
func Unheld() Ticket { return unheld }

var unheld = Ticket{p: func() *uint64 { w := uint64(ticketGone); return &w }()}

// ErrLeaseEnded is returned by [Slot.EndLease] for a ticket already ended.
var ErrLeaseEnded = errors.New("shard: lease already ended")

// leaseTable returns s's lease table, making it, with owner, if s has none.
func (s *Slot[K, V]) leaseTable(owner any) *leaseTable {
	if tb := s.leases.Load(); tb != nil {
		return tb
	}
	tb := &leaseTable{owner: owner}
	if s.leases.CompareAndSwap(nil, tb) {
		return tb
	}
	return s.leases.Load()
}

// Owner returns the owner given to the call that made s's lease table
// (Lease, LeaseFor, Watch, MarkStraggler or Track), or nil if s has no
// lease table. A cache gives itself, so that the end of a lease, which holds the slot
// and a Ticket but not the cache, finds the cache here: every call on the
// slots of one table gives the same owner (Table.SetOwner's, on the
// table's own calls). A slot whose value left the table before its first
// lease has no owner either: no lease of it is ever handed out.
func (s *Slot[K, V]) Owner() any {
	if tb := s.leases.Load(); tb != nil {
		return tb.owner
	}
	return nil
}

// take claims p's ticket if it is free, for a lease of a goroutine with
// hint on the P whose pidBits are pb. gone reports that the value has left
// the table.
func take(p *atomic.Uint64, hint, pb uint64) (t Ticket, ok, gone bool) {
	t, ok, gone, _ = takeFrom(p, hint, pb, false)
	return t, ok, gone
}

// takeFrom is take, for a ticket of the first line if first: its take
// follows takenOver's rule, as Table.Acquire's of the first ticket does,
// and moved reports that it is evidence of another goroutine on another P.
func takeFrom(p *atomic.Uint64, hint, pb uint64, first bool) (t Ticket, ok, gone, moved bool) {
	for {
		w := p.Load()
		switch {
		case w&ticketGone != 0:
			return Ticket{}, false, true, false
		case w&ticketHeld != 0:
			return Ticket{}, false, false, false
		}
		nw := taken(w, hint)&^ticketP | pb | ticketFresh
		if first {
			nw, moved = takenOver(w, nw, hint, pb)
		}
		if p.CompareAndSwap(w, nw) {
			t = heldTicket(nw&^ticketWatched, wordOf(p))
			if nw&(ticketWatched|ticketRecordP) != 0 {
				t.w |= ticketSlow // TryEnd cannot match it: its end reports the watch, or records its P
			}
			return t, true, false, moved
		}
	}
}

// taken is the word of a free ticket w once a lease with hint has taken
// it: held, and the next generation. The P stays w's, no longer fresh: a
// lease that records its P sets it and ticketFresh (Table.Acquire, take).
func taken[W ~uint64](w, hint W) W {
	return w&^(ticketHint|ticketGen|ticketFresh) | (w+1)&ticketGen | ticketHeld | hint
}

// takenOver is taken for the word w of a ticket of the first line, taken
// by a goroutine with hint on the P whose pidBits are pb (Table.Acquire
// reads pb only when w was taken last by another goroutine, or never, or
// records P; Slot.Lease always does): nw with that P recorded, and whether the take is evidence of another goroutine
// on another P (see the comment at the top). Only a word that records P
// holds the P of the last write to its line, a take's or an end's: it
// is evidence if another goroutine wrote it from another P. A word that
// does not holds at most the P of a take, and says nothing of where that
// lease ended (its goroutine may have moved), nor of the takes its
// goroutine made since without reading a P: the first take over from
// another goroutine sets record P instead, unless every P involved is 0
// (at GOMAXPROCS 1, all are), and counts nothing.
func takenOver[W ~uint64](w, nw, hint, pb W) (W, bool) {
	nw = nw&^ticketP | pb | ticketFresh
	if w&ticketRecordP != 0 {
		return nw, w&ticketFresh != 0 && w&ticketHint != hint && w&ticketP != pb
	}
	if w&ticketHint != 0 && w&ticketHint != hint && (w&ticketP|pb) != 0 {
		nw |= ticketRecordP
	}
	return nw, false
}

// takeLine claims a free ticket of line l.
func takeLine(l *[leaseTickets]atomic.Uint64, hint, pb uint64) (t Ticket, ok, gone bool) {
	for j := range l {
		if t, ok, gone = take(&l[j], hint, pb); ok || gone {
			return t, ok, gone
		}
	}
	return Ticket{}, false, false
}

// procPin and procUnpin are the runtime's: procPin returns the id of the P
// running the caller, and keeps the goroutine on it until procUnpin
// (sync.Pool's per-P caches are found so). The runtime keeps both for
// packages outside it (go.dev/issue/67401).
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// Lease hands out a lease of s's value, unless the value has left the table
// (ok is false): a ticket of the caller's line, if the table has lines,
// then of any line, then of the first line, then an overflow lease. The
// caller checks first that s is Ready: a lease taken while an Abandon runs
// is counted by it. It takes no lock, and allocates only s's first lease
// table, its lines, and leases beyond a line's eight at once when every
// line is full.
func (s *Slot[K, V]) Lease(owner any) (t Ticket, ok bool) {
	var anchor byte
	pid := procPin()
	procUnpin()
	return s.leaseAs(owner, leaseHint[uint64](&anchor), pid)
}

// leaseAs is Lease for the goroutine with hint on the P pid.
func (s *Slot[K, V]) leaseAs(owner any, hint uint64, pid int) (t Ticket, ok bool) {
	pb := pidBits[uint64](pid)
	tb := s.leaseTable(owner)
	h := tb.lines.Load()
	if h == nil {
		if w := tb.tickets[0].Load(); w&ticketHeld != 0 && w&ticketHint != hint {
			h = tb.caught(w, pb) // held by another goroutine
		}
	}
	var gone bool
	if h != nil {
		first := uint64(pid) * linesPerP
		for i := range h.mask.Load() + 1 {
			if t, ok, gone = takeLine(&lineAt(h, first+i).tickets, hint, pb); ok || gone {
				return t, ok
			}
		}
	}
	// The first line's tickets, each taken as Table.Acquire takes the
	// first: the evidence of goroutines on two Ps that lease beside a
	// lease held long on the first ticket (across a blocking send) is the
	// take-overs of the others.
	for j := range tb.tickets {
		var moved bool
		if t, ok, gone, moved = takeFrom(&tb.tickets[j], hint, pb, true); ok || gone {
			if moved {
				tb.contend()
			}
			return t, ok
		}
	}
	for {
		e := tb.extra.Load()
		if e&extraGone != 0 {
			return Ticket{}, false
		}
		if tb.extra.CompareAndSwap(e, e+1) {
			p := new(atomic.Uint64)
			p.Store(ticketHeld)
			return heldTicket(ticketHeld|ticketSlow|ticketOverflow, wordOf(p)), true
		}
	}
}

// contend counts a piece of evidence of another goroutine on another P
// (see the comment at the top), up to growAfter. From the growAfter-th on,
// it makes tb's lines, unless GOMAXPROCS is 1 now (there is no other core
// to keep a line from; the count stays, and the next evidence once
// GOMAXPROCS has risen makes them), and it returns them, or nil if there
// are none.
func (tb *leaseTable) contend() *leaseLine {
	for {
		c := tb.contended.Load()
		if c&contendedCount >= growAfter {
			if runtime.GOMAXPROCS(0) > 1 {
				return tb.grow()
			}
			return tb.lines.Load()
		}
		if tb.contended.CompareAndSwap(c, c+1) {
			if c&contendedCount+1 >= growAfter && runtime.GOMAXPROCS(0) > 1 {
				return tb.grow()
			}
			return tb.lines.Load()
		}
	}
}

// caught answers a lease, on the P whose pidBits are pb, that found the
// value's first ticket w held by a goroutine with another hint. If w's P
// is fresh, the holder ran there when it took the ticket: another P is
// evidence, counted once per hold (its generation), however many leases
// find it. A stale P says nothing of where the holder runs (it took the
// ticket without reading its P, after its own last take: it may have moved
// since), so the first such lease sets ticketRecordP in the ticket and
// counts nothing: from then on every take and end of it records its P
// (Table.Acquire's fast path reads the bit in the word it loads; the
// holder's end, whose word changed, takes EndLease's slow path once, which
// keeps the bit and records the end's P).
func (tb *leaseTable) caught(w, pb uint64) *leaseLine {
	switch {
	case w&ticketFresh == 0:
		if w&ticketRecordP == 0 {
			tb.tickets[0].Or(ticketRecordP)
		}
		return tb.lines.Load()
	case w&ticketP == pb:
		return tb.lines.Load() // the holder took it on this P
	}
	hold := w&ticketGen<<contendedHoldShift | contendedHoldSeen
	for {
		c := tb.contended.Load()
		if c&contendedMask != 0 || c&(contendedHold|contendedHoldSeen) == hold {
			return tb.lines.Load() // grown, or this hold was counted
		}
		if tb.contended.CompareAndSwap(c, c&^(contendedHold|contendedHoldSeen)|hold) {
			return tb.contend()
		}
	}
}

// contended is contend for Table.Acquire, whose lease took s's first
// ticket over from another goroutine whose take recorded another P.
func (s *Slot[K, V]) contended() {
	if tb := s.leases.Load(); tb != nil {
		tb.contend()
	}
}

// grow makes tb's lines, unless another lease or Abandon did first, and
// returns them (nil if Abandon sealed the table, or if another lease is
// making them now: the caller leases from the first line meanwhile).
func (tb *leaseTable) grow() *leaseLine {
	// One lease allocates, however many reach the growth at once: the
	// others go on with the first line until the lines are published.
	for {
		if h := tb.lines.Load(); h != nil {
			return h
		}
		c := tb.contended.Load()
		if c&contendedGrowing != 0 {
			return tb.lines.Load()
		}
		if tb.contended.CompareAndSwap(c, c|contendedGrowing) {
			break
		}
	}
	n := min(ceilPow2(linesPerP*runtime.GOMAXPROCS(0)), maxLines)
	h := newLines(n)
	if !tb.lines.CompareAndSwap(nil, h) {
		return tb.lines.Load()
	}
	// The mask goes where leases find it (lineOf). Watch marks the lines
	// it finds; lines made after it started are marked here (Watch sets
	// contendedWatch, then loads lines; this stores lines, then reads
	// contended: one of the two sees the other).
	if tb.contended.Or(uint64(n-1)<<contendedMaskShift)&contendedWatch != 0 {
		for i := range n {
			for j := range leaseTickets {
				lineAt(h, uint64(i)).tickets[j].Or(ticketWatched)
			}
		}
	}
	return h
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
// it that the value may be free now. An overflow lease reports watched, as
// Watch does not mark it.
func (s *Slot[K, V]) EndWatchedLease(t Ticket) (last, watched bool, err error) {
	if t.p != nil && TryEnd[uint64](t) {
		return false, false, nil
	}
	if t.p == nil {
		return false, false, ErrLeaseEnded
	}
	tb := s.leases.Load()
	if tb == nil {
		return false, false, ErrLeaseEnded // not a ticket of s
	}
	if t.w&ticketOverflow != 0 {
		if !atomic.CompareAndSwapUint64(t.p, ticketHeld, 0) {
			return false, false, ErrLeaseEnded
		}
		if tb.extra.Add(^uint64(0))&extraGone != 0 {
			return tb.drain.Add(-1) == 0, true, nil
		}
		return false, true, nil
	}
	gen := t.w & ticketGen
	for {
		w := atomic.LoadUint64(t.p)
		if w&ticketHeld == 0 || w&ticketGen != gen {
			return false, false, ErrLeaseEnded
		}
		nw := w & (ticketGone | ticketRecordP | ticketFresh | ticketHint | ticketP | ticketGen) // and the watch served
		if w&ticketRecordP != 0 {
			nw = nw&^ticketP | pidBits[uint64](procPin()) | ticketFresh // see TryEndRecording
			procUnpin()
		}
		if atomic.CompareAndSwapUint64(t.p, w, nw) {
			watched = w&ticketWatched != 0
			if w&ticketGone != 0 {
				return tb.drain.Add(-1) == 0, watched, nil
			}
			return false, watched, nil
		}
	}
}

// TryEnd ends the lease t if its value has not left the table and no
// eviction watches it, and otherwise reports false, changing nothing: the
// caller calls EndLease. It is the common case of EndLease, one
// compare-and-swap on the ticket itself, small enough to inline into the
// inlined part of a cache's Release. W is always uint64: a generic
// function is compiled in every program that instantiates the cache, so
// it inlines there, where the compiler inlines a non-generic function of
// this package into generic code only if the program imports this package
// itself (TestHitPathMakesNoCalls checks it).
//
// t must be a Ticket handed out by a lease, or Unheld's: the zero Ticket
// has no word to compare, and the check a nil one would cost is what
// keeps Release out of its callers.
func TryEnd[W ~uint64](t Ticket) bool {
	return atomic.CompareAndSwapUint64(t.p, t.w, t.e)
}

// TryEndRecording is TryEnd for a lease whose ticket records P (see
// takenOver), which TryEnd does not end: it ends t, if its value has not
// left the table and no eviction watches it, recording in the ticket the P
// of the end, and otherwise reports false, changing nothing. A ticket that
// records P holds the P of the last write to it, so that the next lease
// from another goroutine tells whether the line moved between cores, a
// lease's goroutine having moved while it held the lease or not. It costs
// a lease of such a ticket a call and reading its P, beside the CAS; a
// value whose leases come from several cores grows lines, whose tickets
// never record P.
func TryEndRecording(t Ticket) bool {
	if t.p == nil || t.w&(ticketRecordP|ticketOverflow) != ticketRecordP {
		return false
	}
	e := t.e&^(ticketSlow|ticketP) | pidBits[uint64](procPin()) | ticketFresh
	procUnpin()
	return atomic.CompareAndSwapUint64(t.p, t.w&^ticketSlow, e)
}

// eachTicket calls f with every ticket of tb's lines, the first line's
// included. lines is the header of the lines, or nil or sealedLines.
func (tb *leaseTable) eachTicket(lines *leaseLine, f func(p *atomic.Uint64)) {
	for j := range tb.tickets {
		f(&tb.tickets[j])
	}
	if lines == nil || lines == sealedLines {
		return
	}
	for i := range lines.mask.Load() + 1 {
		l := lineAt(lines, i)
		for j := range l.tickets {
			f(&l.tickets[j])
		}
	}
}

// Watch marks s's value as watched by an eviction that found it leased:
// every lease of it held now, and the next lease of each of its free
// tickets, ends through EndLease's slow path, so that its caller (which
// returns to its own slow path too) can tell the eviction that the value
// may be free. The end of a lease clears its ticket's mark, so that a value
// watched once does not send every later lease to the slow path. It takes
// no lock and changes nothing else.
func (s *Slot[K, V]) Watch(owner any) {
	tb := s.leaseTable(owner)
	tb.contended.Or(contendedWatch) // before lines is loaded: see grow
	tb.eachTicket(tb.lines.Load(), func(p *atomic.Uint64) { p.Or(ticketWatched) })
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
	// No line is made from now on, or the one made is seen here.
	lines := tb.lines.Load()
	if lines == nil && !tb.lines.CompareAndSwap(nil, sealedLines) {
		lines = tb.lines.Load()
	}
	// eachTicket's walk, without a call per ticket: every eviction
	// abandons its value.
	var held int64
	for j := range tb.tickets {
		if tb.tickets[j].Or(ticketGone)&ticketHeld != 0 {
			held++
		}
	}
	if lines != nil && lines != sealedLines {
		for i := range lines.mask.Load() + 1 {
			l := lineAt(lines, i)
			for j := range l.tickets {
				if l.tickets[j].Or(ticketGone)&ticketHeld != 0 {
					held++
				}
			}
		}
	}
	held += int64(tb.extra.Or(extraGone) & extraCount)
	return tb.drain.Add(held) == 0
}

// Note records a mark of the owner's on s's value, which Noted reports
// from then on: epcache marks a value whose room it counts as on its way
// to a waiter, for the end of its last lease to tell. Call it before
// Abandon, which the end of a last lease follows.
func (s *Slot[K, V]) Note(owner any) { s.leaseTable(owner).extra.Or(extraNoted) }

// Noted reports whether Note was called for s's value.
func (s *Slot[K, V]) Noted() bool {
	tb := s.leases.Load()
	return tb != nil && tb.extra.Load()&extraNoted != 0
}

// Leased reports how many leases of s's value are held now. It reads each
// ticket once, without a lock: a snapshot for statistics and tests.
func (s *Slot[K, V]) Leased() int {
	tb := s.leases.Load()
	if tb == nil {
		return 0
	}
	n := 0
	tb.eachTicket(tb.lines.Load(), func(p *atomic.Uint64) {
		if p.Load()&ticketHeld != 0 {
			n++
		}
	})
	return n + int(tb.extra.Load()&extraCount)
}

// LeaseLines reports how many lines of tickets s's lease table has grown
// (0: none, or Abandon sealed the table first): what a value's leases cost
// beyond its first line, for statistics and tests.
func (s *Slot[K, V]) LeaseLines() int {
	tb := s.leases.Load()
	if tb == nil {
		return 0
	}
	h := tb.lines.Load()
	if h == nil || h == sealedLines {
		return 0
	}
	return int(h.mask.Load() + 1)
}

// LeaseHeld reports whether a lease of s's value is held now: Leased() > 0,
// as eviction asks it of every value it weighs, which it answers at the
// first lease it finds, reading the first line before the lines a value
// grows (a lease takes a ticket there only when its P's line is full) and
// no more than one word per ticket, without a call per ticket.
func (s *Slot[K, V]) LeaseHeld() bool {
	tb := s.leases.Load()
	if tb == nil {
		return false
	}
	for j := range tb.tickets {
		if tb.tickets[j].Load()&ticketHeld != 0 {
			return true
		}
	}
	if tb.extra.Load()&extraCount != 0 {
		return true
	}
	h := tb.lines.Load()
	if h == nil || h == sealedLines {
		return false
	}
	for i := range h.mask.Load() + 1 {
		l := line(h, i)
		for j := range l.tickets {
			if l.tickets[j].Load()&ticketHeld != 0 {
				return true
			}
		}
	}
	return false
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
func (s *Slot[K, V]) LeaseFor(f *Flight[V], owner any) {
	if !f.lease.wanted || f.lease.state.Load() != leaseNone {
		return
	}
	t, ok := s.Lease(owner) // the creator's; TakeLease makes it the claimer's
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
		var anchor byte
		return f.lease.ticket.restamp(leaseHint[uint64](&anchor)), true
	}
	f.lease.state.CompareAndSwap(leaseNone, leaseLeft)
	return Ticket{}, false
}

// restamp records in t's ticket, held, the hint and P of the goroutine
// that now holds it (a lease handed over: TakeLease), so that the leases
// it nests in t are not taken for another goroutine's, nor for another
// core's if it moved while it waited. A ticket whose word changed since
// (Abandon, Watch), or an overflow lease, keeps its stamp: it only decides
// growth.
func (t Ticket) restamp(hint uint64) Ticket {
	if t.w&ticketOverflow != 0 || t.w&(ticketSlow|ticketRecordP) == ticketSlow {
		return t // an overflow lease, or a watched one
	}
	w := t.w &^ ticketSlow // a ticket that records P: its Ticket's word has ticketSlow
	nw := w&^(ticketHint|ticketP) | hint | pidBits[uint64](procPin()) | ticketFresh
	procUnpin()
	if atomic.CompareAndSwapUint64(t.p, w, nw) {
		r := heldTicket(nw, t.p)
		r.w |= t.w & ticketSlow
		return r
	}
	return t
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
