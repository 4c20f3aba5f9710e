//go:build ucx

package ucx

/*
#cgo LDFLAGS: -lucp -lucs
#include "epucx.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Options configures a [Context].
type Options struct {
	// Config sets UCX configuration variables, named without their UCX_
	// prefix ("TLS", "USE_MT_MUTEX"), over what the UCX_ environment
	// variables say: Config{"TLS": "self,tcp"} is UCX_TLS=self,tcp for this
	// context only.
	//
	// Unless Config sets it, USE_MT_MUTEX is "y": UCX guards a
	// multi-threaded worker with a spinlock by default, and goroutines
	// contending for a worker (a progress goroutine and many senders on two
	// cores) would spin away the CPU that the lock holder needs.
	Config map[string]string
}

// Context is a UCP context (ucp_context_h) with the tag-matching and wakeup
// features, from which [Worker]s are made. Its methods are safe for
// concurrent use. Make one with [NewContext]; Close it once its workers are
// no longer needed.
type Context struct {
	h     C.ucp_context_h
	stats counters // every endpoint of every worker of this context

	mu      sync.Mutex
	closed  bool
	workers map[*Worker]struct{}
	addrs   []string // the addresses of its workers, in the registry until Close
}

// NewContext initialises UCX (ucp_init) with the tag and wakeup features.
// It returns an error if UCX rejects the configuration (a value it cannot
// parse, a transport list that leaves nothing usable). UCX ignores
// variables it does not know.
func NewContext(opts Options) (*Context, error) {
	cfg := map[string]string{"USE_MT_MUTEX": "y"}
	for k, v := range opts.Config {
		cfg[k] = v
	}
	keys := slices.Sorted(maps.Keys(cfg)) // a stable order, for reproducible errors
	names := C.malloc(C.size_t(len(keys)) * C.size_t(unsafe.Sizeof(uintptr(0))))
	values := C.malloc(C.size_t(len(keys)) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(names)
	defer C.free(values)
	n := unsafe.Slice((**C.char)(names), len(keys))
	v := unsafe.Slice((**C.char)(values), len(keys))
	for i, k := range keys {
		n[i], v[i] = C.CString(k), C.CString(cfg[k])
		defer C.free(unsafe.Pointer(n[i]))
		defer C.free(unsafe.Pointer(v[i]))
	}
	c := &Context{workers: map[*Worker]struct{}{}}
	if st := C.epc_init((**C.char)(names), (**C.char)(values), C.int(len(keys)), &c.h); st != C.UCS_OK {
		return nil, fmt.Errorf("ucx: UCX configuration %v: %w", cfg, statusError(st))
	}
	return c, nil
}

// Stats returns the endpoint counters of every worker this context made.
func (c *Context) Stats() EndpointStats { return c.stats.snapshot() }

// Close closes the context's workers that are still open (see
// [Worker.Close]), removes their addresses from the process's registry (a
// Connect to one of them then fails with [ErrUnknownAddress]), and
// releases UCX (ucp_cleanup). A second Close returns nil.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ws := make([]*Worker, 0, len(c.workers))
	for w := range c.workers {
		ws = append(ws, w)
	}
	c.mu.Unlock()
	var errs []error
	for _, w := range ws {
		errs = append(errs, w.Close())
	}
	c.mu.Lock()
	for _, a := range c.addrs {
		registry.Delete(a)
	}
	c.addrs = nil
	c.mu.Unlock()
	C.ucp_cleanup(c.h)
	return errors.Join(errs...)
}

// EndpointStats counts endpoints: every ucp_ep_create that returned one, and every
// ucp_ep_close_nbx, so that a leak is a number. A snapshot taken after the
// workers were closed is exact.
type EndpointStats struct {
	Created      uint64 // endpoints ucp_ep_create returned
	Closed       uint64 // endpoints closed with ucp_ep_close_nbx, whoever closed them
	Orphaned     uint64 // of Closed: left open by their owner and closed by Worker.Close
	Failed       uint64 // error callbacks: endpoints UCX reported as failed
	CreateErrors uint64 // ucp_ep_create calls, and wire-ups of Connect, that failed
}

// Live returns the number of endpoints created and not closed yet.
func (s EndpointStats) Live() int64 { return int64(s.Created) - int64(s.Closed) }

type counters struct {
	created, closed, orphaned, failed, createErrors atomic.Uint64
}

func (c *counters) snapshot() EndpointStats {
	return EndpointStats{
		Created:      c.created.Load(),
		Closed:       c.closed.Load(),
		Orphaned:     c.orphaned.Load(),
		Failed:       c.failed.Load(),
		CreateErrors: c.createErrors.Load(),
	}
}
