package dskitbench

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// Table is one scenario's result: a row per pool, side by side.
type Table struct {
	Scenario string     `json:"scenario"`
	Title    string     `json:"title"`
	Columns  []string   `json:"columns"`
	Rows     [][]string `json:"rows"`
	Notes    []string   `json:"notes,omitempty"`
	// Data holds the figures behind the rows, by pool, for JSON readers.
	Data    map[string]map[string]float64 `json:"data"`
	Elapsed string                        `json:"elapsed"`
}

func newTable(scenario, title string, columns ...string) *Table {
	return &Table{Scenario: scenario, Title: title, Columns: columns, Data: map[string]map[string]float64{}}
}

// row adds a row: cells as shown, and figures for JSON.
func (t *Table) row(pool string, figures map[string]float64, cells ...string) {
	t.Rows = append(t.Rows, append([]string{pool}, cells...))
	t.Data[pool] = figures
}

func (t *Table) note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

// Write prints t as an aligned text table.
func (t *Table) Write(w io.Writer) {
	fmt.Fprintf(w, "== %s. %s (%s)\n", t.Scenario, t.Title, t.Elapsed)
	cols := append([]string{"pool"}, t.Columns...)
	width := make([]int, len(cols))
	for i, c := range cols {
		width[i] = len(c)
	}
	for _, r := range t.Rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", width[i], c)
			} else {
				fmt.Fprintf(&b, "  %*s", width[i], c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(cols)
	for _, r := range t.Rows {
		line(r)
	}
	for _, n := range t.Notes {
		fmt.Fprintf(w, "  - %s\n", n)
	}
	fmt.Fprintln(w)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

func msf(d time.Duration) float64 { return float64(d) / 1e6 }

func itoa[T ~int | ~int64 | ~uint64](v T) string { return fmt.Sprint(v) }

// quantile returns the q-quantile of ds (sorted in place), 0 if empty.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(i, 0)]
}
