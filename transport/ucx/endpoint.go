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
	"unsafe"
)

// ErrEndpointClosed matches, with errors.Is, the error of an operation on
// an endpoint that was closed before the operation was posted.
var ErrEndpointClosed = errors.New("ucx: endpoint closed")

// Endpoint is a UCP endpoint (ucp_ep_h) from a worker to another, created
// by [Worker.Connect] with peer error handling. Its methods are safe for
// concurrent use. Close it when it is no longer needed (a second Close is
// harmless; Worker.Close closes, as orphans, those left open). It is an
// io.Closer.
type Endpoint struct {
	w      *Worker
	h      C.ucp_ep_h
	handle cgo.Handle // the error callback's user data
	label  int

	status   atomic.Int32 // the error callback's ucs_status_t; 0 while healthy
	handed   atomic.Bool  // Connect has returned it: failures go to OnFailure
	reported atomic.Bool  // OnFailure has been started

	mu     sync.RWMutex // read-held while an operation is posted on h
	closed bool         // under mu: no operation may be posted

	closeOnce sync.Once
	closeErr  error
}

// Connect creates an endpoint from w to the worker at addr (as returned by
// [Worker.Address]) and waits for its wire-up: it calls ucp_ep_create with
// UCP_ERR_HANDLING_MODE_PEER and an error callback, then flushes the
// endpoint (ucp_ep_flush_nbx), which completes once the remote worker has
// answered. So a Connect that returns an endpoint has reached a live
// worker, and a Connect to a dead one fails, which is what lets a cache
// remember the failure. label is the caller's name for the remote (a peer
// number); Label returns it.
//
// addr is checked before UCX sees it: a blob that is not an address of
// this package gives an *AddressError (errors.Is(err, ErrBadAddress)), one
// that no open context of this process issued an error wrapping
// ErrUnknownAddress. ctx bounds the wire-up: on cancellation the endpoint
// is closed and Connect returns ctx.Err(). Every endpoint ucp_ep_create
// returns is counted in EndpointStats.Created, and closed before Connect
// returns an error.
func (w *Worker) Connect(ctx context.Context, addr []byte, label int) (*Endpoint, error) {
	ucxAddr, err := checkAddress(string(addr))
	if err != nil {
		return nil, err
	}
	if !w.enter() {
		return nil, ErrClosed
	}
	defer w.exit()
	e := &Endpoint{w: w, label: label}
	e.handle = cgo.NewHandle(e)
	// Safety: UCX reads the address during the call only (it unpacks it
	// into its own structures), and the bytes hold no Go pointers.
	st := C.epc_ep_create(w.h, unsafe.Pointer(unsafe.StringData(ucxAddr)), C.uintptr_t(e.handle), &e.h)
	w.kick()
	if st != C.UCS_OK {
		e.handle.Delete()
		w.count(func(c *counters) { c.createErrors.Add(1) })
		return nil, fmt.Errorf("ucx: ucp_ep_create (label %d): %w", label, statusError(st))
	}
	w.count(func(c *counters) { c.created.Add(1) })
	w.epsMu.Lock()
	w.eps[e] = struct{}{}
	w.epsMu.Unlock()

	o, h := newOp()
	ptr, ok := e.post(func() C.ucs_status_ptr_t { return C.epc_ep_flush(e.h, C.uintptr_t(h)) })
	var cut error
	if ok {
		st, cut = w.await(ctx, ptr, o, h, abandonOp, nil)
	} else {
		h.Delete()
		cut = ErrClosed // Worker.Close closed it already
	}
	if cut != nil || st != C.UCS_OK {
		_ = e.close(true, false)
		w.count(func(c *counters) { c.createErrors.Add(1) })
		if cut != nil {
			return nil, cut
		}
		return nil, fmt.Errorf("ucx: wire-up (label %d): %w", label, e.failure(st))
	}
	e.handed.Store(true)
	if e.status.Load() != 0 {
		e.report() // it failed between the flush and now
	}
	return e, nil
}

// Label returns the label Connect was given.
func (e *Endpoint) Label() int { return e.label }

// Worker returns the worker the endpoint belongs to.
func (e *Endpoint) Worker() *Worker { return e.w }

// Err returns nil while UCX has not reported the endpoint as failed, and
// then an error wrapping ErrEndpointFailed and the Status.
func (e *Endpoint) Err() error {
	if st := e.status.Load(); st != 0 {
		return fmt.Errorf("%w: %w", ErrEndpointFailed, Status(st))
	}
	return nil
}

