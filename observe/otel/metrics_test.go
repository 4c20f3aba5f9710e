package epotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	epotel "github.com/epcache/epcache/observe/otel"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
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

// reader returns a manual reader and Metrics on a meter of its provider,
// both shut down at the test's end.
func reader(t *testing.T) (*sdkmetric.ManualReader, *epotel.Metrics) {
	t.Helper()
	r := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { assert.NoError(t, provider.Shutdown(context.Background())) })
	m, err := epotel.New(provider.Meter("github.com/epcache/epcache/observe/otel/test"))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, m.Close()) })
	return r, m
}

// collect returns what r collects, by instrument name.
func collect(t *testing.T, r *sdkmetric.ManualReader) (map[string]metricdata.Metrics, error) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	err := r.Collect(context.Background(), &rm)
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out, err
}

func counter[N int64 | float64](name, unit string, points ...metricdata.DataPoint[N]) metricdata.Metrics {
	return metricdata.Metrics{Name: name, Unit: unit, Data: metricdata.Sum[N]{
		Temporality: metricdata.CumulativeTemporality, IsMonotonic: true, DataPoints: points}}
}

func upDown(name, unit string, points ...metricdata.DataPoint[int64]) metricdata.Metrics {
	return metricdata.Metrics{Name: name, Unit: unit, Data: metricdata.Sum[int64]{
		Temporality: metricdata.CumulativeTemporality, IsMonotonic: false, DataPoints: points}}
}

func point[N int64 | float64](v N, attrs ...attribute.KeyValue) metricdata.DataPoint[N] {
	return metricdata.DataPoint[N]{Attributes: attribute.NewSet(attrs...), Value: v}
}

// assertMetrics compares what was collected with want, instrument by
// instrument, descriptions aside (each must have one) and timestamps
// ignored; nothing else may have been collected.
func assertMetrics(t *testing.T, got map[string]metricdata.Metrics, want ...metricdata.Metrics) {
	t.Helper()
	names := map[string]bool{}
	for _, w := range want {
		names[w.Name] = true
		g, ok := got[w.Name]
		if !assert.True(t, ok, "no %s collected", w.Name) {
			continue
		}
		assert.NotEmpty(t, g.Description, w.Name)
		g.Description = ""
		metricdatatest.AssertEqual(t, w, g, metricdatatest.IgnoreTimestamp())
	}
	for name := range got {
		assert.True(t, names[name], "%s collected, not expected", name)
	}
}

// The instruments observe exactly the figures of a cache the test put
// through a known story, the durations (fake time: 0, 3ms and 1s) summed
// by outcome.
func TestMetricsObserveACacheExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, end := storyCache(t)
		defer end()
		r, m := reader(t)
		require.NoError(t, epotel.Add(m, "story", c))
		got, err := collect(t, r)
		require.NoError(t, err)

		story := epotel.CacheName.String("story")
		outcome := func(o string) attribute.KeyValue { return epotel.CreateOutcome.String(o) }
		one := func(name, unit string, v int64) metricdata.Metrics { return counter(name, unit, point(v, story)) }
		assertMetrics(t, got,
			one("epcache.creates", "{creation}", 3),
			one("epcache.create.errors", "{creation}", 1),
			one("epcache.create.attempts", "{attempt}", 4),
			one("epcache.waits", "{get}", 2),
			one("epcache.cancels", "{get}", 1),
			one("epcache.error_hits", "{get}", 1),
			one("epcache.releases", "{value}", 1),
			one("epcache.release.panics", "{release}", 0),
			one("epcache.offers", "{value}", 0),
			one("epcache.evictions", "{value}", 1),
			one("epcache.idle_removals", "{value}", 0),
			one("epcache.room.waits", "{creation}", 1),
			upDown("epcache.entries", "{entry}", point[int64](1, story)),
			upDown("epcache.room.used", "{value}", point[int64](2, story)),
			upDown("epcache.values.live", "{value}", point[int64](2, story)),
			upDown("epcache.values.lingering", "{value}", point[int64](1, story)),
			counter("epcache.create.outcomes", "{creation}",
				point[int64](3, story, outcome("value")), point[int64](1, story, outcome("error")),
				point[int64](0, story, outcome("panic")), point[int64](0, story, outcome("timeout")),
				point[int64](0, story, outcome("offered"))),
			counter("epcache.create.time", "s",
				point((1003*time.Millisecond).Seconds(), story, outcome("value")), point(0.0, story, outcome("error")),
				point(0.0, story, outcome("panic")), point(0.0, story, outcome("timeout")),
				point(0.0, story, outcome("offered"))),
			counter("epcache.room.wait.time", "s", point(0.0, story)),
		)
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

// value returns the one data point of an int64 instrument for cache.
func value(t *testing.T, got map[string]metricdata.Metrics, name, cache string) int64 {
	t.Helper()
	m, ok := got[name]
	require.True(t, ok, "no %s collected", name)
	var points []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		points = d.DataPoints
	case metricdata.Gauge[int64]:
		points = d.DataPoints
	default:
		t.Fatalf("%s is a %T", name, m.Data)
	}
	for _, p := range points {
		if v, _ := p.Attributes.Value(epotel.CacheName); v.AsString() == cache {
			return p.Value
		}
	}
	t.Fatalf("no %s for %s", name, cache)
	return 0
}

