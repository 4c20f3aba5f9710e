// Package directory is an address book for the peers of a job: each peer
// publishes its address, and the others look it up before they connect.
//
// It models the put/commit/fence/get cycle of PMIx, through which MPI
// processes exchange their endpoint addresses at startup. A peer's address
// is not visible to the others the moment it is put: it becomes visible after
// the job's fence, which some peers reach later than others. A [Directory]
// reproduces that with [Options.Delay]: an address published with
// [Directory.Publish] is visible to [Directory.Lookup] only once the delay
// has passed. Until then, Lookup answers with a [*NotPublishedError]
// (errors.Is(err, [ErrNotPublished])), the cue to retry later, as a
// non-blocking PMIx_Get answers "not found" before the fence. A caller
// that would rather wait, as a blocking PMIx_Get does, calls
// [Directory.Resolve] (the [Resolver] interface): it returns as soon as the
// address is visible, or when its context ends; transports do that from a
// connection attempt, whose context bounds how long a sender waits for a
// late peer, and otherwise retry Lookup through their own retry policy.
//
// A peer that dies is withdrawn with [Directory.Unpublish]; a peer that
// restarts publishes again (a new address for the same peer), subject to the
// delay again, and the address it replaces stays visible until the new one
// is.
//
// The directory is transport-neutral: an address is an opaque string (a
// "host:port" for TCP, the bytes of a UCX worker address for UCX: string(b)
// holds any bytes). Peers are numbered 0 to Size-1, like the ranks of a PMIx
// namespace, whose size is known from the start; a number outside that range
// is an unknown peer, which no amount of waiting will make known.
//
// All methods are safe for concurrent use. Lookup takes no lock and
// allocates nothing when it finds an address; Publish and Unpublish take a
// lock only while a Resolve waits.
package directory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNotPublished matches, with errors.Is, the error Lookup returns for a
// peer whose address is not visible yet (or no longer). It is the error a
// retry policy should retry; see [NotPublishedError] for the details.
var ErrNotPublished = errors.New("directory: address not published")

// ErrUnknownPeer matches, with errors.Is, the error Lookup, Publish and
// Unpublish return for a peer number outside 0 to Size-1. It is permanent:
// retrying will not help.
var ErrUnknownPeer = errors.New("directory: unknown peer")

// NotPublishedError is the error Lookup returns for a known peer whose
// address is not visible: never published, published but still inside the
// publication delay, or withdrawn by Unpublish. It matches [ErrNotPublished]
// with errors.Is.
type NotPublishedError struct {
	Peer int // the peer looked up

	// Withdrawn reports that the peer's last visible address was withdrawn
	// by Unpublish (the peer is believed dead) and no new one is visible
	// yet.
	Withdrawn bool

	// Pending reports that an address has been published and will become
	// visible once the publication delay has passed.
	Pending bool
}

// Error describes why the peer has no visible address.
func (e *NotPublishedError) Error() string {
	switch {
	case e.Pending:
		return fmt.Sprintf("directory: peer %d has published an address that is not visible yet", e.Peer)
	case e.Withdrawn:
		return fmt.Sprintf("directory: peer %d's address was withdrawn and none is published yet", e.Peer)
	default:
		return fmt.Sprintf("directory: peer %d has not published an address yet", e.Peer)
	}
}

// Is reports whether target is ErrNotPublished.
func (e *NotPublishedError) Is(target error) bool { return target == ErrNotPublished }

// Options configures a [Directory].
type Options struct {
	// Size is the number of peers, numbered 0 to Size-1. Required.
	Size int

	// Delay is how long an address published with Publish stays invisible
	// to Lookup: the time until the fence, in PMIx terms. 0 makes a
	// publication visible at once.
	Delay time.Duration
}

// MaxSize is the largest Options.Size: peer numbers fit in an int32 (and an
// int on 32-bit platforms), so that transports can carry them in 4 bytes.
const MaxSize = 1<<31 - 1