// failure is the error of an operation that completed with st.
func (e *Endpoint) failure(st C.ucs_status_t) error {
	if err := e.Err(); err != nil {
		return err
	}
	return statusError(st)
}

// post runs f, which posts an operation on e.h, unless e is closed.
func (e *Endpoint) post(f func() C.ucs_status_ptr_t) (C.ucs_status_ptr_t, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, false
	}
	return f(), true
}

// Send sends payload as one tagged message (ucp_tag_send_nbx) and waits
// for its local completion: UCX has taken the data (copied, or handed to
// the transport), not necessarily delivered it. The payload is copied and
// not retained.
//
// It returns ctx.Err() if ctx ends first (the message may still go out),
// ErrClosed if the worker is closing, an error wrapping ErrEndpointClosed
// on a closed endpoint, and an error wrapping ErrEndpointFailed (and the
// Status) on an endpoint UCX reported as failed.
func (e *Endpoint) Send(ctx context.Context, tag uint64, payload []byte) error {
	if err := e.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	w := e.w
	if !w.enter() {
		return ErrClosed
	}
	defer w.exit()
	// C memory, not the caller's: a send whose wait is cut short goes on
	// after Send returns, and the caller may reuse its slice by then.
	buf := C.malloc(C.size_t(max(len(payload), 1)))
	copy(unsafe.Slice((*byte)(buf), len(payload)), payload)
	free := func() { C.free(buf) }
	o, h := newOp()
	ptr, ok := e.post(func() C.ucs_status_ptr_t {
		return C.epc_tag_send(e.h, buf, C.size_t(len(payload)), C.uint64_t(tag), C.uintptr_t(h))
	})
	if !ok {
		h.Delete()
		free()
		return ErrEndpointClosed
	}
	st, cut := w.await(ctx, ptr, o, h, abandonOp, free)
	switch {
	case cut != nil:
		return cut
	case st != C.UCS_OK:
		return fmt.Errorf("ucx: send (label %d): %w", e.label, e.failure(st))
	}
	return nil
}

// Close closes the endpoint with ucp_ep_close_nbx and waits until the close
// has completed, progressing meanwhile: after a flush of what was sent on
// it, or at once (UCP_EP_CLOSE_FLAG_FORCE) if UCX reported it as failed.
// It returns the close's error, if any (the endpoint is released all the
// same). Operations posted afterwards fail with ErrEndpointClosed. A second
// Close waits for the first and returns the same.
func (e *Endpoint) Close() error { return e.close(false, false) }

// close closes e once; orphan counts it in EndpointStats.Orphaned if this
// call is the one that closes it.
func (e *Endpoint) close(force, orphan bool) error {
	e.closeOnce.Do(func() {
		e.mu.Lock() // waits for operations being posted
		e.closed = true
		e.mu.Unlock()
		if e.status.Load() != 0 {
			force = true // nobody to flush to
		}
		w := e.w
		f := C.int(0)
		if force {
			f = 1
		}
		o, h := newOp()
		ptr := C.epc_ep_close(e.h, f, C.uintptr_t(h))
		st, _ := w.await(context.Background(), ptr, o, h, awaitOp, nil)
		// The close has completed: UCX will not call the error callback.
		e.handle.Delete()
		w.epsMu.Lock()
		delete(w.eps, e)
		w.epsMu.Unlock()
		w.count(func(c *counters) {
			c.closed.Add(1)
			if orphan {
				c.orphaned.Add(1)
			}
		})
		if st != C.UCS_OK {
			e.closeErr = fmt.Errorf("ucx: ucp_ep_close_nbx (label %d): %w", e.label, e.failure(st))
		}
	})
	return e.closeErr
}

// failed is the error callback: UCX reports that e failed with st.
func (e *Endpoint) failed(st C.ucs_status_t) {
	if !e.status.CompareAndSwap(0, int32(st)) {
		return
	}
	e.w.count(func(c *counters) { c.failed.Add(1) })
	if e.handed.Load() {
		e.report()
	}
}

// report starts OnFailure for e, once, unless the worker's Close no longer
// waits for it.
func (e *Endpoint) report() {
	w := e.w
	if w.onFailure == nil || !e.reported.CompareAndSwap(false, true) {
		return
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.hooksClosed {
		return
	}
	w.hooks.Add(1)
	go func() {
		defer w.hooks.Done()
		w.onFailure(e, e.Err())
	}()
}

// count applies f to the worker's counters and to its context's.
func (w *Worker) count(f func(*counters)) {
	f(&w.stats)
	f(&w.ctx.stats)
}
