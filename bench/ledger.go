package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// Endpoint is what every comparator caches: one per creation, so that the
// ledger can tell a duplicate from a hit and a leak from a release.
type Endpoint struct {
	Peer     int    // the peer's number, 0 ≤ Peer < peers
	Serial   uint64 // the ledger's creation number, from 1
	res      io.Closer
	released atomic.Int32
	using    atomic.Int32 // uses in progress (the hotset workload): a release meanwhile is a release under a use
}

// ErrNotPublished is the flaky workload's creation error: the peer's address
// is not published yet (the PMIx case). It is worth retrying.
var ErrNotPublished = errors.New("bench: peer address not yet published")

// Ledger creates and releases endpoints for the comparators and counts
// everything: creations, attempts, releases, double releases, and the most
// creations of one peer in flight at once. It is safe for concurrent use.
type Ledger struct {
	cost     Cost
	failures int32 // flaky: failed attempts per peer before the first success

	inflight    []atomic.Int32 // per peer: creations in progress
	attempts    []atomic.Int32 // per peer: attempts made, for failures
	made        []atomic.Int32 // per peer: endpoints created
	invalidated []atomic.Int32 // per peer: endpoints dropped by Report or Invalidate

	serial         atomic.Uint64
	creates        atomic.Uint64
	tries          atomic.Uint64
	releases       atomic.Uint64
	doubleReleases atomic.Uint64
	closeErrors    atomic.Uint64
	releasedInUse  atomic.Uint64 // releases of an endpoint while a lease was using it
	overlap        atomic.Int32
	running        atomic.Int32  // creations in flight now, all peers
	concurrency    atomic.Int32  // the most creations in flight at once, all peers
	live           atomic.Int64  // endpoints being created, or created and not yet released
	peakLive       atomic.Int64  // the most live at once
	createNanos    atomic.Int64  // the time of the attempts made while not free
	paidTries      atomic.Uint64 // those attempts
	free           atomic.Bool   // creations cost nothing (while a workload fills the cache)
}

// NewLedger returns a ledger for peers peers whose creations cost what cost
// says and fail failures times per peer before they succeed.
func NewLedger(peers int, cost Cost, failures int) *Ledger {
	return &Ledger{
		cost:        cost,
		failures:    int32(failures),
		inflight:    make([]atomic.Int32, peers),
		attempts:    make([]atomic.Int32, peers),
		made:        make([]atomic.Int32, peers),
		invalidated: make([]atomic.Int32, peers),
	}
}