// A tcp peer's transport figures are observed beside its cache's, with
// the same attribute; a cache out of reach (AddStats) has no tcp figures.
func TestMetricsObserveATCPPeer(t *testing.T) {
	a, b := twoPeers(t)
	r, m := reader(t)
	require.NoError(t, m.AddTCP("peer 0", a))
	require.ErrorIs(t, m.AddTCP("peer 0 again", a), epotel.ErrAlreadyAdded)
	require.NoError(t, m.AddStats("peer 1", func() epcache.Stats { return b.Stats().Cache }))
	got, err := collect(t, r)
	require.NoError(t, err)

	assert.Equal(t, int64(1), value(t, got, "epcache.creates", "peer 0"), "peer 0's connection to peer 1")
	assert.Equal(t, int64(0), value(t, got, "epcache.creates", "peer 1"))
	assert.Equal(t, int64(1), value(t, got, "epcache.tcp.connections.dialed", "peer 0"))
	assert.Equal(t, int64(1), value(t, got, "epcache.tcp.frames.sent", "peer 0"))
	assert.Equal(t, int64(1), value(t, got, "epcache.tcp.connections.open", "peer 0"))
	assert.Equal(t, a.Stats().Descriptors, value(t, got, "epcache.tcp.descriptors", "peer 0"))
	assert.Equal(t, a.Stats().PeakDescriptors, value(t, got, "epcache.tcp.peak_descriptors", "peer 0"))
	_, isGauge := got["epcache.tcp.peak_descriptors"].Data.(metricdata.Gauge[int64])
	assert.True(t, isGauge, "a high-water mark does not add up: a gauge")
	sent := got["epcache.tcp.frames.sent"].Data.(metricdata.Sum[int64])
	assert.Len(t, sent.DataPoints, 1, "only the tcp peer has tcp figures")
	assert.Equal(t, "{frame}", got["epcache.tcp.frames.sent"].Unit)
}

// New refuses a nil meter; registration refuses, with an error errors.Is
// can tell, a nil Metrics, cache, peer or function, an empty or invalid
// name, a name taken and a cache registered twice. Remove frees the name
// and the cache; Close stops the observations.
func TestRegistrationRefusesBadInput(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{Create: func(_ context.Context, k int) (int, error) { return k, nil }})
	require.NoError(t, err)
	defer c.Close()
	_, err = epotel.New(nil)
	assert.ErrorIs(t, err, epotel.ErrNil)
	r, m := reader(t)
	stats := func() epcache.Stats { return epcache.Stats{} }

	assert.ErrorIs(t, epotel.Add(nil, "c", c), epotel.ErrNil)
	assert.ErrorIs(t, epotel.Add(&epotel.Metrics{}, "c", c), epotel.ErrNil, "a zero Metrics has no instruments")
	assert.ErrorIs(t, epotel.Add[int, int](m, "c", nil), epotel.ErrNil)
	assert.ErrorIs(t, m.AddStats("s", nil), epotel.ErrNil)
	assert.ErrorIs(t, m.AddTCP("s", nil), epotel.ErrNil)
	assert.ErrorIs(t, epotel.Add(m, "", c), epotel.ErrBadName)
	assert.ErrorIs(t, m.AddStats("\xff", stats), epotel.ErrBadName)

	require.NoError(t, epotel.Add(m, "c", c))
	err = epotel.Add(m, "c2", c)
	assert.ErrorIs(t, err, epotel.ErrAlreadyAdded)
	assert.EqualError(t, err, `epotel: already registered as "c"; not added as "c2"`)
	assert.ErrorIs(t, m.AddStats("c", stats), epotel.ErrNameTaken)
	got, err := collect(t, r)
	require.NoError(t, err)
	assert.Len(t, got["epcache.creates"].Data.(metricdata.Sum[int64]).DataPoints, 1, "the refused registrations observe nothing")

	assert.True(t, m.Remove("c"))
	assert.False(t, m.Remove("c"))
	require.NoError(t, epotel.Add(m, "c2", c), "removed: the cache may come back, under another name")
	require.NoError(t, m.AddStats("c", stats))
	got, err = collect(t, r)
	require.NoError(t, err)
	assert.Len(t, got["epcache.creates"].Data.(metricdata.Sum[int64]).DataPoints, 2)

	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "a second Close")
	got, err = collect(t, r)
	require.NoError(t, err)
	assert.Empty(t, got, "closed: nothing observed")
}

// A stats function that panics is the callback's error, naming the cache;
// the other caches are still observed.
func TestPanickingStatsIsAnErrorNotACrash(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{Create: func(_ context.Context, k int) (int, error) { return k, nil }})
	require.NoError(t, err)
	defer c.Close()
	r, m := reader(t)
	require.NoError(t, epotel.Add(m, "fine", c))
	require.NoError(t, m.AddStats("broken", func() epcache.Stats { panic("no stats today") }))
	got, err := collect(t, r)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `epotel: reading cache "broken" panicked: no stats today`)
	assert.Equal(t, int64(0), value(t, got, "epcache.creates", "fine"))
}

// Collections while caches are added and removed and a cache works: under
// -race nothing races, and every collection succeeds.
func TestCollectionsUnderConcurrentUse(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{
		MaxEntries: 16,
		Create:     func(_ context.Context, k int) (int, error) { return k, nil },
	})
	require.NoError(t, err)
	defer c.Close()
	r, m := reader(t)
	require.NoError(t, epotel.Add(m, "busy", c))
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
			m.Remove(name)
			assert.NoError(t, m.AddStats(name, c.Stats))
		}
	})
	for range rounds {
		_, err := collect(t, r)
		require.NoError(t, err)
	}
	wg.Wait()
}
