package shard_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readySlot(t *testing.T) (*shard.Table[int, int], *shard.Slot[int, int]) {
	tb := newTable[int, int](t, shard.Options[int]{})
	return tb, publish(t, tb, 1, 100)
}

// The table's Acquire writes a lease's Ticket out, as take makes it: every
// lease it hands out, on its fast path (the first ticket, free) and off it
// (no lease table yet, or the first ticket held), is one a fast end can
// end, and only once.
func TestAcquireTicketsAsTakeMakesThem(t *testing.T) {
	tb, s := readySlot(t)
	for round := range 100 {
		_, a, ok := tb.Lease(1) // the first round makes the lease table
		require.True(t, ok)
		_, b, ok := tb.Lease(1) // the first ticket is held: the second
		require.True(t, ok)
		require.True(t, shard.JustTaken(a), "round %d: the first lease", round)
		require.True(t, shard.JustTaken(b), "round %d: the second lease", round)
		require.True(t, shard.TryEnd[uint64](b))
		require.False(t, shard.TryEnd[uint64](b), "round %d: a lease ended twice", round)
		require.True(t, shard.TryEnd[uint64](a))
		require.False(t, shard.TryEnd[uint64](a), "round %d: a lease ended twice", round)
	}
	assert.Zero(t, s.Leased())
}

// The owner a slot's lease table records is the one given to the call that
// made the table, whichever of them made it, and the table's own leases
// give SetOwner's: the end of a lease finds its cache there.
func TestOwner(t *testing.T) {
	type owner struct{ name string }
	mine, other := &owner{"mine"}, &owner{"other"}
	makers := map[string]func(s *shard.Slot[int, int], f *shard.Flight[int]){
		"Lease": func(s *shard.Slot[int, int], _ *shard.Flight[int]) {
			_, ok := s.Lease(mine)
			require.True(t, ok)
		},
		"Watch":         func(s *shard.Slot[int, int], _ *shard.Flight[int]) { s.Watch(mine) },
		"MarkStraggler": func(s *shard.Slot[int, int], f *shard.Flight[int]) { s.MarkStraggler(f, mine) },
		"Track":         func(s *shard.Slot[int, int], _ *shard.Flight[int]) { s.Track(mine, shard.Nanotime()) },
		"LeaseFor": func(s *shard.Slot[int, int], f *shard.Flight[int]) {
			f.WantLease()
			s.LeaseFor(f, mine)
		},
	}
	for name, makeTable := range makers {
		tb := newTable[int, int](t, shard.Options[int]{})
		tb.SetOwner(other)
		s := tb.LoadOrInsert(1)
		claim, f, ok := s.Claim(nil, context.Background())
		require.True(t, ok)
		assert.Nil(t, s.Owner(), "%s: a slot without a lease table has an owner", name)
		makeTable(s, f)
		require.True(t, tb.Publish(s, claim, 100))
		_, tk, ok := tb.Lease(1) // the table's own lease: the table exists, its owner stays
		require.True(t, ok)
		assert.Same(t, mine, s.Owner(), "%s made the lease table", name)
		_, err := s.EndLease(tk)
		require.NoError(t, err)
	}

	tb := newTable[int, int](t, shard.Options[int]{})
	tb.SetOwner(mine)
	s := publish(t, tb, 1, 100)
	_, tk, ok := tb.Lease(1)
	require.True(t, ok)
	assert.Same(t, mine, s.Owner(), "the table's lease made the lease table")
	_, err := s.EndLease(tk)
	require.NoError(t, err)
}

