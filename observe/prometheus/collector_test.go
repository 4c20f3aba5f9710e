package epprom_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	epprom "github.com/epcache/epcache/observe/prometheus"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errDown = errors.New("peer down")

func goGet[K comparable, V any](c *epcache.Cache[K, V], ctx context.Context, key K) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, key)
		done <- err
	}()
	return done
}

// storyCache is a cache, made in a synctest bubble, that has been through
// a little of everything, at exact durations: key 1 created in 3ms, key 2
// failed at once (remembered: a second Get is an error hit), key 3 created
// at once, leased and invalidated (lingering), and key 4, which needs room
// (MaxEntries 2), evicts key 1 without waiting and is created in 1s while
// a second Get waits for it and a third leaves on its context.
func storyCache(t *testing.T) (c *epcache.Cache[int, int], end func()) {
	t.Helper()
	c, err := epcache.New(epcache.Config[int, int]{
		MaxEntries: 2,
		ErrorTTL:   time.Hour,
		Create: func(_ context.Context, k int) (int, error) {
			switch k {
			case 1:
				time.Sleep(3 * time.Millisecond)
			case 2:
				return 0, errDown
			case 4:
				time.Sleep(time.Second)
			}
			return k, nil
		},
	})
	require.NoError(t, err)
	bg := context.Background()
	_, err = c.Get(bg, 1)
	require.NoError(t, err)
	for range 2 {
		_, err = c.Get(bg, 2)
		require.ErrorIs(t, err, errDown)
	}
	lease, err := c.Acquire(bg, 3)
	require.NoError(t, err)
	require.True(t, c.Invalidate(3))
	creating := goGet(c, bg, 4)
	synctest.Wait()
	waiting := goGet(c, bg, 4)
	ctx, cancel := context.WithCancel(bg)
	leaving := goGet(c, ctx, 4)
	synctest.Wait()
	cancel()
	require.ErrorIs(t, <-leaving, context.Canceled)
	require.NoError(t, <-creating)
	require.NoError(t, <-waiting)
	return c, func() {
		lease.Release()
		require.NoError(t, c.Close())
	}
}

