//go:build !unix

package bench

import "time"

// processCPU returns 0: no process CPU time is read on this system, and
// Result.CPUPerOp stays 0.
func processCPU() time.Duration { return 0 }