// A value abandoned while leased is released by the end of its last lease,
// and by nobody else; one never leased is released by Abandon's caller.
func TestLeaseLifecycle(t *testing.T) {
	_, s := readySlot(t)
	assert.True(t, s.Abandon(), "never leased: release now")

	tb, s := readySlot(t)
	var tickets []shard.Ticket
	for range 12 { // eight tickets and four overflow leases
		tk, ok := s.Lease(nil)
		require.True(t, ok)
		require.True(t, tk.Valid())
		tickets = append(tickets, tk)
	}
	assert.Equal(t, 12, s.Leased())
	last, err := s.EndLease(tickets[0])
	require.NoError(t, err)
	assert.False(t, last, "the value is still in the table")
	_, ok := tb.Invalidate(s)
	require.True(t, ok)
	assert.False(t, s.Abandon(), "11 leases hold the value")
	_, ok = s.Lease(nil)
	assert.False(t, ok, "no lease once the value has left")
	for i, tk := range tickets[1:] {
		last, err := s.EndLease(tk)
		require.NoError(t, err)
		assert.Equal(t, i == len(tickets)-2, last, "only the last lease's end releases (lease %d)", i+1)
	}
	assert.Zero(t, s.Leased())
}

// Ending a lease twice is refused, whether or not its ticket was handed out
// again meanwhile, and changes nothing for the ticket's new holder; so is
// ending the zero Ticket.
func TestLeaseEndedTwice(t *testing.T) {
	_, s := readySlot(t)
	a, ok := s.Lease(nil)
	require.True(t, ok)
	_, err := s.EndLease(a)
	require.NoError(t, err)
	_, err = s.EndLease(a)
	assert.ErrorIs(t, err, shard.ErrLeaseEnded, "ended twice")
	b, ok := s.Lease(nil) // takes a's ticket again
	require.True(t, ok)
	_, err = s.EndLease(a)
	assert.ErrorIs(t, err, shard.ErrLeaseEnded, "ended twice, after its ticket was handed out again")
	assert.Equal(t, 1, s.Leased(), "b still holds its lease")
	_, err = s.EndLease(shard.Ticket{})
	assert.ErrorIs(t, err, shard.ErrLeaseEnded, "the zero Ticket")
	assert.False(t, s.Abandon(), "b holds the value")
	last, err := s.EndLease(b)
	require.NoError(t, err)
	assert.True(t, last)

	// Overflow leases too.
	_, s = readySlot(t)
	var tks []shard.Ticket
	for range 9 {
		tk, ok := s.Lease(nil)
		require.True(t, ok)
		tks = append(tks, tk)
	}
	_, err = s.EndLease(tks[8])
	require.NoError(t, err)
	_, err = s.EndLease(tks[8])
	assert.ErrorIs(t, err, shard.ErrLeaseEnded)
	assert.Equal(t, 8, s.Leased())
}

// Goroutines take and end leases while the value is abandoned: exactly one
// party is told to release it, and only once every lease handed out has
// ended (a lease counts in held from its start until just before its end,
// yielding in between, so a release told while one is held is seen).
func TestLeaseAbandonRace(t *testing.T) {
	for range 500 {
		_, s := readySlot(t)
		var (
			wg       sync.WaitGroup
			releases atomic.Int32
			held     atomic.Int32 // leases handed out and not yet ended
			early    atomic.Bool
		)
		start := make(chan struct{})
		for range 12 {
			wg.Go(func() {
				<-start
				for range 20 {
					tk, ok := s.Lease(nil)
					if !ok {
						return
					}
					held.Add(1)
					runtime.Gosched() // held for a while: a release now would be early
					held.Add(-1)      // counted until just before it ends
					last, err := s.EndLease(tk)
					if err != nil {
						panic(err)
					}
					if last {
						if held.Load() != 0 {
							early.Store(true)
						}
						releases.Add(1)
					}
				}
			})
		}
		wg.Go(func() {
			<-start
			if s.Abandon() {
				if held.Load() != 0 {
					early.Store(true)
				}
				releases.Add(1)
			}
		})
		close(start)
		wg.Wait()
		require.EqualValues(t, 1, releases.Load(), "released exactly once")
		require.False(t, early.Load(), "released while leased")
	}
}

