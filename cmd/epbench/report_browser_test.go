package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/epcache/epcache/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The report in a real browser: a short epbench run writes a report, a
// headless Chromium opens it, and the check (reportcheck.js) finds every
// chart and table the report lists, drawn to size, with its labels rendered
// and none clipped by the chart's edge or on top of another label, and no
// error in the page's console. The same check is then shown to catch a
// chart removed, an SVG the browser cannot parse, and an SVG cut short.
//
// The browser is $EPBENCH_BROWSER, or the first of chromium-headless-shell,
// headless_shell and chromium on the PATH (Debian: apt-get install
// chromium-headless-shell); without one the test skips, unless
// EPBENCH_BROWSER names one, which .ci/run does. The screenshot goes to the
// test's artifact directory: keep it with
//
//	go test -run TestReportInBrowser -artifacts -outputdir /tmp/report ./cmd/epbench

//go:embed testdata/reportcheck.js
var reportCheckJS string

// findBrowser returns the headless Chromium to test with, or skips.
func findBrowser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("EPBENCH_BROWSER"); p != "" {
		path, err := exec.LookPath(p)
		require.NoError(t, err, "EPBENCH_BROWSER=%s names no browser", p)
		return path
	}
	for _, name := range []string{"chromium-headless-shell", "headless_shell", "chromium"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("no headless Chromium: install chromium-headless-shell (Debian: apt-get install chromium-headless-shell, or chromium), " +
		"or set EPBENCH_BROWSER to a Chromium binary; .ci/run installs one")
	return ""
}

// hang bounds a wait that only detects a hang: a test may wait this long
// for something that must happen, however slow or busy the machine, and
// fails only if it never does.
const hang = 2 * time.Minute

// startBrowser starts the browser for the test, closed at its end, and
// returns a context to open tabs from. The browser's profile is a
// temporary directory of chromedp's, not the test's: Chromium's child
// processes can outlive the browser and write into the profile for a
// while, and chromedp kills them before it removes the directory, while a
// test's TempDir would fail the test whenever one wrote there last.
func startBrowser(t *testing.T, exe string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		// The closed network refuses Google's hosts; a browser left to try
		// them misbehaves.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 1000),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	start, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(browser) }()
	select {
	case err := <-done:
		require.NoError(t, err, "starting %s", exe)
	case <-start.Done():
		t.Fatalf("%s did not start in %v", exe, hang)
	}
	return browser
}

// pageCheck is what reportcheck.js finds, with the console's errors.
type pageCheck struct {
	Problems []string `json:"problems"`
	Charts   int      `json:"charts"`
	Tables   int      `json:"tables"`
	Texts    int      `json:"texts"`
	Console  []string `json:"-"`
}

// all is every problem the check found, the console's errors included.
func (c pageCheck) all() []string { return append(append([]string{}, c.Problems...), c.Console...) }

// endOfCheck is what checkReport writes to the page's console once it has
// checked the page: the console's messages arrive in order, so every
// message the page wrote before it has arrived when it does.
const endOfCheck = "epbench: end of the report check"

// checkReport opens the report at path in a tab of browser, checks it, and
// returns a full-page screenshot (PNG).
func checkReport(t *testing.T, browser context.Context, path string) (pageCheck, []byte) {
	t.Helper()
	tab, cancel := chromedp.NewContext(browser)
	defer cancel()
	ctx, stop := context.WithTimeout(tab, hang)
	defer stop()
	// Subscribed before the page opens; read once it has been checked, up
	// to endOfCheck (the queue keeps every message until then).
	console := chromedp.Console(ctx)
	u := url.URL{Scheme: "file", Path: path}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u.String())), "opening %s", u.String())
	check, err := chromedp.Run(ctx, chromedp.Evaluate[pageCheck](reportCheckJS))
	require.NoError(t, err, "the check script")
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err, "the screenshot")
	require.NoError(t, chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`console.log(`+strconv.Quote(endOfCheck)+`)`)),
		"writing the end of the check to the console")
	for m, err := range console {
		require.NoError(t, err, "reading the console up to the end of the check")
		if m.Type == chromedp.ConsoleLog && m.Text == endOfCheck {
			break
		}
		if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException || m.Type == chromedp.ConsoleWarning {
			check.Console = append(check.Console, "console "+m.String())
		}
	}
	return check, shot
}

