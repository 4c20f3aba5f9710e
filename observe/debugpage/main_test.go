package debugpage_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// cache a test makes is closed, every request has returned.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// hang bounds a wait that only detects a hang: a test may wait this long
// for something that must happen, however slow or busy the machine, and
// fails only if it never does.
const hang = 2 * time.Minute

// page, source, stats, hist, peers and peer mirror the JSON page.
type page struct {
	Time    time.Time `json:"time"`
	Sort    string    `json:"sort"`
	Order   string    `json:"order"`
	States  []string  `json:"states"`
	Key     string    `json:"key"`
	Offset  int       `json:"offset"`
	Limit   int       `json:"limit"`
	Sources []source  `json:"sources"`
}

type source struct {
	Name     string             `json:"name"`
	Error    string             `json:"error"`
	Stats    *stats             `json:"stats"`
	Peers    *peers             `json:"peers"`
	Counters map[string]float64 `json:"counters"`
}

type stats struct {
	Creates       uint64          `json:"creates"`
	CreateErrors  uint64          `json:"create_errors"`
	Attempts      uint64          `json:"attempts"`
	Waits         uint64          `json:"waits"`
	Cancels       uint64          `json:"cancels"`
	ErrorHits     uint64          `json:"error_hits"`
	Releases      uint64          `json:"releases"`
	ReleasePanics uint64          `json:"release_panics"`
	Offers        uint64          `json:"offers"`
	Evictions     uint64          `json:"evictions"`
	IdleRemovals  uint64          `json:"idle_removals"`
	RoomWaits     uint64          `json:"room_waits"`
	Room          int64           `json:"room"`
	Live          int64           `json:"live"`
	Ready         int64           `json:"ready"`
	Lingering     int64           `json:"lingering"`
	CreateLatency map[string]hist `json:"create_latency"`
	RoomWait      hist            `json:"room_wait"`
}

type hist struct {
	Count       uint64   `json:"count"`
	SumSeconds  float64  `json:"sum_seconds"`
	MeanSeconds float64  `json:"mean_seconds"`
	P50Seconds  *float64 `json:"p50_seconds"`
	P90Seconds  *float64 `json:"p90_seconds"`
	P99Seconds  *float64 `json:"p99_seconds"`
}

type peers struct {
	Total   int            `json:"total"`
	ByState map[string]int `json:"by_state"`
	Leases  int            `json:"leases"`
	Waiting int            `json:"waiting"`
	Matched int            `json:"matched"`
	Offset  int            `json:"offset"`
	Shown   int            `json:"shown"`
	Items   []peer         `json:"items"`
}

type peer struct {
	Key            string    `json:"key"`
	State          string    `json:"state"`
	Since          time.Time `json:"since"`
	AgeSeconds     float64   `json:"age_seconds"`
	IdleSeconds    float64   `json:"idle_seconds"`
	Leases         int       `json:"leases"`
	Waiting        int       `json:"waiting"`
	Error          string    `json:"error"`
	Until          time.Time `json:"until"`
	ExpiresSeconds float64   `json:"expires_seconds"`
}

// serve answers a GET of query from h, without a socket (so that it runs
// inside a synctest bubble).
func serve(h http.Handler, query string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/epcache/"+query, nil))
	return w
}

// getJSON returns h's page for query (format=json is added).
func getJSON(t *testing.T, h http.Handler, query string) page {
	t.Helper()
	if query == "" {
		query = "?format=json"
	} else {
		query += "&format=json"
	}
	w := serve(h, query)
	require.Equal(t, http.StatusOK, w.Code, "%s: %s", query, w.Body)
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	var p page
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), "%s", w.Body)
	return p
}

// getHTML returns h's HTML page for query.
func getHTML(t *testing.T, h http.Handler, query string) string {
	t.Helper()
	w := serve(h, query)
	require.Equal(t, http.StatusOK, w.Code, "%s: %s", query, w.Body)
	require.Equal(t, "text/html; charset=utf-8", w.Header().Get("Content-Type"))
	return w.Body.String()
}

// keysOf returns the keys of a page's rows, in order.
func keysOf(p *peers) []string {
	keys := make([]string, len(p.Items))
	for i, it := range p.Items {
		keys[i] = it.Key
	}
	return keys
}
