package main

import (
	"fmt"
	"io"
	"time"

	"github.com/epcache/epcache/bench"
)

// A workload, for the progress lines, is one group's runs in one round of
// -count: every implementation of one spec. runAll reports every run to a
// tracker as it ends, a skipped one too, and the tracker says when a
// workload, and when a group's table, is complete.

// tracker counts the runs still to come, by group and by round.
type tracker struct {
	runsLeft, runsDone int
	workloads          int                       // in all rounds
	finished           int                       // workloads complete
	perRound           []map[string]int          // round → group key → runs left in it
	perGroup           map[string]int            // group key → runs left in all rounds
	results            map[string][]bench.Result // group key → its results so far
}

func newTracker(specs []bench.Spec, count int) *tracker {
	t := &tracker{perGroup: map[string]int{}, results: map[string][]bench.Result{}}
	for range count {
		round := map[string]int{}
		for _, s := range specs {
			k := groupKey(s)
			if round[k] == 0 {
				t.workloads++
			}
			round[k]++
			t.perGroup[k]++
			t.runsLeft++
		}
		t.perRound = append(t.perRound, round)
	}
	return t
}

// done records the end of a run of s in round (r holds its result if ran).
// It returns whether that run completed a workload of the round, and the
// group whose runs in every round are now all in (nil if none is).
func (t *tracker) done(round int, s bench.Spec, r bench.Result, ran bool) (workloadDone bool, table *group) {
	k := groupKey(s)
	t.runsLeft--
	t.runsDone++
	if ran {
		t.results[k] = append(t.results[k], r)
	}
	t.perRound[round][k]--
	if t.perRound[round][k] == 0 {
		t.finished++
		workloadDone = true
	}
	t.perGroup[k]--
	if t.perGroup[k] == 0 && len(t.results[k]) > 0 {
		if gs := groups(t.results[k]); len(gs) == 1 {
			table = &gs[0]
		}
	}
	return workloadDone, table
}

// progressLine is the line written on stderr, when it is not a terminal,
// as each workload completes: how many are done, which (and in which round
// of -count), the time since the first run began, and the time the runs
// left should take at the mean pace of those done.
func progressLine(t *tracker, round int, s bench.Spec, elapsed time.Duration) string {
	which := groupTitle(s)
	if n := len(t.perRound); n > 1 {
		which += fmt.Sprintf(", run %d of %d", round+1, n)
	}
	left := "all done"
	if t.runsLeft > 0 {
		est := time.Duration(float64(elapsed) / float64(t.runsDone) * float64(t.runsLeft))
		left = "about " + roundDur(est) + " left"
	}
	return fmt.Sprintf("epbench: %d/%d workloads done (%s): %s elapsed, %s\n", t.finished, t.workloads, which, roundDur(elapsed), left)
}

// roundDur is d to the second (to the tenth under ten seconds).
func roundDur(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// tableStream writes the table format as runs end: the pointer to the
// legend before the first table, each group's table when its last run
// ends, and the legend at the end.
type tableStream struct {
	w       io.Writer
	started bool
	err     error // the first error writing
}

func (ts *tableStream) table(g group) {
	if ts.err != nil {
		return
	}
	if !ts.started {
		ts.started = true
		if _, ts.err = fmt.Fprintln(ts.w, legendPointer); ts.err != nil {
			return
		}
	}
	ts.err = writeGroup(ts.w, g)
}

// end writes the legend, if any table was written, and returns the first
// error writing.
func (ts *tableStream) end() error {
	if ts.err == nil && ts.started {
		ts.err = writeLegendAfterTables(ts.w)
	}
	return ts.err
}