// The exposition of a cache the test put through a known story, exactly:
// every counter and gauge, and both histograms, their buckets the
// durations the story took (fake time: 0, 3ms and 1s).
func TestCollectorExposesACacheExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, end := storyCache(t)
		defer end()
		col := epprom.New()
		require.NoError(t, epprom.Add(col, "story", c))

		const counters = `
# HELP epcache_creates_total Creations that produced a value (Create returned a nil error).
# TYPE epcache_creates_total counter
epcache_creates_total{cache="story"} 3
# HELP epcache_create_errors_total Creations whose callers got an error: after retries, panics, Goexit, timeouts, Close.
# TYPE epcache_create_errors_total counter
epcache_create_errors_total{cache="story"} 1
# HELP epcache_create_attempts_total Calls of Create, retries included.
# TYPE epcache_create_attempts_total counter
epcache_create_attempts_total{cache="story"} 4
# HELP epcache_waits_total Gets that waited on a creation another Get started.
# TYPE epcache_waits_total counter
epcache_waits_total{cache="story"} 2
# HELP epcache_cancels_total Waiting Gets that left because their own context ended.
# TYPE epcache_cancels_total counter
epcache_cancels_total{cache="story"} 1
# HELP epcache_error_hits_total Gets answered with a remembered failure (ErrorTTL) or a timed-out creation still running.
# TYPE epcache_error_hits_total counter
epcache_error_hits_total{cache="story"} 1
# HELP epcache_releases_total Values given up: Release called, or dropped when Release is nil.
# TYPE epcache_releases_total counter
epcache_releases_total{cache="story"} 1
# HELP epcache_release_panics_total Release calls that panicked.
# TYPE epcache_release_panics_total counter
epcache_release_panics_total{cache="story"} 0
# HELP epcache_offers_total Values stored by Offer.
# TYPE epcache_offers_total counter
epcache_offers_total{cache="story"} 0
# HELP epcache_evictions_total Values removed to make room under MaxEntries.
# TYPE epcache_evictions_total counter
epcache_evictions_total{cache="story"} 1
# HELP epcache_idle_removals_total Values removed by IdleTimeout.
# TYPE epcache_idle_removals_total counter
epcache_idle_removals_total{cache="story"} 0
# HELP epcache_room_waits_total Creations that found no room under MaxEntries and waited.
# TYPE epcache_room_waits_total counter
epcache_room_waits_total{cache="story"} 1
# HELP epcache_entries Values the cache holds now, ready for a Get (Stats.Ready, Cache.Len).
# TYPE epcache_entries gauge
epcache_entries{cache="story"} 1
# HELP epcache_room_used Room taken under MaxEntries now: values not yet released plus creations running; 0 without MaxEntries.
# TYPE epcache_room_used gauge
epcache_room_used{cache="story"} 2
# HELP epcache_live_values Values created or offered and not yet released.
# TYPE epcache_live_values gauge
epcache_live_values{cache="story"} 2
# HELP epcache_lingering_values Values given up (Invalidate, eviction, Close) that leases still hold; one that stays is a lease never released.
# TYPE epcache_lingering_values gauge
epcache_lingering_values{cache="story"} 1
`
		names := []string{"epcache_creates_total", "epcache_create_errors_total", "epcache_create_attempts_total",
			"epcache_waits_total", "epcache_cancels_total", "epcache_error_hits_total", "epcache_releases_total",
			"epcache_release_panics_total", "epcache_offers_total", "epcache_evictions_total", "epcache_idle_removals_total",
			"epcache_room_waits_total", "epcache_entries", "epcache_room_used", "epcache_live_values", "epcache_lingering_values"}
		assert.NoError(t, testutil.CollectAndCompare(col, strings.NewReader(counters), names...))

		// The histograms, whole: key 3 (0 s) in le=1e-06, key 1 (3ms) in
		// le=0.004096, key 4 (1 s) in le=1.048576; key 2's failure (0 s);
		// key 4's wait for room, which evicted key 1 and took its room at
		// once (0 s).
		histograms, err := os.ReadFile("testdata/story_histograms.txt")
		require.NoError(t, err)
		assert.NoError(t, testutil.CollectAndCompare(col, strings.NewReader(string(histograms)),
			"epcache_create_duration_seconds", "epcache_room_wait_duration_seconds"))

		// Nothing else: no tcp metrics for a plain cache.
		assert.Equal(t, len(names)+int(epcache.NumOutcomes)+1, testutil.CollectAndCount(col))
	})
}

// twoPeers returns two tcp peers on loopback, peer 0 having sent one frame
// to peer 1 (one connection, dialed by peer 0).
func twoPeers(t *testing.T) (a, b *tcp.Peer) {
	t.Helper()
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	cfg := tcp.Config{Directory: dir, CreateTimeout: hang, HandshakeTimeout: hang}
	a, err = tcp.Listen(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, a.Close()) })
	cfg.ID = 1
	b, err = tcp.Listen(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	require.NoError(t, a.Send(ctx, 1, []byte("ping")))
	_, err = b.Recv(ctx)
	require.NoError(t, err)
	return a, b
}

func newCache(t *testing.T) *epcache.Cache[int, int] {
	t.Helper()
	c, err := epcache.New(epcache.Config[int, int]{Create: func(_ context.Context, k int) (int, error) { return k, nil }})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	return c
}

// promlint finds nothing to say of any metric: names, units, help, types.
func TestCollectorPassesLint(t *testing.T) {
	c := newCache(t)
	_, err := c.Get(context.Background(), 1)
	require.NoError(t, err)
	a, _ := twoPeers(t)
	col := epprom.New()
	require.NoError(t, epprom.Add(col, "c", c))
	require.NoError(t, col.AddTCP("peer 0", a))
	problems, err := testutil.CollectAndLint(col)
	require.NoError(t, err)
	assert.Empty(t, problems)
	assert.Equal(t, 2*(16+int(epcache.NumOutcomes)+1)+17, testutil.CollectAndCount(col), "every metric of both, and peer 0's tcp ones")
}