// Directory maps each peer of a job to its published address. Make one with
// [New]; its methods are safe for concurrent use.
type Directory struct {
	delay   time.Duration
	entries []atomic.Pointer[entry] // one per peer; nil: never published

	// Resolve's waits. waiting counts the Resolve calls that may wait, so
	// that Publish and Unpublish take mu only while there are some; wake
	// holds, for each peer waited for, a channel that the peer's next
	// publication or withdrawal closes (and removes). A Resolve registers
	// its channel before it looks the peer up, and a Publish stores its
	// entry before it reads waiting: either the lookup sees the entry, or
	// the Publish sees the waiter and wakes it.
	waiting atomic.Int64
	mu      sync.Mutex
	wake    map[int]chan struct{}
}

// entry is one publication, immutable once stored. Lookup sees it from
// visible on; until then, it sees prev, the entry that was visible when this
// one was published.
type entry struct {
	addr       string // "" for a withdrawal
	visible    time.Time
	prev       *entry // visible until this entry is; never itself has a prev
	withdrawn  bool   // Unpublish: visible at once
	afterDeath bool   // published while a withdrawal was visible: a restart
}

// New returns a directory of opts.Size peers, none of them published, or an
// error naming the first invalid option.
func New(opts Options) (*Directory, error) {
	switch {
	case opts.Size <= 0 || opts.Size > MaxSize:
		return nil, fmt.Errorf("directory: Options.Size is %d; want 1 to %d", opts.Size, MaxSize)
	case opts.Delay < 0:
		return nil, fmt.Errorf("directory: Options.Delay is %v; want 0 (visible at once) or a positive duration", opts.Delay)
	}
	return &Directory{delay: opts.Delay, entries: make([]atomic.Pointer[entry], opts.Size)}, nil
}

// Size returns the number of peers: valid peer numbers are 0 to Size-1.
func (d *Directory) Size() int { return len(d.entries) }

// Delay returns the publication delay of [Options.Delay].
func (d *Directory) Delay() time.Duration { return d.delay }

// Publish publishes addr as peer's address. Lookup returns it once the
// directory's Delay has passed; until then it returns the address the peer
// had visible before, if any, and otherwise a [*NotPublishedError]. A second
// Publish replaces the first; a Publish after Unpublish is a restarted
// peer's republication. Publish copies nothing (strings are immutable) and
// never blocks.
//
// It returns an error wrapping [ErrUnknownPeer] for a peer outside 0 to
// Size-1, and an error for an empty address.
func (d *Directory) Publish(peer int, addr string) error {
	if err := d.check(peer); err != nil {
		return err
	}
	if addr == "" {
		return fmt.Errorf("directory: Publish of an empty address for peer %d", peer)
	}
	d.store(peer, entry{addr: addr})
	return nil
}

// Unpublish withdraws peer's address at once, as a resource manager does
// for a peer it knows to be dead; a publication still inside its delay is
// withdrawn too. From then on Lookup returns a [*NotPublishedError] with
// Withdrawn set, until the peer publishes again. It reports whether the
// peer had an address published (visible or pending), and false for an
// unknown peer.
func (d *Directory) Unpublish(peer int) bool {
	if d.check(peer) != nil {
		return false
	}
	for {
		old := d.entries[peer].Load()
		if old == nil || old.withdrawn {
			return false
		}
		if d.entries[peer].CompareAndSwap(old, &entry{withdrawn: true}) {
			d.changed(peer)
			return true
		}
	}
}

// store publishes e for peer, visible after the delay. It keeps the address
// visible now as e's predecessor, so that a republication does not hide the
// old address during the delay, and notes a withdrawal visible now, so that
// Lookup can tell a restarting peer from a starting one.
func (d *Directory) store(peer int, e entry) {
	now := time.Now()
	e.visible = now.Add(d.delay)
	for {
		old := d.entries[peer].Load()
		e.prev, e.afterDeath = nil, false
		switch v := visibleAt(old, now); {
		case v == nil:
		case v.withdrawn:
			e.afterDeath = true
		default:
			e.prev = &entry{addr: v.addr} // visible from the zero time: the chain stays one long
		}
		if d.entries[peer].CompareAndSwap(old, &e) {
			d.changed(peer)
			return
		}
	}
}

