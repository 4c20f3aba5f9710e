package main

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/epcache/epcache/bench"
)

// column is one column of the table format: its heading, what it means, and
// how a row's cell is written. The headings and the legend come from the
// same list, so that no column prints without its meaning.
type column struct {
	head    string
	meaning string
	cell    func(r bench.Result, t tableInfo) string
}

// tableInfo is what a cell needs beside its row: the table's reference
// (the median of epcache's headline figures, 0 if epcache did not run).
type tableInfo struct {
	spec bench.Spec
	ref  float64
}

// titleMeaning explains the line above each table.
const titleMeaning = "The line above each table names the spec its rows ran: the workload and its shape (keys, dist, peers, goroutines, then churn, reads, rtt, ctx and the like where they apply), GOMAXPROCS, and the creation cost model (-cost) where the run creates while it measures."

var (
	colImpl = column{"impl", "the implementation measured: epcache or a comparator (-impl lists them).",
		func(r bench.Result, _ tableInfo) string { return r.Impl }}
	colOpsPerSec = column{"ops/s", "operations per second in the measured phase, all goroutines together.",
		func(r bench.Result, _ tableInfo) string { return si(r.OpsPerSec) }}
	colNsPerOp = column{"ns/op", "the measured phase's wall time over its operations (1e9 / ops/s); smaller is better.",
		func(r bench.Result, _ tableInfo) string {
			if r.Workload == "hotset" {
				return fmt.Sprintf("%.0f", r.NsPerOp)
			}
			return fmt.Sprintf("%.2f", r.NsPerOp)
		}}
	colComplete = column{"complete", "storm, flaky and tcpstorm, in place of ns/op: the time until every goroutine had every peer; smaller is better.",
		func(r bench.Result, _ tableInfo) string { return dur(r.Completion) }}
	colRatio = column{"×epcache", "this row's ns/op (or complete) over epcache's in the same table, over the median of epcache's runs with -count: below 1 is faster than epcache; - when epcache did not run.",
		func(r bench.Result, t tableInfo) string {
			if t.ref <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", headline(r)/t.ref)
		}}
	colP50 = column{"p50", "the median latency of one operation: every operation is timed in storm, flaky, tcpstorm and hotset, one in 64 in hit, churn, mixed and lease.",
		func(r bench.Result, _ tableInfo) string { return dur(r.P50) }}
	colP99 = column{"p99", "the 99th percentile of the same latencies.",
		func(r bench.Result, _ tableInfo) string { return dur(r.P99) }}
	colP999 = column{"p99.9", "the 99.9th percentile of the same latencies.",
		func(r bench.Result, _ tableInfo) string { return dur(r.P999) }}
	colMax = column{"max", "the slowest of the operations timed.",
		func(r bench.Result, _ tableInfo) string { return dur(r.Max) }}
	colAllocs = column{"allocs/op", "heap allocations in the measured phase over its operations.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprintf("%.2f", r.AllocsPerOp) }}
	colBytesPerEntry = column{"B/entry", "hit only: what the heap grew by while the cache was filled, less the endpoints themselves, per peer; - in the other workloads, which do not measure it.",
		func(r bench.Result, _ tableInfo) string {
			if r.BytesPerEntry == 0 {
				return "-"
			}
			return fmt.Sprintf("%.0f", r.BytesPerEntry)
		}}
	colCreates = column{"creates", "endpoints created in the whole run, the fill before the measured phase included.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprint(r.Creates) }}
	colDup = column{"dup", "duplicates: creations beyond one per peer and one per invalidation of it. 0 for every comparator that creates once per key, which all do but syncmap, otter and lru.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprint(r.Duplicates) }}
	colLeaked = column{"leaked", "endpoints created and not released once the cache was closed (creates minus releases); any but 0 fails the run.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprint(r.Leaked) }}
	colOverlap = column{"overlap", "the most creations of one peer in flight at once: 1 for a comparator that creates once per key.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprint(r.Overlap) }}
	colCreate = column{"create", "the measured mean time of one creation attempt made in the measured phase; - when the workload creates nothing while it measures (hit, and churn, mixed and lease with nothing invalidated).",
		func(r bench.Result, t tableInfo) string {
			if !t.spec.MeasuresCreation() {
				return "-"
			}
			return dur(r.MeanCreate)
		}}
	colHitRatio = column{"hit ratio", "hotset: the share of operations that created nothing: one minus creations over operations, duplicates and reloads counted as creations.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprintf("%.2f%%", 100*r.HitRatio) }}
	colPeakLive = column{"peak live", "hotset: the most endpoints alive at once, from the start of a creation until its release returns.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprint(r.PeakLive) }}
	colOvershoot = column{"overshoot", "hotset: peak live minus the cap (-cap): positive past the cap, negative below it.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprintf("%+d", r.Overshoot()) }}
	colInUse = column{"in-use releases", "hotset: releases of an endpoint while a lease was using it, the fault leases prevent.",
		func(r bench.Result, _ tableInfo) string { return fmt.Sprint(r.ReleasedInUse) }}
	// status is the last column, left-aligned (the space before its
	// cells keeps tabwriter's right alignment off them).
	colStatus = column{"status", "ok, or FAIL and why: a leak, a double release, a wrong answer, a broken exactly-once promise. tcpstorm adds (fds A→B), the open file descriptors before the run and after its Close.",
		func(r bench.Result, _ tableInfo) string {
			status := " ok"
			if r.Failure != "" {
				status = " FAIL: " + r.Failure
			}
			if r.FDsBefore > 0 {
				status += fmt.Sprintf(" (fds %d→%d)", r.FDsBefore, r.FDsAfter)
			}
			return status
		}}
)

// The tables' columns, by kind of workload.
var (
	steadyColumns = []column{colImpl, colOpsPerSec, colNsPerOp, colRatio, colP50, colP99, colP999, colMax, colAllocs,
		colBytesPerEntry, colCreates, colDup, colLeaked, colOverlap, colCreate, colStatus}
	stormColumns = []column{colImpl, colOpsPerSec, colComplete, colRatio, colP50, colP99, colP999, colMax, colAllocs,
		colBytesPerEntry, colCreates, colDup, colLeaked, colOverlap, colCreate, colStatus}
	hotsetColumns = []column{colImpl, colOpsPerSec, colNsPerOp, colRatio, colP50, colP99, colP999, colMax,
		colHitRatio, colCreates, colPeakLive, colOvershoot, colInUse, colLeaked, colOverlap, colCreate, colStatus}
)

// columnsOf returns the columns of s's table.
func columnsOf(s bench.Spec) []column {
	switch {
	case s.Workload == "hotset":
		return hotsetColumns
	case s.IsStorm():
		return stormColumns
	}
	return steadyColumns
}

// legend is every column of every kind of table, in the order the legend
// explains them.
var legend = []column{colImpl, colOpsPerSec, colNsPerOp, colComplete, colRatio, colP50, colP99, colP999, colMax,
	colAllocs, colBytesPerEntry, colCreates, colDup, colLeaked, colOverlap, colCreate,
	colHitRatio, colPeakLive, colOvershoot, colInUse, colStatus}

// legendPointer is the line the table format opens with.
const legendPointer = "The columns are explained after the last table, by epbench -h, and in BENCHMARKS.md (\"Columns of epbench's tables\")."

// writeLegend writes what each column means, as the table format ends and
// in epbench -h: a heading, then each column's meaning wrapped beside it.
func writeLegend(w io.Writer) error {
	const indent, width = 20, 78
	var b strings.Builder
	b.WriteString("Columns:\n")
	b.WriteString(wrap(titleMeaning, 2, width, ""))
	for _, c := range legend {
		b.WriteString(wrap(c.meaning, indent, width, "  "+c.head))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// wrap fills text into lines of at most width (a word longer than a line
// goes on one of its own), each indented by indent; the first line starts
// with head, padded to indent, or on a line of its own if head is longer.
func wrap(text string, indent, width int, head string) string {
	var b strings.Builder
	line := head
	if utf8.RuneCountInString(head) >= indent-1 {
		b.WriteString(head + "\n")
		line = ""
	}
	pad := func() {
		if n := indent - utf8.RuneCountInString(line); n > 0 {
			line += strings.Repeat(" ", n)
		}
	}
	pad()
	fresh := true
	for _, word := range strings.Fields(text) {
		if !fresh && utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) > width {
			b.WriteString(line + "\n")
			line = ""
			pad()
			fresh = true
		}
		if !fresh {
			line += " "
		}
		line += word
		fresh = false
	}
	b.WriteString(line + "\n")
	return b.String()
}
