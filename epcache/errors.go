package epcache

import (
	"errors"
	"fmt"
)

// ErrClosed is returned by Get once Close has begun, to new callers and to
// callers waiting on a creation. Test for it with errors.Is.
var ErrClosed = errors.New("epcache: cache closed")

// ErrOffered is the cause (context.Cause) with which the context of a
// creation is cancelled when an Offer answers it: its value is no longer
// wanted, so Create may stop.
var ErrOffered = errors.New("epcache: creation answered by Offer")

// ErrCreateTimeout matches, with errors.Is, the error the callers of a
// creation get when Config.CreateTimeout ends it; the error matches
// context.DeadlineExceeded too. It tells a timeout of the cache's from a
// Create that returned DeadlineExceeded itself.
var ErrCreateTimeout = errors.New("epcache: creation exceeded CreateTimeout")

// ErrGoexit is returned to the callers waiting on a creation whose Create
// called runtime.Goexit (t.FailNow in a test, for instance).
var ErrGoexit = errors.New("epcache: Create called runtime.Goexit")

// PanicError is a panic recovered from a function the cache called. Callers
// waiting on a creation whose Create (or Retry) panicked receive it as a
// *PanicError; Close reports panics of Release wrapped around one.
type PanicError struct {
	Value any    // what was passed to panic
	Stack []byte // the panicking goroutine's stack, from runtime/debug.Stack
}

// Error reports the panic value and the stack of the goroutine that panicked.
func (p *PanicError) Error() string {
	return fmt.Sprintf("epcache: panic: %v\n\n%s", p.Value, p.Stack)
}

// Unwrap returns the panic value if it is an error, so that errors.Is and
// errors.As see through a panic(err).
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}
