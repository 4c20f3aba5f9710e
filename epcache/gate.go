package epcache

import "sync/atomic"

// gate counts the operations that may still call Release (creations in
// flight, invalidations) and lets Close wait for them. A cache has one per
// stats stripe, so that operations on different keys do not all write one
// counter. Unlike a
// sync.WaitGroup, entering a closed gate fails instead of racing with the
// wait, so nothing can start a creation after Close stopped waiting.
type gate struct {
	state   atomic.Int64 // closedBit | number inside
	drained chan struct{}
}

const gateClosed = int64(1) << 62

func newGate() gate { return gate{drained: make(chan struct{})} }

// enter reports whether the caller may start; if so it must call exit.
func (g *gate) enter() bool {
	for {
		s := g.state.Load()
		if s&gateClosed != 0 {
			return false
		}
		if g.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

func (g *gate) exit() {
	// Once closed, the count only falls, so exactly one exit sees it reach 0.
	if g.state.Add(-1) == gateClosed {
		close(g.drained)
	}
}

// close refuses new entries and waits for those inside to exit. It must be
// called once.
func (g *gate) close() {
	if g.state.Or(gateClosed) == 0 {
		close(g.drained)
	}
	<-g.drained
}
