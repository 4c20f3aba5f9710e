// Helpers of package ucx around the UCP API: parameter structures, the
// callbacks UCX calls (which forward to Go through //export functions with a
// runtime/cgo.Handle as user data), and the pointer-status macros cgo cannot
// call. Only declarations and static inline functions: every Go file of the
// package includes it.

#ifndef EPUCX_H
#define EPUCX_H

#include <stdint.h>
#include <stdlib.h>
#include <ucp/api/ucp.h>

// epc_init reads UCX's configuration (environment included), applies the n
// modifications names[i]=values[i], and creates a context with the tag and
// wakeup features, shared by workers used from many threads.
ucs_status_t epc_init(const char **names, const char **values, int n, ucp_context_h *ctx);

// epc_worker_create creates a worker in UCS_THREAD_MODE_MULTI.
ucs_status_t epc_worker_create(ucp_context_h ctx, ucp_worker_h *worker);

// epc_ep_create creates an endpoint to the worker at addr, with peer error
// handling; its error callback reports to Go with handle.
ucs_status_t epc_ep_create(ucp_worker_h worker, const void *addr, uintptr_t handle, ucp_ep_h *ep);

// The non-blocking operations: each returns a status or a request, whose
// completion is reported to Go with op (see epcOpDone). The caller frees the
// request once it is complete.
ucs_status_ptr_t epc_ep_flush(ucp_ep_h ep, uintptr_t op);
ucs_status_ptr_t epc_ep_close(ucp_ep_h ep, int force, uintptr_t op);
ucs_status_ptr_t epc_tag_send(ucp_ep_h ep, const void *buf, size_t len, uint64_t tag, uintptr_t op);
ucs_status_ptr_t epc_tag_recv(ucp_worker_h worker, void *buf, size_t len, uintptr_t op);

static inline int epc_is_ptr(ucs_status_ptr_t p) { return UCS_PTR_IS_PTR(p); }
static inline ucs_status_t epc_status(ucs_status_ptr_t p) { return UCS_PTR_STATUS(p); }

#endif
