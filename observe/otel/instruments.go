package epotel

import (
	"fmt"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/tcp"
	"go.opentelemetry.io/otel/metric"
)

// spec is one integer instrument read from a snapshot of type S.
type spec[S any] struct {
	name, unit, desc string
	field            string // the field of S it reads, for the test that every field is exported
	value            func(*S) int64
}

var cacheCounters = []spec[epcache.Stats]{
	{"epcache.creates", "{creation}", "Creations that produced a value (Create returned a nil error).", "Creates", func(s *epcache.Stats) int64 { return clamp(s.Creates) }},
	{"epcache.create.errors", "{creation}", "Creations whose callers got an error: after retries, panics, Goexit, timeouts, Close.", "CreateErrors", func(s *epcache.Stats) int64 { return clamp(s.CreateErrors) }},
	{"epcache.create.attempts", "{attempt}", "Calls of Create, retries included.", "Attempts", func(s *epcache.Stats) int64 { return clamp(s.Attempts) }},
	{"epcache.waits", "{get}", "Gets that waited on a creation another Get started.", "Waits", func(s *epcache.Stats) int64 { return clamp(s.Waits) }},
	{"epcache.cancels", "{get}", "Waiting Gets that left because their own context ended.", "Cancels", func(s *epcache.Stats) int64 { return clamp(s.Cancels) }},
	{"epcache.error_hits", "{get}", "Gets answered with a remembered failure (ErrorTTL) or a timed-out creation still running.", "ErrorHits", func(s *epcache.Stats) int64 { return clamp(s.ErrorHits) }},
	{"epcache.releases", "{value}", "Values given up: Release called, or dropped when Release is nil.", "Releases", func(s *epcache.Stats) int64 { return clamp(s.Releases) }},
	{"epcache.release.panics", "{release}", "Release calls that panicked.", "ReleasePanics", func(s *epcache.Stats) int64 { return clamp(s.ReleasePanics) }},
	{"epcache.offers", "{value}", "Values stored by Offer.", "Offers", func(s *epcache.Stats) int64 { return clamp(s.Offers) }},
	{"epcache.evictions", "{value}", "Values removed to make room under MaxEntries.", "Evictions", func(s *epcache.Stats) int64 { return clamp(s.Evictions) }},
	{"epcache.idle_removals", "{value}", "Values removed by IdleTimeout.", "IdleRemovals", func(s *epcache.Stats) int64 { return clamp(s.IdleRemovals) }},
	{"epcache.room.waits", "{creation}", "Creations that found no room under MaxEntries and waited.", "RoomWaits", func(s *epcache.Stats) int64 { return clamp(s.RoomWaits) }},
}

var cacheUpDowns = []spec[epcache.Stats]{
	{"epcache.entries", "{entry}", "Values the cache holds now, ready for a Get (Stats.Ready, Cache.Len).", "Ready", func(s *epcache.Stats) int64 { return s.Ready }},
	{"epcache.room.used", "{value}", "Room taken under MaxEntries now: values not yet released plus creations running; 0 without MaxEntries.", "Room", func(s *epcache.Stats) int64 { return s.Room }},
	{"epcache.values.live", "{value}", "Values created or offered and not yet released.", "Live", func(s *epcache.Stats) int64 { return s.Live }},
	{"epcache.values.lingering", "{value}", "Values given up (Invalidate, eviction, Close) that leases still hold; one that stays is a lease never released.", "Lingering", func(s *epcache.Stats) int64 { return s.Lingering }},
}