// writeBaseline writes a baseline for -compare in which epcache's ratio to
// syncmap in hit is a millionth of this run's, a ratio no run can hold to
// however its speed swings: the report must mark it.
func writeBaseline(t *testing.T, args []string) string {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), append(args, "-format", "json"), &out, &bytes.Buffer{}))
	var rs []bench.Result
	require.NoError(t, json.Unmarshal(out.Bytes(), &rs))
	for i := range rs {
		if rs[i].Impl == "syncmap" {
			rs[i].NsPerOp *= 1e6
		}
	}
	return baselineFile(t, rs)
}

func TestReportInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs epbench and a browser")
	}
	exe := findBrowser(t)
	dir := t.TempDir()

	// A run with every kind of chart: hit with both key types (the array
	// runs only one), storm and its latency, lease, hotset, GOMAXPROCS 1
	// and 2 for the scaling charts, and one chart of the report's own
	// (churn); -compare with a baseline that one ratio fails.
	args := []string{"-workload", "hit,storm,churn,lease,hotset", "-impl", "epcache,syncmap,array,pool",
		"-keys", "uint64,string", "-peers", "32", "-goroutines", "2", "-procs", "1,2", "-duration", "5ms",
		"-cost", "sleep:20us", "-cap", "8", "-idle", "0"}
	baseline := writeBaseline(t, []string{"-workload", "hit", "-impl", "epcache,syncmap", "-keys", "uint64",
		"-peers", "32", "-goroutines", "2", "-procs", "1,2", "-duration", "5ms"})
	defer func(f []string) { chartFormats = f }(chartFormats)
	chartFormats = []string{"svg"} // the report alone is checked; PNGs are slow under -race
	out := filepath.Join(dir, "report")
	err := run(context.Background(), append(slices.Clone(args), "-out", out, "-compare", baseline), &bytes.Buffer{}, &bytes.Buffer{})
	require.ErrorContains(t, err, "worse than the baseline", "the doctored baseline fails a ratio")
	report := filepath.Join(out, "index.html")
	html, err := os.ReadFile(report)
	require.NoError(t, err)
	assert.Contains(t, string(html), "WORSE")

	browser := startBrowser(t, exe)
	t.Run("generated", func(t *testing.T) {
		start := time.Now()
		check, shot := checkReport(t, browser, report)
		t.Logf("%d charts, %d tables, %d chart labels checked in %v", check.Charts, check.Tables, check.Texts, time.Since(start).Round(time.Millisecond))
		assert.Empty(t, check.all(), "the report as written")
		assert.GreaterOrEqual(t, check.Charts, 10, "throughput, storm, latency, lease, hotset and hotset-hits, scaling, churn's own")
		shotPath := filepath.Join(t.ArtifactDir(), "report.png")
		require.NoError(t, os.WriteFile(shotPath, shot, 0o644))
		t.Logf("screenshot: %s (%d bytes)", shotPath, len(shot))
	})

	// Each breakage, in a copy of the report, must be reported.
	svgs := regexp.MustCompile(`(?s)<svg .*?</svg>`)
	for _, tc := range []struct {
		name   string
		damage func(string) string
		want   string
	}{
		{"chart removed", func(s string) string {
			i := svgs.FindStringIndex(s)
			return s[:i[0]] + s[i[1]:]
		}, "0 <svg> elements"},
		{"path the browser cannot parse", func(s string) string {
			return strings.Replace(s, `<path d="M`, `<path d="M NaN`, 1)
		}, "console error"},
		{"svg cut short", func(s string) string {
			loc := svgs.FindAllStringIndex(s, 2)[1]
			return s[:(loc[0]+loc[1])/2] + s[loc[1]:] // the second chart loses its second half
		}, "not rendered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := filepath.Join(t.TempDir(), "index.html")
			require.NoError(t, os.WriteFile(broken, []byte(tc.damage(string(html))), 0o644))
			check, _ := checkReport(t, browser, broken)
			problems := check.all()
			require.NotEmpty(t, problems, "the check passed a broken report")
			assert.True(t, strings.Contains(strings.Join(problems, "\n"), tc.want), "want a problem with %q; got\n%s", tc.want, strings.Join(problems, "\n"))
			t.Logf("found: %s", strings.Join(problems, "; "))
		})
	}
}
