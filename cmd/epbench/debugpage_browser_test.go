package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/observe/debugpage"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The debug page in a real browser: a headless Chromium opens the page of
// a cache the test put in every state, and the check
// (debugpagecheck.js) finds a row of each state drawn with its badge, the
// failure's error, the totals and the latency table, nothing wider than
// the window, and no error in the console. The same check is then shown to
// catch states missing (a page filtered to ready peers).
//
// The browser is found as for TestReportInBrowser. With EPBENCH_SCREENSHOT
// set to a directory, the screenshot goes there as debugpage.png (as
// results/debugpage.png was made):
//
//	EPBENCH_SCREENSHOT=$PWD/results go test -run TestDebugPageInBrowser ./cmd/epbench
//
// and to the test's artifact directory otherwise (-artifacts).

//go:embed testdata/debugpagecheck.js
var debugPageCheckJS string

// debugCheck is what debugpagecheck.js finds, with the console's errors.
type debugCheck struct {
	Problems []string       `json:"problems"`
	Rows     map[string]int `json:"rows"`
	Console  []string       `json:"-"`
}

func (c debugCheck) all() []string { return append(append([]string{}, c.Problems...), c.Console...) }

// errRefused is the remembered failure the page shows.
var errRefused = errors.New("dial tcp 10.0.7.12:7000: connect: connection refused")

// stormCache is a cache of connections to peers in every state the page
// shows, as a storm leaves one: peers 00 to 07 ready (some leased), 08
// creating with callers waiting, 09 failed (remembered for a minute), 10
// lingering (a lease holds it after Invalidate), 11 straggling (an Offer
// answered its creation, which still runs). The function it returns lets
// the creations return, ends the leases and closes the cache.
func stormCache(t *testing.T) (*epcache.Cache[string, int], func()) {
	t.Helper()
	proceed := make(chan struct{})
	started := make(chan struct{}, 2)
	c, err := epcache.New(epcache.Config[string, int]{
		MaxEntries: 64,
		ErrorTTL:   time.Minute,
		Create: func(_ context.Context, key string) (int, error) {
			n, _ := strconv.Atoi(key[len("peer-"):])
			switch n {
			case 8, 11:
				started <- struct{}{}
				<-proceed
			case 9:
				return 0, errRefused
			default:
				time.Sleep(time.Duration(n+1) * 200 * time.Microsecond) // a dial, of sorts
			}
			return n, nil
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	peer := func(n int) string { return fmt.Sprintf("peer-%02d", n) }
	var leases []epcache.Lease[string, int]
	for n := range 8 {
		_, err := c.Get(ctx, peer(n))
		require.NoError(t, err)
		if n%3 == 0 {
			l, err := c.Acquire(ctx, peer(n))
			require.NoError(t, err)
			leases = append(leases, l)
		}
	}
	var waiting []<-chan error
	get := func(key string) {
		done := make(chan error, 1)
		go func() {
			_, err := c.Get(ctx, key)
			done <- err
		}()
		waiting = append(waiting, done)
	}
	get(peer(8))
	<-started
	get(peer(8))
	get(peer(8))
	_, err = c.Get(ctx, peer(9))
	require.ErrorIs(t, err, errRefused)
	l, err := c.Acquire(ctx, peer(10))
	require.NoError(t, err)
	leases = append(leases, l)
	require.True(t, c.Invalidate(peer(10)))
	get(peer(11))
	<-started
	require.True(t, c.Offer(peer(11), 11))
	require.NoError(t, <-waiting[len(waiting)-1])
	waiting = waiting[:len(waiting)-1]
	require.True(t, c.Invalidate(peer(11)))
	// The two Gets of peer 08 after the first wait for its creation by
	// the time the page is drawn: the screenshot shows them.
	for deadline := time.Now().Add(hang); ; time.Sleep(time.Millisecond) {
		n := 0
		for p := range c.Peers() {
			n += p.Waiting
		}
		if n == 3 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the Gets of peer-08 never waited")
	}
	return c, func() {
		close(proceed)
		for _, done := range waiting {
			assert.NoError(t, <-done)
		}
		for _, l := range leases {
			l.Release()
		}
		assert.NoError(t, c.Close())
		cancel()
	}
}

// checkDebugPage opens url in a tab of browser, checks it for the states
// given, and returns a full-page screenshot (PNG).
func checkDebugPage(t *testing.T, browser context.Context, url string, states ...string) (debugCheck, []byte) {
	t.Helper()
	tab, cancel := chromedp.NewContext(browser)
	defer cancel()
	ctx, stop := context.WithTimeout(tab, hang)
	defer stop()
	console := chromedp.Console(ctx)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url)), "opening %s", url)
	wants, err := json.Marshal(states)
	require.NoError(t, err)
	script := "window.wantStates = " + string(wants) + "; window.wantError = " + strconv.Quote(errRefused.Error()) + ";\n" + debugPageCheckJS
	check, err := chromedp.Run(ctx, chromedp.Evaluate[debugCheck](script))
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

func TestDebugPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a browser")
	}
	exe := findBrowser(t)
	c, end := stormCache(t)
	defer end()
	page := debugpage.New()
	require.NoError(t, debugpage.Add(page, "tcp endpoints", c))
	srv := httptest.NewServer(page)
	defer srv.Close()

	browser := startBrowser(t, exe)
	states := []string{"ready", "creating", "failed", "straggling", "lingering"}
	check, shot := checkDebugPage(t, browser, srv.URL+"/", states...)
	assert.Empty(t, check.all(), "the page as served")
	assert.Equal(t, map[string]int{"ready": 8, "creating": 1, "failed": 1, "straggling": 1, "lingering": 1}, check.Rows)
	dir := t.ArtifactDir()
	if d := os.Getenv("EPBENCH_SCREENSHOT"); d != "" {
		dir = d
	}
	shotPath := filepath.Join(dir, "debugpage.png")
	require.NoError(t, os.WriteFile(shotPath, shot, 0o644))
	t.Logf("screenshot: %s (%d bytes)", shotPath, len(shot))

	// The check is not vacuous: a page of ready peers only lacks the rest.
	check, _ = checkDebugPage(t, browser, srv.URL+"/?state=ready", states...)
	assert.ElementsMatch(t, []string{"no creating row", "no failed row", "no straggling row", "no lingering row"}, check.all())
}
