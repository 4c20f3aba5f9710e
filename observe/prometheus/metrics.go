package epprom

import (
	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/prometheus/client_golang/prometheus"
)

// cacheLabel names the cache each series is of.
const cacheLabel = "cache"

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{cacheLabel}, labels...), nil)
}

// figure is one metric read from a snapshot of type S.
type figure[S any, N uint64 | int64] struct {
	desc  *prometheus.Desc
	field string // the field of S it reads, for the test that every field is exported
	value func(*S) N
}

var cacheCounters = []figure[epcache.Stats, uint64]{
	{desc("epcache_creates_total", "Creations that produced a value (Create returned a nil error)."), "Creates", func(s *epcache.Stats) uint64 { return s.Creates }},
	{desc("epcache_create_errors_total", "Creations whose callers got an error: after retries, panics, Goexit, timeouts, Close."), "CreateErrors", func(s *epcache.Stats) uint64 { return s.CreateErrors }},
	{desc("epcache_create_attempts_total", "Calls of Create, retries included."), "Attempts", func(s *epcache.Stats) uint64 { return s.Attempts }},
	{desc("epcache_waits_total", "Gets that waited on a creation another Get started."), "Waits", func(s *epcache.Stats) uint64 { return s.Waits }},
	{desc("epcache_cancels_total", "Waiting Gets that left because their own context ended."), "Cancels", func(s *epcache.Stats) uint64 { return s.Cancels }},
	{desc("epcache_error_hits_total", "Gets answered with a remembered failure (ErrorTTL) or a timed-out creation still running."), "ErrorHits", func(s *epcache.Stats) uint64 { return s.ErrorHits }},
	{desc("epcache_releases_total", "Values given up: Release called, or dropped when Release is nil."), "Releases", func(s *epcache.Stats) uint64 { return s.Releases }},
	{desc("epcache_release_panics_total", "Release calls that panicked."), "ReleasePanics", func(s *epcache.Stats) uint64 { return s.ReleasePanics }},
	{desc("epcache_offers_total", "Values stored by Offer."), "Offers", func(s *epcache.Stats) uint64 { return s.Offers }},
	{desc("epcache_evictions_total", "Values removed to make room under MaxEntries."), "Evictions", func(s *epcache.Stats) uint64 { return s.Evictions }},
	{desc("epcache_idle_removals_total", "Values removed by IdleTimeout."), "IdleRemovals", func(s *epcache.Stats) uint64 { return s.IdleRemovals }},
	{desc("epcache_room_waits_total", "Creations that found no room under MaxEntries and waited."), "RoomWaits", func(s *epcache.Stats) uint64 { return s.RoomWaits }},
}

var cacheGauges = []figure[epcache.Stats, int64]{
	{desc("epcache_entries", "Values the cache holds now, ready for a Get (Stats.Ready, Cache.Len)."), "Ready", func(s *epcache.Stats) int64 { return s.Ready }},
	{desc("epcache_room_used", "Room taken under MaxEntries now: values not yet released plus creations running; 0 without MaxEntries."), "Room", func(s *epcache.Stats) int64 { return s.Room }},
	{desc("epcache_live_values", "Values created or offered and not yet released."), "Live", func(s *epcache.Stats) int64 { return s.Live }},
	{desc("epcache_lingering_values", "Values given up (Invalidate, eviction, Close) that leases still hold; one that stays is a lease never released."), "Lingering", func(s *epcache.Stats) int64 { return s.Lingering }},
}

var (
	createDuration = desc("epcache_create_duration_seconds",
		"How long creations took, from the start of their first attempt to the return of their last, by how they ended.", "outcome")
	roomWaitDuration = desc("epcache_room_wait_duration_seconds",
		"How long creations waited for room under MaxEntries.")
)

var tcpCounters = []figure[tcp.Stats, uint64]{
	{desc("epcache_tcp_dial_attempts_total", "TCP connects tried (lookups that found an address)."), "DialAttempts", func(s *tcp.Stats) uint64 { return s.DialAttempts }},
	{desc("epcache_tcp_connections_dialed_total", "TCP connects that succeeded."), "Dialed", func(s *tcp.Stats) uint64 { return s.Dialed }},
	{desc("epcache_tcp_connections_accepted_total", "Connections accepted by the listener, strangers included."), "Accepted", func(s *tcp.Stats) uint64 { return s.Accepted }},
	{desc("epcache_tcp_connections_closed_total", "Connection ends closed, for any reason."), "Closed", func(s *tcp.Stats) uint64 { return s.Closed }},
	{desc("epcache_tcp_duplicates_closed_total", "Connection ends closed because the pair keeps another connection."), "Duplicates", func(s *tcp.Stats) uint64 { return s.Duplicates }},
	{desc("epcache_tcp_connections_refused_total", "Accepted connections closed for a bad or missing hello."), "Refused", func(s *tcp.Stats) uint64 { return s.Refused }},
	{desc("epcache_tcp_connections_abandoned_total", "Accepted connections closed unused: their dialer had gone after its hello."), "Abandoned", func(s *tcp.Stats) uint64 { return s.Abandoned }},
	{desc("epcache_tcp_lookups_not_published_total", "Lookups the directory answered \"not yet published\"."), "NotPublished", func(s *tcp.Stats) uint64 { return s.NotPublished }},
	{desc("epcache_tcp_bad_frames_total", "Connections closed for announcing a frame over MaxFrame."), "BadFrames", func(s *tcp.Stats) uint64 { return s.BadFrames }},
	{desc("epcache_tcp_frames_sent_total", "Frames written."), "Sent", func(s *tcp.Stats) uint64 { return s.Sent }},
	{desc("epcache_tcp_frames_received_total", "Frames delivered to the inbox."), "Received", func(s *tcp.Stats) uint64 { return s.Received }},
	{desc("epcache_tcp_busy_answers_total", "Accepted connections answered \"busy\": no room for them (MaxConns)."), "Busy", func(s *tcp.Stats) uint64 { return s.Busy }},
	{desc("epcache_tcp_busy_retries_total", "Sends that waited and tried again after a peer answered \"busy\"."), "BusyRetries", func(s *tcp.Stats) uint64 { return s.BusyRetries }},
	{desc("epcache_tcp_resends_total", "Sends that found their connection ended before writing a byte, and used another."), "Resent", func(s *tcp.Stats) uint64 { return s.Resent }},
}

var tcpGauges = []figure[tcp.Stats, int64]{
	{desc("epcache_tcp_descriptors", "Connection descriptors the peer holds now, pending dials and accepts included."), "Descriptors", func(s *tcp.Stats) int64 { return s.Descriptors }},
	{desc("epcache_tcp_descriptors_peak", "The high-water mark of epcache_tcp_descriptors."), "PeakDescriptors", func(s *tcp.Stats) int64 { return s.PeakDescriptors }},
	{desc("epcache_tcp_open_connections", "Connection ends not yet closed: dialed plus accepted minus closed."), "", func(s *tcp.Stats) int64 { return s.Open() }},
}