// visibleAt returns the entry of the chain at e that is visible at now, or
// nil if none is.
func visibleAt(e *entry, now time.Time) *entry {
	for ; e != nil; e = e.prev {
		if !now.Before(e.visible) {
			return e
		}
	}
	return nil
}

// Lookup returns peer's visible address. It never blocks and, when it finds
// an address, takes no lock and allocates nothing. A known peer without a
// visible address gives a [*NotPublishedError] (errors.Is(err,
// ErrNotPublished)), to be retried later; a peer outside 0 to Size-1 gives
// an error wrapping [ErrUnknownPeer].
func (d *Directory) Lookup(peer int) (string, error) {
	if err := d.check(peer); err != nil {
		return "", err
	}
	head := d.entries[peer].Load()
	if e := visibleAt(head, time.Now()); e != nil && !e.withdrawn {
		return e.addr, nil
	}
	return "", &NotPublishedError{
		Peer:      peer,
		Withdrawn: head != nil && (head.withdrawn || head.afterDeath),
		Pending:   head != nil && !head.withdrawn,
	}
}

// Resolve returns peer's address as soon as it is visible: at once if it
// is, otherwise once a Publish makes it so (after the directory's Delay, if
// any), however long that takes, unless ctx ends first. It waits without
// polling: on the Publish or Unpublish of peer, and on a timer for a
// publication still inside its delay. A peer that never publishes (or
// stays withdrawn) keeps it waiting until ctx ends; it then returns an
// error that wraps both the [*NotPublishedError] Lookup gives (which names
// the peer) and ctx.Err(). A peer outside 0 to Size-1 gives an error
// wrapping [ErrUnknownPeer] at once.
//
// The directory holds every address, so Resolve never asks anyone else: it
// is Lookup that waits. A Publish that makes the address visible
// synchronizes before the Resolve that returns it.
func (d *Directory) Resolve(ctx context.Context, peer int) (string, error) {
	addr, err := d.Lookup(peer)
	if err == nil || errors.Is(err, ErrUnknownPeer) {
		return addr, err
	}
	d.waiting.Add(1)
	defer d.waiting.Add(-1)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		wake := d.waitFor(peer)
		if addr, err = d.Lookup(peer); err == nil {
			return addr, nil
		}
		var visible <-chan time.Time
		if at, ok := d.pending(peer); ok {
			if timer == nil {
				timer = time.NewTimer(time.Until(at))
			} else {
				timer.Reset(time.Until(at))
			}
			visible = timer.C
		}
		select {
		case <-wake:
		case <-visible:
		case <-ctx.Done():
			return "", fmt.Errorf("%w: %w", err, ctx.Err())
		}
	}
}

// Unreachable does nothing: the directory holds every address as
// published, and keeps none that it fetched from elsewhere, so there is
// nothing stale to drop. It is there for the [Resolver] interface.
func (d *Directory) Unreachable(peer int, addr string) {}

// waitFor returns a channel that the next Publish or Unpublish of peer
// closes. The caller counts in d.waiting.
func (d *Directory) waitFor(peer int) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch, ok := d.wake[peer]
	if !ok {
		if d.wake == nil {
			d.wake = map[int]chan struct{}{}
		}
		ch = make(chan struct{})
		d.wake[peer] = ch
	}
	return ch
}

// changed wakes the Resolve calls waiting for peer, after its entry
// changed.
func (d *Directory) changed(peer int) {
	if d.waiting.Load() == 0 {
		return // nobody waits: Publish stays lock-free
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if ch, ok := d.wake[peer]; ok {
		close(ch)
		delete(d.wake, peer)
	}
}

// pending returns when peer's latest publication becomes visible, if it is
// not visible yet.
func (d *Directory) pending(peer int) (time.Time, bool) {
	e := d.entries[peer].Load()
	if e == nil || e.withdrawn || !time.Now().Before(e.visible) {
		return time.Time{}, false
	}
	return e.visible, true
}

func (d *Directory) check(peer int) error {
	if peer < 0 || peer >= len(d.entries) {
		return fmt.Errorf("%w %d (peers are 0 to %d)", ErrUnknownPeer, peer, len(d.entries)-1)
	}
	return nil
}
