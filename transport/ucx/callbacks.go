//go:build ucx

package ucx

/*
#include "epucx.h"
*/
import "C"

import (
	"runtime/cgo"
)

// The functions UCX calls back, through the C functions of epucx.c. Their
// user data is a runtime/cgo.Handle (no Go pointer is stored in C memory),
// deleted only once UCX can no longer call with it: an op's after its
// completion, an endpoint's after ucp_ep_close_nbx completed.
//
// They run inside ucp_worker_progress (or the UCX call that completed the
// operation), on a thread that holds the worker's lock: they must not
// block and must not call UCX. They close a channel, store an atomic, or
// start a goroutine, and return.

// op is one non-blocking UCX operation (a flush, a close, a send, a
// receive) that a goroutine waits for.
type op struct {
	done   chan struct{} // closed by epcOpDone
	status C.ucs_status_t
	length int    // receive: bytes received
	tag    uint64 // receive: the sender's tag
}

// newOp returns an op and the handle that UCX passes back to epcOpDone.
func newOp() (*op, cgo.Handle) {
	o := &op{done: make(chan struct{})}
	return o, cgo.NewHandle(o)
}

//export epcOpDone
func epcOpDone(h C.uintptr_t, status C.ucs_status_t, length C.size_t, tag C.uint64_t) {
	o := cgo.Handle(h).Value().(*op)
	o.status, o.length, o.tag = status, int(length), uint64(tag)
	close(o.done)
}

//export epcEndpointFailed
func epcEndpointFailed(h C.uintptr_t, status C.ucs_status_t) {
	cgo.Handle(h).Value().(*Endpoint).failed(status)
}