// A value whose first ticket goroutines on another P hold grows lines of
// tickets of their own once GrowAfter of their holds were caught, and not
// before: a hold caught by several leases counts once, and one caught from
// its holder's own P not at all. Later leases take tickets on the lines.
// Every guarantee holds across them: a lease ended twice is refused (also
// once its ticket was handed out again), Abandon counts the leases held on
// the lines, and only the last lease's end releases.
func TestLeaseLinesGrowWithContention(t *testing.T) {
	atProcs(t, 2)
	tb, s := readySlot(t)
	mine, ok := s.Lease(nil)
	require.True(t, ok)
	_, err := s.EndLease(mine)
	require.NoError(t, err)
	myHint, _ := shard.Hint(mine)
	h := startHolder(t, s, myHint)
	var tk shard.Ticket
	holds, unsure := 0, 0 // holds caught from another P; caught while this goroutine may have moved
	for shard.LeaseLines(s) == 0 {
		require.Less(t, holds+unsure, 100000, "no lines grown while another P holds the first ticket")
		held := h.take()
		require.False(t, shard.OnLine(s, held))
		require.True(t, shard.Fresh(held), "a take on the slow path records its P")
		before := shard.PID()
		for i := range 3 { // one hold, caught three times
			var ok bool
			tk, ok = s.Lease(nil)
			require.True(t, ok)
			if i < 2 || shard.LeaseLines(s) == 0 {
				_, err := s.EndLease(tk)
				require.NoError(t, err)
			}
		}
		switch _, p := shard.Hint(held); {
		case shard.PID() != before:
			unsure++
		case int(p) != before:
			holds++
		}
		if shard.LeaseLines(s) == 0 {
			_, err := h.end()
			require.NoError(t, err)
			require.Less(t, holds, shard.GrowAfter, "GrowAfter holds caught from another P, and no lines")
		}
	}
	require.LessOrEqual(t, shard.GrowAfter, holds+unsure, "lines grown after %d holds caught from another P (%d more maybe), before GrowAfter", holds, unsure)
	lines := shard.LeaseLines(s)
	assert.GreaterOrEqual(t, lines, 8, "lines grown: four for each of two Ps")
	assert.LessOrEqual(t, lines, 64)
	assert.True(t, shard.OnLine(s, tk), "a lease after the growth takes a ticket on a line")
	_, err = s.EndLease(tk)
	require.NoError(t, err)
	_, err = s.EndLease(tk)
	assert.ErrorIs(t, err, shard.ErrLeaseEnded, "a line's ticket ended twice")
	again, ok := s.Lease(nil) // the same line, the same ticket
	require.True(t, ok)
	require.True(t, shard.OnLine(s, again))
	_, err = s.EndLease(tk)
	assert.ErrorIs(t, err, shard.ErrLeaseEnded, "ended twice, after its ticket was handed out again")

	// Fill the caller's line and more: leases spill to the other lines.
	onLines := []shard.Ticket{again}
	for range 20 {
		tk, ok := s.Lease(nil)
		require.True(t, ok)
		require.True(t, shard.OnLine(s, tk))
		onLines = append(onLines, tk)
	}
	assert.Equal(t, 22, s.Leased())
	_, ok = tb.Invalidate(s)
	require.True(t, ok)
	assert.False(t, s.Abandon(), "22 leases hold the value")
	_, ok = s.Lease(nil)
	assert.False(t, ok, "no lease once the value has left")
	for i, tk := range onLines {
		last, err := s.EndLease(tk)
		require.NoError(t, err)
		assert.False(t, last, "lease %d on a line: not the last", i)
	}
	last, err := h.end()
	require.NoError(t, err)
	assert.True(t, last, "the first ticket's lease, the last, releases")
	assert.Zero(t, s.Leased())
}

// atProcs runs the rest of t at GOMAXPROCS n: lease lines grow only where
// there is more than one P.
func atProcs(t *testing.T, n int) {
	prev := runtime.GOMAXPROCS(n)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
}

