package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// announcer is a stderr that tells, once, the debug page's URL epbench
// writes there.
type announcer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	url  chan string
	sent bool
}

var debugLine = regexp.MustCompile(`epbench: debug page at (http://\S+)\n`)

func (a *announcer) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.buf.Write(p)
	if m := debugLine.FindSubmatch(a.buf.Bytes()); m != nil && !a.sent {
		a.sent = true
		a.url <- string(m[1])
	}
	return len(p), nil
}

// debugPage mirrors the part of the page's JSON the test reads.
type debugPage struct {
	Sources []struct {
		Name  string `json:"name"`
		Peers *struct {
			Total   int            `json:"total"`
			ByState map[string]int `json:"by_state"`
		} `json:"peers"`
	} `json:"sources"`
}

// get fetches url, with a limit that only detects a hang.
func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

// -debug serves the debug page while the runs go on: a hit run that
// measures until the test ends it shows its cache, all 64 peers ready,
// in JSON and HTML; / leads to the page; the page is gone once the run is.
func TestDebugFlagServesThePage(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &announcer{url: make(chan string, 1)}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-workload", "hit", "-impl", "epcache", "-keys", "uint64", "-peers", "64",
			"-goroutines", "1", "-duration", "1h", "-debug", "127.0.0.1:0"}, io.Discard, stderr)
	}()
	var url string
	select {
	case url = <-stderr.url:
	case err := <-done:
		t.Fatalf("run returned before serving the page: %v", err)
	case <-time.After(hang):
		t.Fatal("no debug page announced")
	}
	require.True(t, strings.HasSuffix(url, debugPath), url)

	// The cache appears once the run has built it, and all its peers are
	// ready once the run has filled it: poll, bounded only by hang.
	const name = "Hit/impl=epcache/keys=uint64/dist=uniform/peers=64/goroutines=1/cache=1"
	deadline := time.Now().Add(hang)
	for {
		resp, body := get(t, url+"?format=json")
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		var p debugPage
		require.NoError(t, json.Unmarshal(body, &p))
		if len(p.Sources) == 1 && p.Sources[0].Peers != nil && p.Sources[0].Peers.ByState["ready"] == 64 {
			assert.Equal(t, name, p.Sources[0].Name)
			assert.Equal(t, 64, p.Sources[0].Peers.Total)
			break
		}
		require.True(t, time.Now().Before(deadline), "the page never showed 64 ready peers: %s", body)
		time.Sleep(10 * time.Millisecond)
	}
	resp, body := get(t, url)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, string(body), name)
	assert.Contains(t, string(body), `<tr class="peer ready">`)
	resp, body = get(t, strings.TrimSuffix(url, debugPath)+"/")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "/ redirects to the page")
	assert.Contains(t, string(body), "epcache: peers and totals")

	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(hang):
		t.Fatal("the run did not end when cancelled")
	}
	_, err := http.Get(url)
	assert.Error(t, err, "the page is gone with the run")
}

// An address -debug cannot listen on is an error before any run.
func TestDebugFlagRefusesABadAddress(t *testing.T) {
	err := run(context.Background(), []string{"-workload", "hit", "-impl", "epcache", "-peers", "8", "-duration", "1ms",
		"-debug", "127.0.0.1:99999"}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-debug 127.0.0.1:99999")
}
