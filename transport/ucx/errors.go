//go:build ucx

package ucx

/*
#include "epucx.h"
*/
import "C"

import (
	"errors"
	"fmt"

	"github.com/epcache/epcache/transport/directory"
)

// ErrClosed is returned by the methods of a [Peer], [Worker] or [Endpoint]
// once its Close has begun. Test for it with errors.Is.
var ErrClosed = errors.New("ucx: closed")

// ErrSelf matches the error Send returns when a peer sends to itself.
var ErrSelf = errors.New("ucx: send to self")

// ErrMessageTooLarge matches, with errors.Is, the error Send returns for a
// payload longer than Config.MaxMessage. Nothing is sent.
var ErrMessageTooLarge = errors.New("ucx: message too large")

// ErrEndpointFailed matches, with errors.Is, the error of an operation on
// an endpoint that UCX reported as failed (its error callback ran: the peer
// worker is gone or unreachable). The error also wraps the UCX [Status].
var ErrEndpointFailed = errors.New("ucx: endpoint failed")

// ErrBadAddress matches, with errors.Is, the error Connect returns for a
// blob that is not a worker address of this package: too short, truncated,
// or garbage. See [AddressError].
var ErrBadAddress = errors.New("ucx: malformed worker address")

// ErrUnknownAddress matches, with errors.Is, the error Connect returns for a
// well-formed address that no open [Context] of this process issued: UCX
// would parse it blindly, so it is refused before it gets there.
var ErrUnknownAddress = errors.New("ucx: unknown worker address")

// AddressError says why an address blob was refused. It matches
// [ErrBadAddress] with errors.Is.
type AddressError struct {
	Len    int    // the blob's length
	Reason string // what is wrong with it
}

// Error describes the blob and what is wrong with it.
func (e *AddressError) Error() string {
	return fmt.Sprintf("ucx: malformed worker address (%d bytes): %s", e.Len, e.Reason)
}

// Is reports whether target is ErrBadAddress.
func (e *AddressError) Is(target error) bool { return target == ErrBadAddress }

// Status is a UCX status code (ucs_status_t) that an operation failed with:
// errors.As(err, &st) recovers it from the errors of this package.
type Status int

// Error returns UCX's description of the status and its number.
func (s Status) Error() string {
	return fmt.Sprintf("ucx: %s (status %d)", C.GoString(C.ucs_status_string(C.ucs_status_t(s))), int(s))
}

// Some statuses a caller may want to tell apart.
const (
	StatusCanceled        = Status(C.UCS_ERR_CANCELED)
	StatusConnectionReset = Status(C.UCS_ERR_CONNECTION_RESET)
	StatusUnreachable     = Status(C.UCS_ERR_UNREACHABLE)
	StatusTimedOut        = Status(C.UCS_ERR_ENDPOINT_TIMEOUT)
	StatusTruncated       = Status(C.UCS_ERR_MESSAGE_TRUNCATED)
)

func statusError(st C.ucs_status_t) error {
	if st == C.UCS_OK {
		return nil
	}
	return Status(st)
}

// Retryable reports whether a failed connection attempt is worth another
// try: the peer's address is not published yet (errors.Is(err,
// directory.ErrNotPublished)). Every other failure (an unknown peer, a
// refused address, a wire-up that failed) is final, and Config.ErrorTTL
// decides how long it is remembered. It is meant for epcache.Backoff's
// retryable argument.
func Retryable(err error) bool { return errors.Is(err, directory.ErrNotPublished) }