// takeTurnsApart runs step(i) on two goroutines i = 0 and 1, one after
// the other, until step returns false, the second goroutine's steps depth
// bytes further down its stack, which gives its leases another hint. Each
// spins while it waits for its turn, so that both hold a P throughout: at
// GOMAXPROCS 2 or more they run on two Ps, as two goroutines leasing one
// value from two cores do. Two goroutines may share a ticket hint, and
// are then not told apart (stackHint): see takeTurnsTold.
func takeTurnsApart(depth int, step func(turn int) bool) {
	var turn atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			atDepth(i*depth, func() {
				for n := int64(i); ; n += 2 {
					for turn.Load() != n {
						if stop.Load() {
							return
						}
					}
					if stop.Load() || !step(int(n)) {
						stop.Store(true)
						return
					}
					turn.Add(1)
				}
			})
		})
	}
	wg.Wait()
}

// leaseAndEnd returns a lease func for takeTurnsTold: the table's Acquire
// of key 1, whose slot is s, and the lease's end.
func leaseAndEnd(t *testing.T, tb *shard.Table[int, int], s *shard.Slot[int, int]) func() (shard.Ticket, bool) {
	return func() (shard.Ticket, bool) {
		got, tk, ok := tb.Lease(1)
		if !ok || got != s {
			t.Error("no lease of a ready value")
			return tk, false
		}
		if _, err := s.EndLease(tk); err != nil {
			t.Error(err)
			return tk, false
		}
		return tk, true
	}
}

// takeTurnsTold is takeTurnsApart with two goroutines whose hints differ,
// as they do but one pair in 256: a pair found to share one (first is
// called with the tickets of turns 0 and 1) is replaced by another, whose
// second goroutine leases from further down its stack (which gives it
// another hint where hints come from the stack), and which runs while two
// parked goroutines keep the g's of the pair before (where hints come from
// the g, which the runtime reuses). lease takes and ends the step's lease
// and returns its ticket; step, the rest of the step.
func takeTurnsTold(t *testing.T, lease func() (shard.Ticket, bool), step func(turn int) bool) {
	t.Helper()
	parked := make(chan struct{})
	defer close(parked)
	for depth := 0; ; depth += 2 << 10 {
		require.Less(t, depth, 64<<10, "no pair of goroutines with hints of their own")
		var first [2]uint64
		shared := false
		takeTurnsApart(depth, func(turn int) bool {
			if !step(turn) {
				return false
			}
			tk, ok := lease()
			if !ok {
				return false
			}
			if turn < 2 {
				first[turn], _ = shard.Hint(tk)
			}
			if turn == 1 && first[0] == first[1] {
				shared = true
				return false
			}
			return true
		})
		if !shared {
			return
		}
		for range 2 {
			go func() { <-parked }()
		}
	}
}

// A value leased by one goroutine after another, never two at once, also
// grows lines when the two run on two Ps: each lease writes the ticket the
// other goroutine wrote last, which moves its line from one core to the
// other. The table's Acquire tells from the ticket who took it last, and
// on which P.
func TestLeaseLinesGrowWhenLeasesMove(t *testing.T) {
	atProcs(t, 2)
	tb, s := readySlot(t)
	grown := -1
	takeTurnsTold(t, leaseAndEnd(t, tb, s), func(turn int) bool {
		if shard.LeaseLines(s) > 0 {
			grown = turn
			return false
		}
		return turn <= 100000 // beyond, a hang: the check below fails
	})
	require.GreaterOrEqual(t, grown, shard.GrowAfter, "lines grown after %d leases, before GrowAfter moves", grown)
	assert.Zero(t, s.Leased())

	// One goroutine alone never grows them, however many leases it takes.
	tb2, s2 := readySlot(t)
	for range 10 * shard.GrowAfter {
		_, tk, ok := tb2.Lease(1)
		require.True(t, ok)
		_, err := s2.EndLease(tk)
		require.NoError(t, err)
	}
	assert.Zero(t, shard.LeaseLines(s2), "lines grown for leases of one goroutine")
}

