package shard

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// Leases that reach a value's growth at once (each catching another hold
// of its first ticket from another P) make its lines once: one allocation
// per value, what the package comment says a grown value costs, however
// many leases race for it.
func TestLinesAreMadeOncePerValue(t *testing.T) {
	const procs, values, racers = 4, 2000, 4
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	lines := int(unsafe.Sizeof(leaseLine{})) * ceilPow2(linesPerP*procs)
	// The least of a few rounds: beside the lines, the racers' goroutines
	// allocate a few hundred bytes, and the runtime now and then a few
	// KiB for itself; lines made twice for one value in a hundred would
	// be 40 KiB more.
	extra := math.MaxInt
	for range 5 {
		tables := make([]*leaseTable, values)
		for i := range tables {
			tables[i] = new(leaseTable)
			tables[i].contended.Store(growAfter - 1)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var start, wg sync.WaitGroup
		start.Add(1)
		for r := range racers {
			wg.Go(func() {
				// A hold of its own (generation r+1) on P 1, caught from P 0.
				w := uint64(ticketHeld|ticketFresh) | pidBits[uint64](1) | identityHint(uint64(r+1)) | uint64(r+1)
				start.Wait()
				for _, tb := range tables {
					tb.caught(w, pidBits[uint64](0))
				}
			})
		}
		start.Done()
		wg.Wait()
		runtime.ReadMemStats(&after)
		for i, tb := range tables {
			if tb.lines.Load() == nil {
				t.Fatalf("value %d: no lines after %d pieces of evidence", i, growAfter-1+racers)
			}
		}
		extra = min(extra, int(after.TotalAlloc-before.TotalAlloc)-values*lines)
	}
	if extra >= values/100*lines {
		t.Errorf("%d values grown by %d leases each at once: %d bytes allocated beyond one set of lines each (%d bytes), %.2f sets more per value", values, racers, extra, lines, float64(extra)/float64(values*lines))
	}
}

// A lease handed over (restamp) from a ticket that records P takes the
// new holder's hint and P, and still ends by recording the P of its end:
// the end of a lease whose word records P never leaves the word stale.
func TestRestampOfATicketThatRecordsP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	var word atomic.Uint64
	word.Store(ticketRecordP | ticketFresh | identityHint(uint64(1)) | 7)
	creator, claimer := identityHint(uint64(1)), identityHint(uint64(2))
	tk, ok, gone := take(&word, creator, pidBits[uint64](3))
	if !ok || gone || tk.w&ticketSlow == 0 {
		t.Fatalf("take of a ticket that records P: ok %v, gone %v, slow %v", ok, gone, tk.w&ticketSlow != 0)
	}
	tk = tk.restamp(claimer)
	if w := word.Load(); w&ticketHint != claimer || w&ticketRecordP == 0 || w&ticketHeld == 0 {
		t.Fatalf("after the hand-over the ticket is %#x: want the claimer's hint %#x, held, recording P", w, claimer)
	}
	if TryEnd[uint64](tk) {
		t.Fatal("TryEnd ended a lease whose ticket records P")
	}
	if !TryEndRecording(tk) {
		t.Fatal("TryEndRecording did not end the handed-over lease")
	}
	// The take recorded P 3, which no P is at GOMAXPROCS 2: the end
	// overwrites it with its own.
	if w := word.Load(); w&ticketHeld != 0 || w&ticketFresh == 0 || w&ticketP == pidBits[uint64](3) {
		t.Fatalf("after the end the ticket is %#x: want free, fresh, with the P of the end", w)
	}
	if TryEndRecording(tk) {
		t.Fatal("a lease ended twice")
	}
}
