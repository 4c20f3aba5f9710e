//go:build unix

package bench

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time the process has used so far, user and
// system, all its threads together (getrusage(RUSAGE_SELF)), or 0 where it
// cannot be read. Linux computes it from the scheduler's nanosecond
// run-time, not from clock ticks, so that a run of 100 ms reads it to a
// microsecond; time a thread waited for a core, or that the hypervisor
// stole, is not in it.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
