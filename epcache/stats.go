package epcache

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Stats is a snapshot of a cache's figures. The fields from Creates to
// RoomWaits, and the histograms, are counters: they only grow, from 0 at
// New. Room, Live, Ready and Lingering are gauges: what the cache holds at
// the moment, up and down. Figures are summed from stripes without a global pause, so a
// snapshot taken while the cache is busy is not atomic across fields; one
// taken after Close returned is exact.
//
// A creation answered by CreateTimeout whose Create later returns a value
// counts in both Creates and CreateErrors: its callers got an error, and its
// value was created, then released.
type Stats struct {
	Creates       uint64 // creations that produced a value (Create returned a nil error)
	CreateErrors  uint64 // creations whose callers got an error: after retries, panics, Goexit, timeouts, Close
	Attempts      uint64 // calls of Create, retries included
	Waits         uint64 // Gets that waited on a creation another Get started
	Cancels       uint64 // waiting Gets that left because their own context ended
	ErrorHits     uint64 // Gets answered with a remembered failure (ErrorTTL) or a timed-out creation still running
	Releases      uint64 // values given up: Release called, or dropped when Release is nil
	ReleasePanics uint64 // Release calls that panicked
	Offers        uint64 // values stored by Offer
	Evictions     uint64 // values removed to make room under MaxEntries
	IdleRemovals  uint64 // values removed by IdleTimeout
	RoomWaits     uint64 // creations that found no room under MaxEntries: each waited, in line or for the Release of a value it evicted itself
	// Room is the room taken under MaxEntries now: values created or
	// offered and not yet released (their Release returned) plus creations
	// running. It never exceeds MaxEntries; 0 when MaxEntries is not set.
	Room  int64
	Live  int64 // values created or offered and not yet released: Creates + Offers - Releases
	Ready int64 // values held by the cache now: what Len returns
	// Lingering counts values the cache has given up (Invalidate,
	// CompareAndInvalidate, Close) whose leases have not all been released:
	// the last Lease.Release releases each. After Close returned, a
	// Lingering value is a lease never released.
	Lingering int64

	// CreateLatency is how long creations took, from the start of their
	// first attempt to the return of their last (retry waits included), by
	// how they ended: CreateLatency[OutcomeValue] counts the creations that
	// made a value, and so on. A creation that a CreateTimeout or an Offer
	// answered is counted when its Create returns, under OutcomeTimeout or
	// OutcomeOffered. Counters.
	CreateLatency Latencies
	// RoomWait is how long the creations counted in RoomWaits waited for
	// room under MaxEntries, to the unit taken or the end of their wait.
	// Counters.
	RoomWait Histogram
}

// stripe is one cache-line-sized set of counters, with the gate of the
// creations and invalidations of the keys whose slots it counts. They are
// written only on slow paths (creations, waits, invalidations), never by a
// hit, and the writes are spread by slot address so that creations of
// different keys do not share a cache line: a creation writes one line of
// the cache's own, not a line every creation writes. 128 bytes for the
// adjacent-line prefetcher, as in shard.
type stripe struct {
	creates, createErrors, attempts, waits, cancels, errorHits, releases, releasePanics, offers atomic.Uint64
	evictions, idleRemovals, roomWaits                                                          atomic.Uint64
	ready, lingering                                                                            atomic.Int64
	gate                                                                                        gate
	// 112 bytes of counters and the gate fill 128 bytes: no padding (a
	// zero-length array at the end would add some). TestStripeIsPaddedTo128Bytes.
}

type stripes []stripe

func newStripes() stripes {
	n := 1
	for n < runtime.GOMAXPROCS(0)*2 && n < 256 {
		n <<= 1
	}
	s := make(stripes, n)
	for i := range s {
		s[i].gate = newGate()
	}
	return s
}

// of returns the stripe for a slot. Slots are spread by their address: each
// key's slot is its own allocation, so distinct keys land on distinct
// stripes without hashing the key again.
func (s stripes) of(p unsafe.Pointer) *stripe { return &s[s.index(p)] }

func (s stripes) index(p unsafe.Pointer) int {
	a := uint64(uintptr(p))
	return int((a>>5 ^ a>>13) & uint64(len(s)-1))
}

func (s stripes) sum() Stats {
	var st Stats
	for i := range s {
		p := &s[i]
		st.Creates += p.creates.Load()
		st.CreateErrors += p.createErrors.Load()
		st.Attempts += p.attempts.Load()
		st.Waits += p.waits.Load()
		st.Cancels += p.cancels.Load()
		st.ErrorHits += p.errorHits.Load()
		st.Releases += p.releases.Load()
		st.ReleasePanics += p.releasePanics.Load()
		st.Offers += p.offers.Load()
		st.Evictions += p.evictions.Load()
		st.IdleRemovals += p.idleRemovals.Load()
		st.RoomWaits += p.roomWaits.Load()
		st.Ready += p.ready.Load()
		st.Lingering += p.lingering.Load()
	}
	st.Live = int64(st.Creates) + int64(st.Offers) - int64(st.Releases)
	return st
}
