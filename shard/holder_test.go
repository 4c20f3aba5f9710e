package shard_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epcache/epcache/shard"
)

// holder is a goroutine that takes and ends leases of one slot when told,
// spinning in between so that it keeps a P: at GOMAXPROCS 2 the test's
// goroutine runs on the other one.
type holder struct {
	s    *shard.Slot[int, int]
	cmd  atomic.Int32 // holderIdle, holderTake, holderEnd, holderStop
	tk   shard.Ticket
	last bool
	err  error
	pid  int
	wg   sync.WaitGroup
}

const (
	holderIdle = iota
	holderTake
	holderEnd
	holderStop
)

// startHolder starts a holder of s whose hint differs from hint (the test
// goroutine's). A goroutine whose hint is the same (hints hash alike one
// pair in 256) is kept running, idle, while another is started, so that
// the next does not reuse its g; all are stopped at the test's end.
func startHolder(t *testing.T, s *shard.Slot[int, int], hint uint64) *holder {
	t.Helper()
	for range 64 {
		h := &holder{s: s}
		h.wg.Go(h.run)
		t.Cleanup(h.stop)
		tk := h.take()
		got, _ := shard.Hint(tk)
		h.end()
		if got != hint {
			return h
		}
	}
	t.Fatal("64 goroutines in a row had the test goroutine's hint")
	return nil
}

func (h *holder) run() {
	for {
		switch h.cmd.Load() {
		case holderTake:
			var ok bool
			h.tk, ok = h.s.Lease(nil)
			if !ok {
				panic("holder: no lease of a ready value")
			}
			h.pid = shard.PID()
			h.cmd.Store(holderIdle)
		case holderEnd:
			h.last, h.err = h.s.EndLease(h.tk)
			h.cmd.Store(holderIdle)
		case holderStop:
			return
		}
	}
}

func (h *holder) do(cmd int32) {
	h.cmd.Store(cmd)
	for h.cmd.Load() != holderIdle {
		runtime.Gosched()
	}
}

// take has the holder take a lease, and hold it, and returns it.
func (h *holder) take() shard.Ticket { h.do(holderTake); return h.tk }

// end has the holder end the lease it holds.
func (h *holder) end() (last bool, err error) { h.do(holderEnd); return h.last, h.err }

func (h *holder) stop() {
	if h.cmd.Load() != holderStop {
		h.cmd.Store(holderStop)
		h.wg.Wait()
	}
}
