//go:build ucx

package ucx

/*
#include "epucx.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// The progress goroutine's timing; see the Worker doc.
const (
	// idleTick bounds a wait on the worker's event descriptor once
	// progress has found nothing to do for activeWindow: an idle worker
	// wakes four times a second, for UCX's own timers (keepalive, wire-up
	// retries) and for an event its async thread missed (see kick).
	idleTick = 250 * time.Millisecond
	// activeTick bounds the wait while progress has done something within
	// activeWindow: an event that UCX's async thread missed waits at most
	// that long.
	activeTick   = 5 * time.Millisecond
	activeWindow = 200 * time.Millisecond
	// After spuriousLimit wake-ups in a row that found nothing to
	// progress, the descriptor is taken to be stuck readable and the
	// goroutine sleeps spinTick (or until a kick) instead of waiting on it.
	spuriousLimit = 2
	spinTick      = time.Millisecond
)

// WorkerOptions configures a [Worker].
type WorkerOptions struct {
	// OnFailure, if set, is called once for each endpoint of the worker
	// that UCX reports as failed (its error callback ran: the peer worker
	// is gone), with an error wrapping ErrEndpointFailed and the UCX
	// Status. It runs on a goroutine of its own, started only for
	// endpoints Connect has returned, and may call any method of the
	// endpoint and the worker but Worker.Close, which waits for it.
	OnFailure func(ep *Endpoint, err error)
}

// Worker is a UCP worker (ucp_worker_h) created in UCS_THREAD_MODE_MULTI:
// its methods, and those of its endpoints, are safe for concurrent use.
// Make one with [Context.NewWorker].
//
// # Progress
//
// Each worker has one progress goroutine, which alone calls
// ucp_worker_progress. It progresses until there is nothing left to do,
// arms the worker (ucp_worker_arm) and sleeps in epoll_wait on the worker's
// event descriptor (ucp_worker_get_efd) until a transport event, a
// ucp_worker_signal, or a tick. A goroutine whose operation UCX does not
// complete at once signals the worker (see kick) and parks on a channel
// that the operation's completion callback closes. Nobody spins: not the
// waiters, and not the progress goroutine, whose wait is bounded by
// activeTick (5 ms) while it has had work within activeWindow (200 ms) and
// by idleTick (250 ms) after that: an idle worker wakes four times a
// second.
//
// Two behaviours of UCX 1.13 shape the loop. Its async thread, finding the
// worker's lock taken, queues a transport event as missed, which only a
// later ucp_worker_progress dispatches and nothing signals; hence the
// kicks, the progress call right after arming, and the short tick while
// active. And while TCP connections are being set up, the event descriptor
// stays readable with nothing to progress; after two such wake-ups in a
// row the goroutine sleeps spinTick (1 ms), or until a kick, before it
// waits on the descriptor again, instead of spinning on it (it was waking
// some 300,000 times a second). On two cores, the two together cut a
// storm of 240 endpoint creations between 16 workers (ucxstorm) from about
// 250 ms to about 50 ms.
type Worker struct {
	ctx       *Context
	h         C.ucp_worker_h
	efd       int
	addr      string // framed, see address.go
	onFailure func(*Endpoint, error)
	stats     counters
	wakeups   atomic.Uint64 // epoll_wait returns, for the idle cost

	stop     atomic.Bool
	loopDone chan struct{} // closed when the progress goroutine returns
	wake     chan struct{} // kick's: ends a sleep of the progress goroutine

	mu          sync.RWMutex
	closed      bool
	closing     chan struct{}  // closed when Close begins: waits give up
	closeDone   chan struct{}  // closed when the first Close returns
	users       sync.WaitGroup // operations in flight
	hooks       sync.WaitGroup // OnFailure goroutines
	hooksClosed bool           // under mu: no OnFailure goroutine may start

	epsMu sync.Mutex
	eps   map[*Endpoint]struct{} // open endpoints
}

// NewWorker creates a worker, publishes nothing, and starts its progress
// goroutine. Its address (see [Worker.Address]) is registered with the
// process's registry until the context is closed.
func (c *Context) NewWorker(opts WorkerOptions) (*Worker, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	w := &Worker{
		ctx:       c,
		onFailure: opts.OnFailure,
		loopDone:  make(chan struct{}),
		wake:      make(chan struct{}, 1),
		closing:   make(chan struct{}),
		closeDone: make(chan struct{}),
		eps:       map[*Endpoint]struct{}{},
	}
	if st := C.epc_worker_create(c.h, &w.h); st != C.UCS_OK {
		return nil, fmt.Errorf("ucx: ucp_worker_create: %w", statusError(st))
	}
	var efd C.int
	if st := C.ucp_worker_get_efd(w.h, &efd); st != C.UCS_OK {
		C.ucp_worker_destroy(w.h)
		return nil, fmt.Errorf("ucx: ucp_worker_get_efd: %w", statusError(st))
	}
	w.efd = int(efd)
	var (
		a    *C.ucp_address_t
		alen C.size_t
	)
	if st := C.ucp_worker_get_address(w.h, &a, &alen); st != C.UCS_OK {
		C.ucp_worker_destroy(w.h)
		return nil, fmt.Errorf("ucx: ucp_worker_get_address: %w", statusError(st))
	}
	w.addr = frame(C.GoBytes(unsafe.Pointer(a), C.int(alen)))
	C.ucp_worker_release_address(w.h, a)
	registry.Store(w.addr, c)
	c.addrs = append(c.addrs, w.addr)
	c.workers[w] = struct{}{}
	go w.progress()
	return w, nil
}

// Address returns the worker's address, to be published (as a string) in
// a directory and passed to Connect: a UCX worker address behind a header
// of this package. The slice is a copy.
func (w *Worker) Address() []byte { return []byte(w.addr) }

// Stats returns the counters of the worker's endpoints.
func (w *Worker) Stats() EndpointStats { return w.stats.snapshot() }

// Wakeups returns how many times the progress goroutine has woken from
// epoll_wait: a measure of what an idle worker costs.
func (w *Worker) Wakeups() uint64 { return w.wakeups.Load() }

// progress is the worker's progress goroutine; see the Worker doc.
func (w *Worker) progress() {
	defer close(w.loopDone)
	var events [4]syscall.EpollEvent
	var (
		lastWork time.Time // when progress last did something
		stuck    int       // wake-ups in a row by the descriptor after which progress found nothing
	)
	for {
		worked := false
		for C.ucp_worker_progress(w.h) != 0 {
			worked = true
		}
		if w.stop.Load() {
			return
		}
		switch st := C.ucp_worker_arm(w.h); st {
		case C.UCS_OK:
		case C.UCS_ERR_BUSY:
			continue // events arrived meanwhile: progress them first
		default:
			// The worker cannot be armed: sleep a tick, progress again.
			time.Sleep(activeTick)
			continue
		}
		// Arming held the worker's async lock: an event UCX's async
		// thread could not handle meanwhile is queued as missed, signals
		// nothing, and only a progress call dispatches it.
		if C.ucp_worker_progress(w.h) != 0 {
			worked = true
		}
		now := time.Now()
		if worked {
			lastWork, stuck = now, 0
			continue
		}
		w.wakeups.Add(1)
		if stuck >= spuriousLimit {
			// The descriptor keeps reporting events that progress does
			// not consume (UCX 1.13's TCP transport does that while
			// connections are being set up): waiting on it alone would
			// spin. Sleep first, until a kick or spinTick.
			t := time.NewTimer(spinTick)
			select {
			case <-w.wake:
			case <-t.C:
			}
			t.Stop()
		}
		timeout := idleTick
		if now.Sub(lastWork) < activeWindow {
			timeout = activeTick
		}
		// The descriptor belongs to UCX; epoll_wait only blocks on it (a
		// syscall that parks this goroutine's thread, not a processor).
		n, _ := syscall.EpollWait(w.efd, events[:], int(timeout/time.Millisecond))
		select {
		case <-w.wake:
			stuck = 0 // a kick: the descriptor had a reason to be readable
			continue
		default:
		}
		if n > 0 {
			stuck++ // reset by the next progress if it finds work
		} else {
			stuck = 0 // a quiet descriptor: it is not stuck
		}
	}
}

// kick wakes the progress goroutine: it signals the worker
// (ucp_worker_signal, which writes to the worker's eventfd) and ends a
// spinTick sleep. A goroutine calls it after a UCX call that left work for
// progress: ucp_ep_create (the wire-up) and every operation UCX did not
// complete at once. The progress it triggers also dispatches the events
// UCX's async thread missed while the call held the worker's lock (the
// async thread, finding the lock taken, queues an event as missed, and
// nothing signals it); a miss during a call that needs no kick (a send
// completed at once, a request freed) waits for the next tick, activeTick
// since the worker is active.
func (w *Worker) kick() {
	C.ucp_worker_signal(w.h)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// enter registers an operation; it returns false once Close has begun.
func (w *Worker) enter() bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return false
	}
	w.users.Add(1)
	return true
}

func (w *Worker) exit() { w.users.Done() }

// waitMode says what a wait does when its context ends or the worker
// closes before the operation completes.
type waitMode int

const (
	// cancelOp cancels the request (ucp_request_cancel: receives) and
	// waits for its completion, which comes at once.
	cancelOp waitMode = iota
	// abandonOp returns at once and leaves the request to a goroutine
	// that waits for its completion and frees it (sends, flushes: UCX
	// cannot cancel them, and closing their endpoint completes them).
	abandonOp
	// awaitOp waits for completion regardless (closes).
	awaitOp
)

// await waits for the operation that ptr (returned by a UCX call with o's
// handle h) stands for. It returns the operation's status, or ctx's error
// (or ErrClosed) if the wait was cut short. done runs once UCX is done with
// the operation, whichever goroutine sees it.
func (w *Worker) await(ctx context.Context, ptr C.ucs_status_ptr_t, o *op, h cgo.Handle, mode waitMode, done func()) (C.ucs_status_t, error) {
	if C.epc_is_ptr(ptr) == 0 {
		// Completed (or failed) at once: UCX will not call back.
		h.Delete()
		if done != nil {
			done()
		}
		return C.epc_status(ptr), nil
	}
	finish := func() C.ucs_status_t {
		C.ucp_request_free(unsafe.Pointer(ptr))
		h.Delete()
		if done != nil {
			done()
		}
		return o.status
	}
	w.kick()
	var cut error
	if mode == awaitOp {
		<-o.done
		return finish(), nil
	}
	select {
	case <-o.done:
		return finish(), nil
	case <-ctx.Done():
		cut = ctx.Err()
	case <-w.closing:
		cut = ErrClosed
	}
	if mode == abandonOp {
		select {
		case <-o.done:
			return finish(), nil
		default:
		}
		w.users.Add(1) // the caller still holds its own: Close has not passed Wait
		go func() {
			defer w.users.Done()
			<-o.done
			finish()
		}()
		return 0, cut
	}
	C.ucp_request_cancel(w.h, unsafe.Pointer(ptr))
	w.kick()
	<-o.done
	return finish(), cut
}

// Recv receives one tagged message (of any tag) into buf. It returns the
// message's length and the sender's tag; a message longer than buf is
// dropped and gives an error wrapping the UCX status
// (UCS_ERR_MESSAGE_TRUNCATED). It blocks until a message arrives, ctx ends
// (ctx.Err()) or Close begins (ErrClosed); a message that arrives while
// the receive is being cancelled is returned, with a nil error.
func (w *Worker) Recv(ctx context.Context, buf []byte) (n int, tag uint64, err error) {
	if !w.enter() {
		return 0, 0, ErrClosed
	}
	defer w.exit()
	cbuf := C.malloc(C.size_t(max(len(buf), 1)))
	defer C.free(cbuf)
	o, h := newOp()
	ptr := C.epc_tag_recv(w.h, cbuf, C.size_t(len(buf)), C.uintptr_t(h))
	st, cut := w.await(ctx, ptr, o, h, cancelOp, nil)
	if st != C.UCS_OK {
		if cut != nil {
			return 0, 0, cut
		}
		return 0, 0, fmt.Errorf("ucx: receive: %w", statusError(st))
	}
	n, tag = o.length, o.tag
	copy(buf, unsafe.Slice((*byte)(cbuf), n))
	return n, tag, nil
}

// Close closes the worker: it refuses new operations, cuts short the waits
// of those in flight (receives are cancelled and return ErrClosed), closes
// with ucp_ep_close_nbx (in force mode) every endpoint still open, counting
// them in EndpointStats.Orphaned, waits for the operations and the OnFailure
// goroutines to finish, stops the progress goroutine and destroys the
// worker. Its address stays registered until the context closes, so that a
// Connect to it fails in UCX (the peer is gone), not in the registry. A
// second Close waits for the first and returns nil.
func (w *Worker) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.closeDone
		return nil
	}
	w.closed = true
	close(w.closing)
	w.mu.Unlock()
	defer close(w.closeDone)

	// Forced, so that sends and flushes in flight complete (canceled) and
	// no peer needs to answer: their owner did not close these. A second
	// sweep, once no operation is in flight, closes what a Connect under
	// way created meanwhile (Connect closes its own endpoint when its wait
	// is cut short, so the second sweep should find nothing).
	errs := w.closeOrphans(nil)
	w.users.Wait()
	errs = w.closeOrphans(errs)
	w.mu.Lock()
	w.hooksClosed = true
	w.mu.Unlock()
	w.hooks.Wait()
	w.stop.Store(true)
	w.kick()
	<-w.loopDone
	C.ucp_worker_destroy(w.h)
	w.ctx.mu.Lock()
	delete(w.ctx.workers, w)
	w.ctx.mu.Unlock()
	return errors.Join(errs...)
}

// closeOrphans force-closes the worker's open endpoints, counting them as
// orphans, and appends the errors of the closes to errs.
func (w *Worker) closeOrphans(errs []error) []error {
	w.epsMu.Lock()
	orphans := make([]*Endpoint, 0, len(w.eps))
	for ep := range w.eps {
		orphans = append(orphans, ep)
	}
	w.epsMu.Unlock()
	for _, ep := range orphans {
		if err := ep.close(true, true); err != nil && !errors.Is(err, StatusCanceled) {
			errs = append(errs, err)
		}
	}
	return errs
}