// One goroutine holding two leases of a value at once (a lease inside a
// lease: a send helper called while its caller holds the connection) is
// not two goroutines: its second lease finds the first ticket held, by
// itself, and grows nothing, at any GOMAXPROCS.
func TestLeaseLinesNotForNestedLeasesOfOneGoroutine(t *testing.T) {
	for _, procs := range []int{2, 16} {
		atProcs(t, procs)
		tb, s := readySlot(t)
		for range 40 {
			_, outer, ok := tb.Lease(1)
			require.True(t, ok)
			_, inner, ok := tb.Lease(1)
			require.True(t, ok)
			_, err := s.EndLease(inner)
			require.NoError(t, err)
			_, err = s.EndLease(outer)
			require.NoError(t, err)
		}
		assert.Zero(t, shard.LeaseLines(s), "GOMAXPROCS %d: lines grown for one goroutine's nested leases", procs)
	}
}

// One goroutine leasing a value from two depths of its stack, 20 KiB or
// more apart, is one goroutine on one P: it grows nothing. Where hints come
// from the goroutine's g, both depths have one hint; where they come from
// the stack, a depth whose hint differs is found, and the leases from it
// still find the P the ticket records is this goroutine's.
func TestLeaseLinesNotForOneGoroutineAtTwoDepths(t *testing.T) {
	atProcs(t, 2)
	tb, s := readySlot(t)
	var hints [2]uint64
	lease := func(depth int) {
		_, tk, ok := tb.Lease(1)
		require.True(t, ok)
		hints[depth], _ = shard.Hint(tk)
		_, err := s.EndLease(tk)
		require.NoError(t, err)
	}
	depth := 20 << 10
	for ; ; depth += 8 << 10 {
		lease(0)
		atDepth(depth, func() { lease(1) })
		if shard.GoroutineHints {
			require.Equal(t, hints[0], hints[1], "one goroutine, two hints %d bytes apart", depth)
			break
		}
		if hints[0] != hints[1] {
			break
		}
		require.Less(t, depth, 200<<10, "no depth with a hint of its own")
	}
	for range 40 {
		lease(0)
		atDepth(depth, func() { lease(1) })
	}
	assert.Zero(t, shard.LeaseLines(s), "lines grown for one goroutine leasing from two depths")
}

// atDepth calls f with about n more bytes of the stack in use.
//
//go:noinline
func atDepth(n int, f func()) {
	var pad [1024]byte
	if n <= len(pad) {
		f()
		return
	}
	atDepth(n-len(pad), f)
	runtime.KeepAlive(&pad)
}

// Growth stays possible after GOMAXPROCS rises: leases that moved between
// goroutines while GOMAXPROCS was 1 (one core: nothing to grow for) do not
// use up the evidence, and the same value grows once its leases come from
// two Ps.
func TestLeaseLinesGrowAfterGOMAXPROCSRises(t *testing.T) {
	atProcs(t, 1)
	tb, s := readySlot(t)
	turns := make([]chan bool, 4)
	for i := range turns {
		turns[i] = make(chan bool)
	}
	var wg sync.WaitGroup
	for i := range turns {
		wg.Go(func() {
			for range turns[i] {
				_, tk, ok := tb.Lease(1)
				if !ok {
					t.Error("no lease of a ready value")
				} else if _, err := s.EndLease(tk); err != nil {
					t.Error(err)
				}
				turns[i] <- true
			}
		})
	}
	for round := range 30 * shard.GrowAfter {
		g := turns[round%len(turns)]
		g <- true
		<-g
	}
	for _, g := range turns {
		close(g)
	}
	wg.Wait()
	require.Zero(t, shard.LeaseLines(s), "lines grown at GOMAXPROCS 1")

	runtime.GOMAXPROCS(4)
	moves := 0
	takeTurnsTold(t, leaseAndEnd(t, tb, s), func(turn int) bool {
		if shard.LeaseLines(s) > 0 || turn > 100000 {
			return false
		}
		moves++
		return true
	})
	assert.NotZero(t, shard.LeaseLines(s), "no lines grown after %d moves between two Ps at GOMAXPROCS 4", moves)
}

