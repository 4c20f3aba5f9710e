package epprom

import (
	"errors"
	"fmt"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/internal/registry"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/prometheus/client_golang/prometheus"
)

// Errors of registration, for errors.Is.
var (
	// ErrBadName: the name is empty or not valid UTF-8 (a label value must
	// be).
	ErrBadName = errors.New("epprom: a cache's name must be non-empty UTF-8")
	// ErrNameTaken: another cache has the name.
	ErrNameTaken = errors.New("epprom: name already registered")
	// ErrAlreadyAdded: the cache (or tcp peer) is registered under another
	// name.
	ErrAlreadyAdded = errors.New("epprom: already registered")
	// ErrNil: the collector, cache, peer or function is nil.
	ErrNil = errors.New("epprom: nil")
)

// Collector is a prometheus.Collector of the caches registered with it. Its
// methods are safe for concurrent use, with each other and with scrapes;
// caches may be added and removed after it is registered. Make one with
// [New], and register one per registry: two would describe the same
// metrics. To add labels of your own to every metric, register it with
// prometheus.WrapRegistererWith.
type Collector struct {
	sources registry.Registry[*source]
}

// source is one registered name, immutable once registered.
type source struct {
	name  string
	owner any
	// read returns the cache's figures, and for a tcp peer its
	// transport's (nil otherwise): one call per scrape.
	read func() (epcache.Stats, *tcp.Stats)
}

// New returns a collector with no cache: it describes every metric and
// collects none until one is added.
func New() *Collector {
	return &Collector{}
}

// Add registers cache under name: its figures are collected with the label
// cache=name. It returns an error, and registers nothing, if col or cache
// is nil ([ErrNil]), if name is empty ([ErrBadName]), if another cache has
// the name ([ErrNameTaken]) or if cache is registered already under another
// name ([ErrAlreadyAdded]).
func Add[K comparable, V any](col *Collector, name string, cache *epcache.Cache[K, V]) error {
	if cache == nil {
		return fmt.Errorf("%w cache for %q", ErrNil, name)
	}
	return col.add(&source{name: name, owner: cache, read: func() (epcache.Stats, *tcp.Stats) { return cache.Stats(), nil }})
}

// AddStats registers stats under name: the figures it returns are
// collected with the label cache=name, for a cache out of reach (a
// transport's own). It is called once per scrape. Errors as for [Add].
func (col *Collector) AddStats(name string, stats func() epcache.Stats) error {
	if stats == nil {
		return fmt.Errorf("%w stats function for %q", ErrNil, name)
	}
	return col.add(&source{name: name, read: func() (epcache.Stats, *tcp.Stats) { return stats(), nil }})
}

// AddTCP registers the tcp peer p under name: its endpoint cache's figures
// and its transport's (the epcache_tcp_ metrics) are collected with the
// label cache=name, from one p.Stats() per scrape. Errors as for [Add].
func (col *Collector) AddTCP(name string, p *tcp.Peer) error {
	if p == nil {
		return fmt.Errorf("%w tcp peer for %q", ErrNil, name)
	}
	return col.add(&source{name: name, owner: p, read: func() (epcache.Stats, *tcp.Stats) {
		st := p.Stats()
		return st.Cache, &st
	}})
}

// Remove unregisters the cache called name, reporting whether there was
// one. Its series end with the next scrape; a scrape under way may still
// collect it.
func (col *Collector) Remove(name string) bool {
	return col != nil && col.sources.Remove(name)
}

var errs = registry.Errors{BadName: ErrBadName, NameTaken: ErrNameTaken, AlreadyAdded: ErrAlreadyAdded}

func (col *Collector) add(s *source) error {
	if col == nil {
		return fmt.Errorf("%w Collector: make one with epprom.New", ErrNil)
	}
	return col.sources.Add(s.name, s.owner, s, errs)
}

// Describe sends the descriptor of every metric the collector may collect,
// whatever caches are registered: the set is fixed, the caches being label
// values.
func (col *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range cacheCounters {
		ch <- m.desc
	}
	for _, m := range cacheGauges {
		ch <- m.desc
	}
	ch <- createDuration
	ch <- roomWaitDuration
	for _, m := range tcpCounters {
		ch <- m.desc
	}
	for _, m := range tcpGauges {
		ch <- m.desc
	}
}

// Collect sends the figures of every cache registered, read once each.
func (col *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range col.sources.All() {
		s.collect(ch)
	}
}

// collect sends s's metrics. A panic in the function that reads them is
// sent as an invalid metric: the scrape reports it as its error.
func (s *source) collect(ch chan<- prometheus.Metric) {
	defer func() {
		if r := recover(); r != nil {
			ch <- prometheus.NewInvalidMetric(createDuration, fmt.Errorf("epprom: reading cache %q panicked: %v", s.name, r))
		}
	}()
	st, ts := s.read()
	for _, m := range cacheCounters {
		ch <- constMetric(m.desc, prometheus.CounterValue, float64(m.value(&st)), s.name)
	}
	for _, m := range cacheGauges {
		ch <- constMetric(m.desc, prometheus.GaugeValue, float64(m.value(&st)), s.name)
	}
	for o := range epcache.NumOutcomes {
		ch <- histogram(createDuration, &st.CreateLatency[o], s.name, o.String())
	}
	ch <- histogram(roomWaitDuration, &st.RoomWait, s.name)
	if ts == nil {
		return
	}
	for _, m := range tcpCounters {
		ch <- constMetric(m.desc, prometheus.CounterValue, float64(m.value(ts)), s.name)
	}
	for _, m := range tcpGauges {
		ch <- constMetric(m.desc, prometheus.GaugeValue, float64(m.value(ts)), s.name)
	}
}

func constMetric(desc *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(desc, t, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(desc, err)
	}
	return m
}

// histogram converts h: bucket i's upper bound in seconds is its le, the
// counts cumulative; the last bucket, unbounded, counts in +Inf only.
func histogram(desc *prometheus.Desc, h *epcache.Histogram, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, epcache.HistogramBuckets-1)
	var below uint64
	for i := range epcache.HistogramBuckets - 1 {
		below += h.Counts[i]
		buckets[epcache.HistogramBound(i).Seconds()] = below
	}
	count := below + h.Counts[epcache.HistogramBuckets-1]
	m, err := prometheus.NewConstHistogram(desc, count, h.Sum.Seconds(), buckets, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(desc, err)
	}
	return m
}