var tcpCounters = []spec[tcp.Stats]{
	{"epcache.tcp.dial.attempts", "{attempt}", "TCP connects tried (lookups that found an address).", "DialAttempts", func(s *tcp.Stats) int64 { return clamp(s.DialAttempts) }},
	{"epcache.tcp.connections.dialed", "{connection}", "TCP connects that succeeded.", "Dialed", func(s *tcp.Stats) int64 { return clamp(s.Dialed) }},
	{"epcache.tcp.connections.accepted", "{connection}", "Connections accepted by the listener, strangers included.", "Accepted", func(s *tcp.Stats) int64 { return clamp(s.Accepted) }},
	{"epcache.tcp.connections.closed", "{connection}", "Connection ends closed, for any reason.", "Closed", func(s *tcp.Stats) int64 { return clamp(s.Closed) }},
	{"epcache.tcp.duplicates.closed", "{connection}", "Connection ends closed because the pair keeps another connection.", "Duplicates", func(s *tcp.Stats) int64 { return clamp(s.Duplicates) }},
	{"epcache.tcp.connections.refused", "{connection}", "Accepted connections closed for a bad or missing hello.", "Refused", func(s *tcp.Stats) int64 { return clamp(s.Refused) }},
	{"epcache.tcp.connections.abandoned", "{connection}", "Accepted connections closed unused: their dialer had gone after its hello.", "Abandoned", func(s *tcp.Stats) int64 { return clamp(s.Abandoned) }},
	{"epcache.tcp.lookups.not_published", "{lookup}", "Lookups the directory answered \"not yet published\".", "NotPublished", func(s *tcp.Stats) int64 { return clamp(s.NotPublished) }},
	{"epcache.tcp.bad_frames", "{connection}", "Connections closed for announcing a frame over MaxFrame.", "BadFrames", func(s *tcp.Stats) int64 { return clamp(s.BadFrames) }},
	{"epcache.tcp.frames.sent", "{frame}", "Frames written.", "Sent", func(s *tcp.Stats) int64 { return clamp(s.Sent) }},
	{"epcache.tcp.frames.received", "{frame}", "Frames delivered to the inbox.", "Received", func(s *tcp.Stats) int64 { return clamp(s.Received) }},
	{"epcache.tcp.busy.answers", "{connection}", "Accepted connections answered \"busy\": no room for them (MaxConns).", "Busy", func(s *tcp.Stats) int64 { return clamp(s.Busy) }},
	{"epcache.tcp.busy.retries", "{send}", "Sends that waited and tried again after a peer answered \"busy\".", "BusyRetries", func(s *tcp.Stats) int64 { return clamp(s.BusyRetries) }},
	{"epcache.tcp.resends", "{send}", "Sends that found their connection ended before writing a byte, and used another.", "Resent", func(s *tcp.Stats) int64 { return clamp(s.Resent) }},
}

var tcpUpDowns = []spec[tcp.Stats]{
	{"epcache.tcp.descriptors", "{descriptor}", "Connection descriptors the peer holds now, pending dials and accepts included.", "Descriptors", func(s *tcp.Stats) int64 { return s.Descriptors }},
	{"epcache.tcp.connections.open", "{connection}", "Connection ends not yet closed: dialed plus accepted minus closed.", "", func(s *tcp.Stats) int64 { return s.Open() }},
}

var tcpGauges = []spec[tcp.Stats]{
	{"epcache.tcp.peak_descriptors", "{descriptor}", "The high-water mark of epcache.tcp.descriptors.", "PeakDescriptors", func(s *tcp.Stats) int64 { return s.PeakDescriptors }},
}

// The instruments of the histograms' counts and sums.
const (
	createOutcomesName = "epcache.create.outcomes"
	createOutcomesDesc = "Creations that ended, by how they ended (the count of epcache.create.time)."
	createTimeName     = "epcache.create.time"
	createTimeDesc     = "The total time creations took, from the start of their first attempt to the return of their last, by how they ended."
	roomWaitTimeName   = "epcache.room.wait.time"
	roomWaitTimeDesc   = "The total time creations waited for room under MaxEntries (their count is epcache.room.waits)."
)

// instruments are the instruments, in the order of the tables above.
type instruments struct {
	cacheCounters, tcpCounters []metric.Int64ObservableCounter
	cacheUpDowns, tcpUpDowns   []metric.Int64ObservableUpDownCounter
	tcpGauges                  []metric.Int64ObservableGauge
	createOutcomes             metric.Int64ObservableCounter
	createTime, roomWaitTime   metric.Float64ObservableCounter
}

