package epprom_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: caches,
// tcp peers and servers are all closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// hang bounds a wait that only detects a hang: a test may wait this long
// for something that must happen, however slow or busy the machine, and
// fails only if it never does.
const hang = 2 * time.Minute