// Create makes an endpoint for peer: it pays the cost model (cut short by
// ctx), fails with ErrNotPublished for the peer's first failures attempts,
// and otherwise returns a new endpoint.
func (l *Ledger) Create(ctx context.Context, peer int) (*Endpoint, error) {
	free := l.free.Load()
	return l.make(ctx, peer, free, func(ctx context.Context) (io.Closer, error) {
		if !free {
			if err := l.cost.Pay(ctx); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
}

// Make is Create for endpoints that are real resources: open makes one (a
// connection, a UCX endpoint), whose cost is the cost, and Release closes
// it. The cost model does not apply; failures do (the resource is then
// closed at once).
func (l *Ledger) Make(ctx context.Context, peer int, open func(context.Context) (io.Closer, error)) (*Endpoint, error) {
	return l.make(ctx, peer, false, open)
}

// make makes one attempt; a free one (SetFree) is left out of MeanCreate.
func (l *Ledger) make(ctx context.Context, peer int, free bool, open func(context.Context) (io.Closer, error)) (*Endpoint, error) {
	// An endpoint is live from the moment its creation starts (it may
	// hold a socket, a handshake, memory) until its release returns, or
	// until the creation fails.
	raiseTo64(&l.peakLive, l.live.Add(1))
	n := l.inflight[peer].Add(1)
	defer l.inflight[peer].Add(-1)
	raiseTo(&l.overlap, n)
	raiseTo(&l.concurrency, l.running.Add(1))
	defer l.running.Add(-1)
	l.tries.Add(1)
	start := time.Now()
	res, err := open(ctx)
	if !free {
		l.createNanos.Add(int64(time.Since(start)))
		l.paidTries.Add(1)
	}
	if err != nil {
		l.live.Add(-1)
		return nil, err
	}
	// A failing attempt pays its cost first, as a lookup that finds nothing does.
	if l.attempts[peer].Add(1) <= l.failures {
		if res != nil {
			res.Close()
		}
		l.live.Add(-1)
		return nil, fmt.Errorf("peer %d: %w", peer, ErrNotPublished)
	}
	l.made[peer].Add(1)
	l.creates.Add(1)
	return &Endpoint{Peer: peer, Serial: l.serial.Add(1), res: res}, nil
}

// raiseTo raises m to n if n is larger.
func raiseTo(m *atomic.Int32, n int32) {
	for {
		o := m.Load()
		if n <= o || m.CompareAndSwap(o, n) {
			return
		}
	}
}

// raiseTo64 is raiseTo for an Int64. The maximum is exact: every value the
// counter takes is offered by the goroutine that made it, and the CAS loop
// loses none of them.
func raiseTo64(m *atomic.Int64, n int64) {
	for {
		o := m.Load()
		if n <= o || m.CompareAndSwap(o, n) {
			return
		}
	}
}

// Release records that ep was given up. A second release of one endpoint is
// counted as a double release, and a release while a lease uses it as a
// release in use.
func (l *Ledger) Release(ep *Endpoint) {
	if ep.using.Load() != 0 {
		l.releasedInUse.Add(1)
	}
	if ep.released.Add(1) > 1 {
		l.doubleReleases.Add(1)
		return
	}
	if ep.res != nil {
		if err := ep.res.Close(); err != nil {
			l.closeErrors.Add(1)
		}
	}
	l.releases.Add(1)
	l.live.Add(-1)
}

// SetFree makes creations cost nothing while free is true: a workload fills
// its cache that way, then measures with the real cost.
func (l *Ledger) SetFree(free bool) { l.free.Store(free) }

// Invalidated records that the endpoint of peer was dropped on purpose (a
// Report or Invalidate that returned true), which entitles the peer to one
// more creation that is not a duplicate.
func (l *Ledger) Invalidated(peer int) { l.invalidated[peer].Add(1) }

// Counts is a snapshot of a ledger.
type Counts struct {
	Creates        uint64        // endpoints created
	Attempts       uint64        // creation attempts, failed ones included
	Distinct       uint64        // peers that got at least one endpoint
	Duplicates     uint64        // endpoints beyond one per peer and one per invalidation of it
	Releases       uint64        // endpoints released (once)
	DoubleReleases uint64        // releases of an already released endpoint
	CloseErrors    uint64        // releases whose resource failed to close
	ReleasedInUse  uint64        // releases of an endpoint a lease was using
	Overlap        int           // most creations of one peer in flight at once
	Concurrency    int           // most creations in flight at once, all peers together
	MeanCreate     time.Duration // measured mean cost of an attempt made while not free; 0 if none was
	// PeakLive is the most endpoints live at once, all peers together: an
	// endpoint is live from the start of its creation until its release
	// returns, or until the creation fails.
	PeakLive int64
}

// Counts returns the ledger's counters.
func (l *Ledger) Counts() Counts {
	c := Counts{
		Creates:        l.creates.Load(),
		Attempts:       l.tries.Load(),
		Releases:       l.releases.Load(),
		DoubleReleases: l.doubleReleases.Load(),
		CloseErrors:    l.closeErrors.Load(),
		ReleasedInUse:  l.releasedInUse.Load(),
		Overlap:        int(l.overlap.Load()),
		Concurrency:    int(l.concurrency.Load()),
		PeakLive:       l.peakLive.Load(),
	}
	for i := range l.made {
		made := l.made[i].Load()
		if made > 0 {
			c.Distinct++
		}
		if extra := made - 1 - l.invalidated[i].Load(); extra > 0 {
			c.Duplicates += uint64(extra)
		}
	}
	if n := l.paidTries.Load(); n > 0 {
		c.MeanCreate = time.Duration(l.createNanos.Load() / int64(n))
	}
	return c
}