// A real scrape: promhttp on loopback serves the registry, and the text
// it answers parses into every family with its type, the cache label and
// the figures of a cache and a tcp peer the test set up.
func TestScrapeOverHTTP(t *testing.T) {
	c := newCache(t)
	ctx := context.Background()
	for k := range 5 {
		_, err := c.Get(ctx, k)
		require.NoError(t, err)
	}
	require.True(t, c.Invalidate(0))
	a, b := twoPeers(t)
	col := epprom.New()
	require.NoError(t, epprom.Add(col, "five", c))
	require.NoError(t, col.AddTCP("peer 0", a))
	require.NoError(t, col.AddStats("peer 1", func() epcache.Stats { return b.Stats().Cache }))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(col))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	reqCtx, cancel := context.WithTimeout(ctx, hang)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)

	// value returns the sample of family name for cache, and outcome if
	// given.
	value := func(name, cache string, outcome ...string) *dto.Metric {
		t.Helper()
		f, ok := families[name]
		require.True(t, ok, "no family %s", name)
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["cache"] == cache && (len(outcome) == 0 || labels["outcome"] == outcome[0]) {
				return m
			}
		}
		t.Fatalf("no %s{cache=%q %v}", name, cache, outcome)
		return nil
	}
	assert.Equal(t, dto.MetricType_COUNTER, families["epcache_creates_total"].GetType())
	assert.Equal(t, 5.0, value("epcache_creates_total", "five").GetCounter().GetValue())
	assert.Equal(t, 1.0, value("epcache_releases_total", "five").GetCounter().GetValue())
	assert.Equal(t, dto.MetricType_GAUGE, families["epcache_entries"].GetType())
	assert.Equal(t, 4.0, value("epcache_entries", "five").GetGauge().GetValue())
	assert.Equal(t, 1.0, value("epcache_creates_total", "peer 0").GetCounter().GetValue(), "peer 0's connection to peer 1")
	assert.Equal(t, 0.0, value("epcache_creates_total", "peer 1").GetCounter().GetValue(), "peer 1 accepted, and dialed nothing")

	assert.Equal(t, dto.MetricType_HISTOGRAM, families["epcache_create_duration_seconds"].GetType())
	assert.Len(t, families["epcache_create_duration_seconds"].GetMetric(), 3*int(epcache.NumOutcomes), "every outcome of every cache")
	h := value("epcache_create_duration_seconds", "five", "value").GetHistogram()
	assert.Equal(t, uint64(5), h.GetSampleCount())
	want := c.Stats().CreateLatency[epcache.OutcomeValue]
	assert.InDelta(t, want.Sum.Seconds(), h.GetSampleSum(), 1e-9)
	buckets := h.GetBucket()
	require.Len(t, buckets, epcache.HistogramBuckets, "one per bounded bucket, and +Inf")
	var below uint64
	for i, bk := range buckets[:epcache.HistogramBuckets-1] {
		below += want.Counts[i]
		assert.Equal(t, epcache.HistogramBound(i).Seconds(), bk.GetUpperBound())
		assert.Equal(t, below, bk.GetCumulativeCount(), "le=%v", bk.GetUpperBound())
	}
	assert.True(t, math.IsInf(buckets[epcache.HistogramBuckets-1].GetUpperBound(), 1))
	assert.Equal(t, uint64(5), buckets[epcache.HistogramBuckets-1].GetCumulativeCount())
	assert.Len(t, value("epcache_room_wait_duration_seconds", "five").GetHistogram().GetBucket(), epcache.HistogramBuckets)

	assert.Equal(t, 1.0, value("epcache_tcp_connections_dialed_total", "peer 0").GetCounter().GetValue())
	assert.Equal(t, 1.0, value("epcache_tcp_frames_sent_total", "peer 0").GetCounter().GetValue())
	assert.Equal(t, 1.0, value("epcache_tcp_open_connections", "peer 0").GetGauge().GetValue())
	assert.Len(t, families["epcache_tcp_frames_sent_total"].GetMetric(), 1, "only the tcp peer has tcp metrics")
}

