package grpcpool

import (
	"sync/atomic"

	"github.com/epcache/epcache/epcache"
)

// Stats is a snapshot of a pool's figures. Fields named as counts of events
// only grow, from 0 at New; Open, PeakOpen, Ready, Draining and
// ChecksInFlight are gauges. A snapshot taken while the pool is busy is not
// atomic across fields; one taken after Close returned is exact.
type Stats struct {
	Dials      uint64 // dial attempts: Dial called (DialRetry's retries included)
	DialErrors uint64 // dial attempts that failed: Dial's error or panic, not Ready, DialTimeout, Close
	ErrorHits  uint64 // Do and Warm answered with a remembered dial failure (ErrorTTL), without a dial
	Forgotten  uint64 // remembered failures forgotten by SetMembers
	SlotWaits  uint64 // dials that found every slot taken (MaxConns): each waited for an evicted connection to close, or in line (the cache's RoomWaits)
	Abandoned  uint64 // dials given up, before Dial or once Ready, because their address is not a member and no call to it is left (see the package doc)

	// Several connections per address (Config.MaxStreamsPerConn).
	Grown       uint64 // connections dialed beyond an address's first
	Shrunk      uint64 // such connections closed, for whatever reason (IdleTimeout once unneeded, mostly)
	StreamWaits uint64 // calls that found every stream of their address's connections taken: each waited for a growth dial, or ran over the limit at MaxConnsPerAddr

	Calls      uint64 // calls Do ran
	ConnErrors uint64 // calls whose error IsConnError accepted

	// Drops by cause: connections the pool took out of service. Each is
	// closed once its calls end (and, for DropsMembership and DropsHealth,
	// its drain delay).
	DropsConnError  uint64 // a call's connection error
	DropsMembership uint64 // the address left the members
	DropsNonMember  uint64 // the address is not a member, and no call to it is left
	DropsHealth     uint64 // health checks failing for the grace period
	DropsIdle       uint64 // unused for IdleTimeout
	DropsEvicted    uint64 // evicted for another address's room (MaxConns)

	HealthRounds   uint64 // rounds of health checks
	HealthChecks   uint64 // checks sent
	HealthFailures uint64 // checks failed on connections still in the pool
	ChecksInFlight int64  // checks running now
	PeakChecks     int64  // most checks running at once: at most MaxConcurrentHealthChecks

	Closed   uint64 // connections closed (dials that failed included)
	Open     int64  // connections dialing or open now: Dials - Closed
	PeakOpen int64  // most connections dialing or open at once: at most MaxConns when set
	Ready    int64  // connections in the pool now, ready for calls
	Draining int64  // dropped connections waiting out their drain delay

	Cache epcache.Stats // the cache underneath
}

// counters are the pool's own figures. Only calls is written on Do's fast
// path, and it is one atomic add.
type counters struct {
	calls                                                        atomic.Uint64
	dials, dialErrors, connErrors, forgotten, closed             atomic.Uint64
	abandoned, grown, shrunk, streamWaits                        atomic.Uint64
	healthRounds, healthChecks, healthFailures                   atomic.Uint64
	drops                                                        [numDropCauses]atomic.Uint64
	open, peakOpen, draining, checksInFlight, peakChecksInFlight atomic.Int64
}

// opening counts a connection about to be dialed.
func (s *counters) opening() {
	raise(&s.peakOpen, s.open.Add(1))
}

// closing counts a connection closed, or a dial failed.
func (s *counters) closing() {
	s.closed.Add(1)
	s.open.Add(-1)
}

func (s *counters) peakChecks(n int64) { raise(&s.peakChecksInFlight, n) }

// raise makes peak at least n.
func raise(peak *atomic.Int64, n int64) {
	for {
		m := peak.Load()
		if n <= m || peak.CompareAndSwap(m, n) {
			return
		}
	}
}

// Stats returns the pool's figures; see [Stats].
func (p *Pool) Stats() Stats {
	c := p.cache.Stats()
	s := &p.st
	return Stats{
		Dials:           s.dials.Load(),
		DialErrors:      s.dialErrors.Load(),
		ErrorHits:       c.ErrorHits,
		Forgotten:       s.forgotten.Load(),
		SlotWaits:       c.RoomWaits,
		Abandoned:       s.abandoned.Load(),
		Grown:           s.grown.Load(),
		Shrunk:          s.shrunk.Load(),
		StreamWaits:     s.streamWaits.Load(),
		Calls:           s.calls.Load(),
		ConnErrors:      s.connErrors.Load(),
		DropsConnError:  s.drops[dropConnError].Load(),
		DropsMembership: s.drops[dropMembership].Load(),
		DropsNonMember:  s.drops[dropNonMember].Load(),
		DropsHealth:     s.drops[dropHealth].Load(),
		DropsIdle:       c.IdleRemovals,
		DropsEvicted:    c.Evictions,
		HealthRounds:    s.healthRounds.Load(),
		HealthChecks:    s.healthChecks.Load(),
		HealthFailures:  s.healthFailures.Load(),
		ChecksInFlight:  s.checksInFlight.Load(),
		PeakChecks:      s.peakChecksInFlight.Load(),
		Closed:          s.closed.Load(),
		Open:            s.open.Load(),
		PeakOpen:        s.peakOpen.Load(),
		Ready:           int64(c.Ready),
		Draining:        s.draining.Load(),
		Cache:           c,
	}
}