// At GOMAXPROCS 1 there is no other core to keep a line from: a value
// leased by several goroutines at once grows no lines.
func TestLeaseLinesNotAtOneProc(t *testing.T) {
	atProcs(t, 1)
	_, s := readySlot(t)
	var held shard.Ticket
	var wg sync.WaitGroup
	wg.Go(func() {
		var ok bool
		held, ok = s.Lease(nil)
		require.True(t, ok)
	})
	wg.Wait()
	for range 4 * shard.GrowAfter {
		tk, ok := s.Lease(nil)
		require.True(t, ok)
		_, err := s.EndLease(tk)
		require.NoError(t, err)
	}
	assert.Zero(t, shard.LeaseLines(s), "lines grown at GOMAXPROCS 1")
	_, err := s.EndLease(held)
	require.NoError(t, err)
}

// A watch marks the lines too, and lines grown after a watch start marked:
// the end of a lease on a line reports that an eviction watched the value.
func TestWatchMarksLines(t *testing.T) {
	for _, growFirst := range []bool{true, false} {
		_, s := readySlot(t)
		if growFirst {
			shard.GrowLeaseLines(s)
			s.Watch(nil)
		} else {
			s.Watch(nil)
			shard.GrowLeaseLines(s)
		}
		tk, ok := s.Lease(nil)
		require.True(t, ok)
		require.True(t, shard.OnLine(s, tk))
		assert.False(t, shard.TryEnd[uint64](tk), "a watched ticket's lease ended on the fast path (grown first: %t)", growFirst)
		_, watched, err := s.EndWatchedLease(tk)
		require.NoError(t, err)
		assert.True(t, watched, "the end of a lease on a watched line did not say so (grown first: %t)", growFirst)
		tk, ok = s.Lease(nil)
		require.True(t, ok)
		assert.True(t, shard.TryEnd[uint64](tk), "the watch, served, still sends the next lease of the ticket to the slow path")
	}
}

// Lines are made only until Abandon: once it has run, no lease grows them,
// and a value abandoned while one lease grows them is released exactly
// once, after every lease, wherever the leases are.
func TestLeaseLinesAndAbandonRace(t *testing.T) {
	_, s := readySlot(t)
	assert.True(t, s.Abandon())
	shard.GrowLeaseLines(s)
	assert.Zero(t, shard.LeaseLines(s), "lines grown after Abandon")

	for range 300 {
		_, s := readySlot(t)
		var (
			wg       sync.WaitGroup
			releases atomic.Int32
			held     atomic.Int32
			early    atomic.Bool
		)
		first, ok := s.Lease(nil) // held: the others find it so, and grow the lines
		require.True(t, ok)
		held.Add(1)
		start := make(chan struct{})
		end := func(tk shard.Ticket) {
			held.Add(-1)
			last, err := s.EndLease(tk)
			if err != nil {
				panic(err)
			}
			if last {
				if held.Load() != 0 {
					early.Store(true)
				}
				releases.Add(1)
			}
		}
		for range 8 {
			wg.Go(func() {
				<-start
				for range shard.GrowAfter {
					tk, ok := s.Lease(nil)
					if !ok {
						return
					}
					held.Add(1)
					runtime.Gosched()
					end(tk)
				}
			})
		}
		wg.Go(func() {
			<-start
			runtime.Gosched()
			if s.Abandon() {
				if held.Load() != 0 {
					early.Store(true)
				}
				releases.Add(1)
			}
		})
		close(start)
		wg.Wait()
		end(first)
		require.EqualValues(t, 1, releases.Load(), "released exactly once")
		require.False(t, early.Load(), "released while leased")
	}
}
