package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every column of every kind of table has a legend entry with a meaning,
// and the legend explains it after the tables, in epbench -h, and in
// BENCHMARKS.md. The headings are read from tables as written, so a column
// added to a table without its entry fails here.
func TestEveryColumnHasALegendEntry(t *testing.T) {
	known := map[string]column{}
	for _, c := range legend {
		assert.NotEmpty(t, c.meaning, c.head)
		assert.NotContains(t, known, c.head, "one entry per heading")
		known[c.head] = c
	}
	storm := result("storm", "epcache", 0)
	hot := result("hotset", "epcache", 1200)
	hot.Dist, hot.Zipf, hot.Peers, hot.Cap, hot.Cost = "zipf", 1.01, 100_000, 1000, "sleep:100us"
	mesh := result("tcpstorm", "epcache", 0)
	mesh.FDsBefore, mesh.FDsAfter = 9, 9
	var out bytes.Buffer
	require.NoError(t, writeTable(&out, []bench.Result{result("hit", "epcache", 3), storm, hot, mesh}))

	var heads []string
	lines := strings.Split(out.String(), "\n")
	for i, l := range lines {
		if i > 0 && strings.Contains(lines[i-1], "GOMAXPROCS=") {
			// The last heading, status, is left-aligned: one space may
			// be all that parts it from the one before.
			require.True(t, strings.HasSuffix(l, " status"), "a heading line: %q", l)
			fields := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(strings.TrimSuffix(l, " status")), -1)
			require.Greater(t, len(fields), 10, "a heading line: %q", l)
			heads = append(heads, append(fields, "status")...)
		}
	}
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(heads))), len(legend), "every legend entry heads some table")

	var help bytes.Buffer
	run(context.Background(), []string{"-h"}, io.Discard, &help)
	docs, err := os.ReadFile("../../BENCHMARKS.md")
	require.NoError(t, err)
	legendText := out.String()[strings.Index(out.String(), "\nColumns:\n"):]
	for _, h := range heads {
		c, ok := known[h]
		if !assert.True(t, ok, "column %q has no legend entry", h) {
			continue
		}
		assert.Regexp(t, `(?m)^  `+regexp.QuoteMeta(h)+`\s`, legendText, "the legend after the tables explains %q", h)
		assert.Regexp(t, `(?m)^  `+regexp.QuoteMeta(h)+`\s`, help.String(), "epbench -h explains %q", h)
		assert.True(t, strings.Contains(string(docs), "- `"+h+"`: "+c.meaning+"\n"), "BENCHMARKS.md explains %q as the legend does", h)
	}
	assert.True(t, strings.Contains(string(docs), legendMarkdown()),
		"BENCHMARKS.md explains the columns as the legend does: internal/resultsdoc's columnsDoc should hold\n%s", legendMarkdown())
	assert.Contains(t, out.String(), "(fds ", "tcpstorm's status")
}

// legendMarkdown is the legend as BENCHMARKS.md gives it.
func legendMarkdown() string {
	var b strings.Builder
	b.WriteString(titleMeaning + "\n\n")
	for _, c := range legend {
		b.WriteString("- `" + c.head + "`: " + c.meaning + "\n")
	}
	return b.String()
}
