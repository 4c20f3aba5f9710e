//go:build !(amd64 || arm64) || purego

package shard

import "unsafe"

// leaseHint returns the ticket hint of the calling goroutine on an
// architecture where getg has no assembly here: a hash of the 8 KiB block
// of its stack that anchor, a variable of the caller, is in. The block is
// coarse so that one goroutine's nested leases, taken a few frames apart,
// have one hint; the price is that goroutines whose stacks lie in one block
// share it (a new goroutine's stack is 2 KiB: four can), and that a
// goroutine leasing from call depths far apart, or whose stack moved, is
// taken for another.
//
// Safety: the address is used as a number only, never dereferenced.
func leaseHint[W ~uint64](anchor *byte) W {
	return identityHint(W(uintptr(unsafe.Pointer(anchor))) >> 13)
}

// goroutineHints reports whether leaseHint tells goroutines apart by their
// identity (true) or by where their stacks are.
const goroutineHints = false