// create makes every instrument on meter, and returns them for the
// callback's registration.
func (in *instruments) create(meter metric.Meter) ([]metric.Observable, error) {
	var all []metric.Observable
	wrap := func(name string, err error) error {
		return fmt.Errorf("epotel: creating instrument %s: %w", name, err)
	}
	counters := func(names, units, descs []string) ([]metric.Int64ObservableCounter, error) {
		var out []metric.Int64ObservableCounter
		for i, name := range names {
			c, err := meter.Int64ObservableCounter(name, metric.WithUnit(units[i]), metric.WithDescription(descs[i]))
			if err != nil {
				return nil, wrap(name, err)
			}
			out = append(out, c)
			all = append(all, c)
		}
		return out, nil
	}
	upDowns := func(names, units, descs []string) ([]metric.Int64ObservableUpDownCounter, error) {
		var out []metric.Int64ObservableUpDownCounter
		for i, name := range names {
			c, err := meter.Int64ObservableUpDownCounter(name, metric.WithUnit(units[i]), metric.WithDescription(descs[i]))
			if err != nil {
				return nil, wrap(name, err)
			}
			out = append(out, c)
			all = append(all, c)
		}
		return out, nil
	}
	var err error
	if in.cacheCounters, err = counters(columns(cacheCounters)); err != nil {
		return nil, err
	}
	if in.cacheUpDowns, err = upDowns(columns(cacheUpDowns)); err != nil {
		return nil, err
	}
	if in.tcpCounters, err = counters(columns(tcpCounters)); err != nil {
		return nil, err
	}
	if in.tcpUpDowns, err = upDowns(columns(tcpUpDowns)); err != nil {
		return nil, err
	}
	for _, s := range tcpGauges {
		g, err := meter.Int64ObservableGauge(s.name, metric.WithUnit(s.unit), metric.WithDescription(s.desc))
		if err != nil {
			return nil, wrap(s.name, err)
		}
		in.tcpGauges = append(in.tcpGauges, g)
		all = append(all, g)
	}
	if in.createOutcomes, err = meter.Int64ObservableCounter(createOutcomesName, metric.WithUnit("{creation}"), metric.WithDescription(createOutcomesDesc)); err != nil {
		return nil, wrap(createOutcomesName, err)
	}
	if in.createTime, err = meter.Float64ObservableCounter(createTimeName, metric.WithUnit("s"), metric.WithDescription(createTimeDesc)); err != nil {
		return nil, wrap(createTimeName, err)
	}
	if in.roomWaitTime, err = meter.Float64ObservableCounter(roomWaitTimeName, metric.WithUnit("s"), metric.WithDescription(roomWaitTimeDesc)); err != nil {
		return nil, wrap(roomWaitTimeName, err)
	}
	return append(all, in.createOutcomes, in.createTime, in.roomWaitTime), nil
}

// columns returns the names, units and descriptions of specs.
func columns[S any](specs []spec[S]) (names, units, descs []string) {
	for _, s := range specs {
		names, units, descs = append(names, s.name), append(units, s.unit), append(descs, s.desc)
	}
	return names, units, descs
}

// observe observes every instrument for s, from one read. A panic in the
// read is returned as an error, and nothing is observed for s.
func (in *instruments) observe(o metric.Observer, s *source) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("epotel: reading cache %q panicked: %v", s.name, r)
		}
	}()
	st, ts := s.read()
	for i, sp := range cacheCounters {
		o.ObserveInt64(in.cacheCounters[i], sp.value(&st), s.attrs)
	}
	for i, sp := range cacheUpDowns {
		o.ObserveInt64(in.cacheUpDowns[i], sp.value(&st), s.attrs)
	}
	for out := range epcache.NumOutcomes {
		h := &st.CreateLatency[out]
		o.ObserveInt64(in.createOutcomes, clamp(h.Count()), s.outcomes[out])
		o.ObserveFloat64(in.createTime, h.Sum.Seconds(), s.outcomes[out])
	}
	o.ObserveFloat64(in.roomWaitTime, st.RoomWait.Sum.Seconds(), s.attrs)
	if ts == nil {
		return nil
	}
	for i, sp := range tcpCounters {
		o.ObserveInt64(in.tcpCounters[i], sp.value(ts), s.attrs)
	}
	for i, sp := range tcpUpDowns {
		o.ObserveInt64(in.tcpUpDowns[i], sp.value(ts), s.attrs)
	}
	for i, sp := range tcpGauges {
		o.ObserveInt64(in.tcpGauges[i], sp.value(ts), s.attrs)
	}
	return nil
}
