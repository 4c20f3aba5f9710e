//go:build (amd64 || arm64) && !purego

package shard

// getg returns the address of the calling goroutine's runtime g, which
// stays the goroutine's from its start to its exit (the runtime reuses it
// for a goroutine started after that one exited).
func getg() uintptr

// leaseHint returns the ticket hint of the calling goroutine: eight bits of
// a multiplicative hash of its g (getg), with the field's top bit set, so
// never 0. It is the same at every call depth and across stack moves, and
// another goroutine's differs but one pair in 256 (such a pair is taken
// for one goroutine: its leases grow no lines between them). anchor is the
// fallback's (hint_stack.go), unused here.
func leaseHint[W ~uint64](anchor *byte) W {
	return identityHint(W(getg()))
}

// goroutineHints reports whether leaseHint tells goroutines apart by their
// identity (true) or by where their stacks are.
const goroutineHints = true
