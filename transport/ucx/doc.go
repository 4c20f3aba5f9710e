// Package ucx is a messaging layer on real UCX endpoints, built on
// [github.com/epcache/epcache/epcache]: UCP workers in one process that
// find each other through a [github.com/epcache/epcache/transport/directory]
// and keep one endpoint per (worker, peer), created by exactly one
// goroutine however many need it at once. It is the setting of the bug
// epcache exists for: Open MPI's UCX layer (pml_ucx's get_ep) reads a
// peer's endpoint slot, creates an endpoint when the slot is empty and
// stores it, so two threads that both see it empty both call ucp_ep_create;
// UCX does not deduplicate, and the endpoint of the store that loses is
// never closed (ompi #12833). The package's tests reproduce that leak on
// real endpoints (naive_test.go) and show epcache creating one endpoint per
// pair under the same storm.
//
// # Building and testing
//
// Everything but this documentation is behind the build tag ucx and needs
// cgo and UCX's headers and libraries (-lucp -lucs); without the tag the
// package is empty and builds anywhere. On Debian or Ubuntu:
//
//	apt-get install libucx-dev
//	go test -tags ucx -race ./transport/ucx
//
// It was written against UCX 1.13 (Debian 12's libucx-dev).
//
// # Layers
//
// A [Context] is a ucp_context_h with the tag-matching and wakeup features.
// A [Worker] is a ucp_worker_h created in UCS_THREAD_MODE_MULTI, with its
// progress goroutine; [Worker.Address] is its UCX address behind a small
// header, and [Worker.Connect] creates an [Endpoint] to another worker and
// waits for its wire-up. Endpoints send small tagged messages
// ([Endpoint.Send]); workers receive them ([Worker.Recv]). Every
// ucp_ep_create and ucp_ep_close_nbx goes through one wrapper that counts
// them ([EndpointStats]: created, closed, failed, and orphans, the
// endpoints nobody closed until their worker was closed), so that a leak is
// a number. A [Peer] puts it together as package
// [github.com/epcache/epcache/transport/tcp] does for TCP connections: a
// worker, its address published in the directory, an epcache.Cache from
// peer number to endpoint, Send and Recv.
//
// # Progress
//
// Each worker has one progress goroutine, the only caller of
// ucp_worker_progress. It progresses until there is nothing left, arms the
// worker (ucp_worker_arm) and blocks in epoll_wait on the worker's event
// descriptor (ucp_worker_get_efd). A goroutine whose operation (a flush, a
// close, a send, a receive) UCX does not complete at once signals the
// worker (ucp_worker_signal) and parks on a channel that the operation's
// completion callback closes; nobody spins.
// The wait on the descriptor is bounded by a tick: 5 ms while the worker
// has had work in the last 200 ms, then 250 ms, for UCX's timers and for
// the transport events UCX's async thread queues as missed without a
// signal. While TCP connections are being set up, UCX 1.13 leaves the
// descriptor readable with nothing to progress; after two such wake-ups in
// a row the goroutine sleeps 1 ms (or until a signal) before waiting on it
// again, instead of spinning. Measured on two cores with the race
// detector: 16 idle workers with 240 endpoints between them cost 1% of a
// core, four wake-ups per worker per second (TestIdleCost). [Worker] has
// the details.
//
// UCX guards a multi-threaded worker with a spinlock unless told otherwise;
// a [Context] sets USE_MT_MUTEX=y, so that goroutines contending for a
// worker sleep instead of spinning away the CPU the holder needs.
//
// # Endpoints in the cache
//
// The cache's Create for peer r looks r up in the directory. While the
// directory answers "not yet published", a directory that implements
// directory.Resolver (the in-process one does) is asked to wait for the
// address (Resolve, within Config.CreateTimeout); with another, the lookup
// fails with directory.ErrNotPublished, which [Retryable] and so the
// default Config.Retry retry, with backoff, within Config.CreateTimeout.
// An address that turns out stale (not an address of a live worker) is
// reported with the Resolver's Unreachable, and if the directory has
// another for r by then (r restarted), Create connects to that one. With
// an address, Create calls [Worker.Connect]: ucp_ep_create with
// UCP_ERR_HANDLING_MODE_PEER and an error callback, then ucp_ep_flush_nbx,
// which completes once the remote worker has answered. Create therefore
// fails for a dead peer instead of returning an endpoint that fails later,
// and Config.ErrorTTL remembers that failure: senders to a dead peer get
// the error at once instead of creating endpoint after endpoint. Release
// closes the endpoint with ucp_ep_close_nbx (a flush close; a forced one
// for an endpoint UCX reported as failed) and waits until the close has
// completed, the progress goroutine progressing meanwhile.
//
// When UCX calls an endpoint's error callback (its peer worker is gone),
// the peer drops that endpoint with the cache's CompareAndInvalidate, on a
// goroutine of its own (a callback runs inside ucp_worker_progress, with
// the worker locked, and must not call back into UCX), so that a late
// report never drops a newer endpoint. A Send on a failed endpoint fails
// with [ErrEndpointFailed] and reports it the same way; the next Send
// connects again.
//
// [Peer.Send] holds an epcache lease on the endpoint while it sends, so
// that a report (its own, another Send's, the error callback's) drops the
// endpoint from the cache at once but never closes it under a send: the
// cache's Release, ucp_ep_close_nbx, runs once the last Send using it is
// done. The endpoint's own read-write lock (an operation is posted under
// the read lock, Close takes the write lock) stays all the same, and is
// still needed: an [Endpoint] is usable without the cache, and may be
// closed by whoever holds it while another goroutine posts on it, and
// [Worker.Close] closes the endpoints left open, as orphans, whatever is
// posting on them. For a Peer's endpoints the lock is now uncontended.
//
// # Addresses
//
// A worker's address is published as string(Worker.Address()). UCX unpacks
// an address by trusting the lengths inside it, so that a truncated or
// garbage blob would make ucp_ep_create read past its end. Connect refuses
// such blobs before UCX sees them: the header carries a magic number, a
// version and the exact length ([ErrBadAddress], with an [*AddressError]
// saying what is wrong), and only addresses issued by an open [Context] of
// this process are passed on ([ErrUnknownAddress]).
//
// # cgo
//
// No Go pointer is stored in C memory. UCX's callbacks are C functions
// (epucx.c) that forward to //export Go functions; their user data is a
// runtime/cgo.Handle, deleted once UCX can no longer call with it. Message
// buffers given to UCX are C memory (a send's payload is copied), so that
// nothing needs pinning, even when a Send returns on its context before UCX
// is done with the buffer. The address bytes are passed to ucp_ep_create
// for the call only.
//
// # Transports
//
// [Options.Config] sets UCX variables for one context, as UCX_ environment
// variables would. The tests and the ucxstorm benchmark use TLS=self,tcp:
// with peer error handling, UCX 1.13 refuses its shared-memory transports
// for messages ("no peer failure handler"), so TCP carries everything
// between workers anyway, and leaving shared memory in only costs every
// worker shared-memory segments, which a container's small /dev/shm runs
// out of. TCP also shows a dead worker at once: its sockets close.
package ucx