// Registration refuses, with an error errors.Is can tell, a nil collector,
// cache, peer or function, an empty or invalid name, a name taken and a
// cache registered twice; a refused registration collects nothing.
// Remove frees the name and the cache. The zero Collector works.
func TestRegistrationRefusesBadInput(t *testing.T) {
	c := newCache(t)
	col := epprom.New()
	stats := func() epcache.Stats { return epcache.Stats{} }

	assert.ErrorIs(t, epprom.Add(nil, "c", c), epprom.ErrNil)
	assert.ErrorIs(t, epprom.Add[int, int](col, "c", nil), epprom.ErrNil)
	assert.ErrorIs(t, col.AddStats("s", nil), epprom.ErrNil)
	assert.ErrorIs(t, col.AddTCP("s", nil), epprom.ErrNil)
	assert.ErrorIs(t, epprom.Add(col, "", c), epprom.ErrBadName)
	assert.ErrorIs(t, col.AddStats("\xff", stats), epprom.ErrBadName)
	var nilCol *epprom.Collector
	assert.ErrorIs(t, nilCol.AddStats("x", stats), epprom.ErrNil)
	assert.False(t, nilCol.Remove("x"))

	require.NoError(t, epprom.Add(col, "c", c))
	err := epprom.Add(col, "c2", c)
	assert.ErrorIs(t, err, epprom.ErrAlreadyAdded)
	assert.EqualError(t, err, `epprom: already registered as "c"; not added as "c2"`)
	assert.ErrorIs(t, col.AddStats("c", stats), epprom.ErrNameTaken)
	assert.Equal(t, 1, testutil.CollectAndCount(col, "epcache_creates_total"), "the refused registrations collect nothing")

	assert.True(t, col.Remove("c"))
	assert.False(t, col.Remove("c"))
	assert.Zero(t, testutil.CollectAndCount(col))
	require.NoError(t, epprom.Add(col, "c2", c), "removed: the cache may come back, under another name")
	require.NoError(t, col.AddStats("c", stats))
	assert.Equal(t, 2, testutil.CollectAndCount(col, "epcache_creates_total"))

	var zero epprom.Collector
	require.NoError(t, epprom.Add(&zero, "c", c))
	assert.Equal(t, 1, testutil.CollectAndCount(&zero, "epcache_creates_total"))
}

// A stats function that panics fails that cache's part of the scrape with
// an error that names it; the other caches are still gathered, and
// promhttp told to continue on errors serves them.
func TestPanickingStatsIsAScrapeErrorNotACrash(t *testing.T) {
	c := newCache(t)
	col := epprom.New()
	require.NoError(t, epprom.Add(col, "fine", c))
	require.NoError(t, col.AddStats("broken", func() epcache.Stats { panic("no stats today") }))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(col))

	families, err := reg.Gather()
	require.Error(t, err)
	assert.Contains(t, err.Error(), `epprom: reading cache "broken" panicked: no stats today`)
	found := false
	for _, f := range families {
		if f.GetName() == "epcache_creates_total" {
			require.Len(t, f.GetMetric(), 1)
			assert.Equal(t, "fine", f.GetMetric()[0].GetLabel()[0].GetValue())
			found = true
		}
	}
	assert.True(t, found, "the fine cache is gathered")

	w := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).
		ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Contains(t, w.Body.String(), `epcache_creates_total{cache="fine"} 0`)
}

// Scrapes while caches are added and removed and a cache works: under
// -race nothing races, and the pedantic registry finds every scrape
// consistent.
func TestScrapesUnderConcurrentUse(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{
		MaxEntries: 16,
		Create:     func(_ context.Context, k int) (int, error) { return k, nil },
	})
	require.NoError(t, err)
	defer c.Close()
	col := epprom.New()
	require.NoError(t, epprom.Add(col, "busy", c))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(col))
	rounds := 100
	if testing.Short() {
		rounds = 20
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range rounds * 20 {
			l, err := c.Acquire(ctx, i%50)
			if !assert.NoError(t, err) {
				return
			}
			if i%5 == 0 {
				c.Invalidate(i % 50)
			}
			l.Release()
		}
	})
	wg.Go(func() {
		for i := range rounds {
			name := fmt.Sprintf("other %d", i%3)
			col.Remove(name)
			assert.NoError(t, col.AddStats(name, c.Stats))
		}
	})
	for range rounds {
		_, err := reg.Gather()
		require.NoError(t, err)
	}
	wg.Wait()
}
