package shard

import "sync/atomic"

// LockShardOf locks the shard that holds key and returns its unlock: tests use
// it to show that readers never take that lock.
func (t *Table[K, V]) LockShardOf(key K) (unlock func()) {
	sh := t.shardOf(t.Hash(key))
	sh.mu.Lock()
	return sh.mu.Unlock
}

// Cells returns the number of slots of key's shard's current array.
func (t *Table[K, V]) Cells(key K) int {
	return int(t.shardOf(t.Hash(key)).cells.Load().capacity())
}

// RebuildsOnInsert reports whether inserting a new key into key's shard
// would rebuild the shard's array.
func (t *Table[K, V]) RebuildsOnInsert(key K) bool {
	sh := t.shardOf(t.Hash(key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return uint64(sh.used+1)*maxLoadDen > sh.cells.Load().capacity()*maxLoadNum
}

// GrowAfter is growAfter, for the tests of lease lines.
const GrowAfter = growAfter

// LeaseLines is s.LeaseLines, for the tests of lease lines.
func LeaseLines[K comparable, V any](s *Slot[K, V]) int { return s.LeaseLines() }

// OnLine reports whether t is a ticket of one of s's grown lines, not of
// its table's first line or an overflow lease.
func OnLine[K comparable, V any](s *Slot[K, V], t Ticket) bool {
	tb := s.leases.Load()
	h := tb.lines.Load()
	if h == nil || h == sealedLines {
		return false
	}
	for i := range h.mask.Load() + 1 {
		l := lineAt(h, i)
		for j := range l.tickets {
			if t.p == wordOf(&l.tickets[j]) {
				return true
			}
		}
	}
	return false
}

// GrowLeaseLines makes s's lines now, as leases that keep finding its
// first ticket held would.
func GrowLeaseLines[K comparable, V any](s *Slot[K, V]) {
	s.leaseTable(nil).grow()
}

// JustTaken reports whether t is what a lease that has just taken its
// ticket must hold: the end word is the taken word without held (as
// heldTicket makes it, which the table's Acquire writes out), and the
// ticket holds the taken word.
func JustTaken(t Ticket) bool {
	return t == heldTicket(t.w, t.p) && atomic.LoadUint64(t.p) == t.w&^ticketSlow
}

// Hint returns the hint of the goroutine that took t's ticket (its
// leaseHint), and the P its word holds (see Fresh).
func Hint(t Ticket) (hint, p uint64) { return t.w & ticketHint, t.w & ticketP >> 40 }

// Fresh reports whether the take of t recorded its P.
func Fresh(t Ticket) bool { return t.w&ticketFresh != 0 }

// GoroutineHints reports whether hints tell goroutines apart by identity
// (leaseHint), not by where their stacks are.
const GoroutineHints = goroutineHints

// PID returns the id of the P running the caller.
func PID() int {
	pid := procPin()
	procUnpin()
	return pid
}

// LeaseWithHint is Slot.Lease by a goroutine whose leaseHint is hint (one
// with the 0x100<<48 bit set, as every hint has): what two goroutines
// whose hints hash alike lease as.
func LeaseWithHint[K comparable, V any](s *Slot[K, V], hint uint64) (Ticket, bool) {
	pid := procPin()
	procUnpin()
	return s.leaseAs(nil, hint, pid)
}
