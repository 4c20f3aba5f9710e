package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinyRun is a custom run of two workloads, three implementations each,
// short enough for a test.
var tinyRun = []string{"-workload", "hit,storm", "-impl", "epcache,syncmap,array", "-keys", "uint64",
	"-peers", "64", "-duration", "10ms", "-cost", "sleep:100us"}

var progressRE = regexp.MustCompile(`^epbench: (\d+)/(\d+) workloads done \(([^),]+)(, run (\d+) of (\d+))?\): \S+ elapsed, (about \S+ left|all done)$`)

// With stderr a pipe (no terminal), every workload that completes writes
// one progress line there: a count, the workload, the time elapsed and
// the time left; the last says all is done.
func TestProgressLinesWhenStderrIsAPipe(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	var lines []string
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
	}()
	var stdout bytes.Buffer
	err = run(context.Background(), append(tinyRun, "-count", "2"), &stdout, w)
	require.NoError(t, w.Close())
	<-read
	require.NoError(t, err, strings.Join(lines, "\n"))

	require.Len(t, lines, 4, "two workloads, two rounds:\n%s", strings.Join(lines, "\n"))
	for i, l := range lines {
		m := progressRE.FindStringSubmatch(l)
		require.NotNil(t, m, "a progress line: %q", l)
		assert.Equal(t, []string{strconv.Itoa(i + 1), "4"}, m[1:3], l)
		assert.Equal(t, strconv.Itoa(i/2+1), m[5], "the round: %s", l)
		if i < len(lines)-1 {
			assert.True(t, strings.HasPrefix(m[7], "about "), l)
		} else {
			assert.Equal(t, "all done", m[7], l)
		}
	}
	assert.Contains(t, lines[0], "Hit/keys=uint64/dist=uniform/peers=64/goroutines=")
	assert.Contains(t, lines[1], "Storm/keys=uint64/peers=64/goroutines=64/cost=sleep:100us")
	assert.NotContains(t, strings.Join(lines, "\n"), "\r", "no progress bar off a terminal")
}

// syncBuffer is stdout and stderr in one, as 2>&1 makes them.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// Each workload's table is written as its last run ends, before the next
// workload runs: with stdout and stderr in one stream, each table comes
// before its workload's progress line, and the next table after it. The
// pointer to the legend comes first, the legend last.
func TestTablesAreWrittenAsEachWorkloadEnds(t *testing.T) {
	var out syncBuffer
	require.NoError(t, run(context.Background(), tinyRun, &out, &out))
	text := out.b.String()
	at := func(s string) int {
		i := strings.Index(text, s)
		require.GreaterOrEqual(t, i, 0, "%q in:\n%s", s, text)
		return i
	}
	pointer, hitTable, hitDone := at(legendPointer), at("\nHit/keys=uint64"), at("epbench: 1/2 workloads done (Hit/")
	stormTable, stormDone, legendAt := at("\nStorm/keys=uint64"), at("epbench: 2/2 workloads done (Storm/"), at("\nColumns:\n")
	assert.True(t, pointer < hitTable && hitTable < hitDone && hitDone < stormTable && stormTable < stormDone && stormDone < legendAt,
		"pointer, hit's table, its progress line, storm's table, its line, the legend:\n%s", text)
}

// With -count, a group's table waits for its runs in every round; a
// workload is done, for the progress lines, at the end of each round's
// runs of it. A spec no implementation can run (array with string keys)
// still counts as run.
func TestTrackerCompletesGroupsAndWorkloads(t *testing.T) {
	spec := func(workload, impl, keys string) bench.Spec {
		return bench.Spec{Workload: workload, Impl: impl, Keys: keys, Dist: "uniform", Peers: 64, Procs: 2}
	}
	specs := []bench.Spec{spec("hit", "epcache", "string"), spec("hit", "array", "string"), spec("storm", "epcache", "uint64")}
	tr := newTracker(specs, 2)
	assert.Equal(t, 4, tr.workloads)
	type step struct {
		workloadDone, table bool
	}
	var got []step
	for round := range 2 {
		for _, s := range specs {
			ran := s.Impl != "array"
			done, table := tr.done(round, s, bench.Result{Spec: s}, ran)
			got = append(got, step{done, table != nil})
			if table != nil {
				assert.Len(t, table.results, 2, "both rounds' runs of %s", s.Workload)
			}
		}
	}
	assert.Equal(t, []step{{false, false}, {true, false}, {true, false}, {false, false}, {true, true}, {true, true}}, got)
	assert.Equal(t, 4, tr.finished)
}

// The time left is the mean time of the runs done so far times the runs
// left: a clock given, so the figures do not depend on the machine.
func TestProgressLineEstimatesTheTimeLeft(t *testing.T) {
	s := bench.Spec{Workload: "hit", Impl: "epcache", Keys: "uint64", Dist: "uniform", Peers: 64, Goroutines: 2, Procs: 2}
	other := s
	other.Impl = "syncmap"
	tr := newTracker([]bench.Spec{s, other}, 2) // 4 runs, 2 workloads
	tr.done(0, s, bench.Result{}, true)
	tr.done(0, other, bench.Result{}, true)
	assert.Equal(t, "epbench: 1/2 workloads done (Hit/keys=uint64/dist=uniform/peers=64/goroutines=2, run 1 of 2): 20s elapsed, about 20s left\n",
		progressLine(tr, 0, s, 20*time.Second))
	tr.done(1, s, bench.Result{}, true)
	tr.done(1, other, bench.Result{}, true)
	assert.Equal(t, "epbench: 2/2 workloads done (Hit/keys=uint64/dist=uniform/peers=64/goroutines=2, run 2 of 2): 41s elapsed, all done\n",
		progressLine(tr, 1, s, 41*time.Second))
	assert.Equal(t, "1.5s", roundDur(1520*time.Millisecond))
	assert.Equal(t, "1m30s", roundDur(90*time.Second+400*time.Millisecond))
}
