// Package epprom exports epcache's figures to Prometheus: a
// [prometheus.Collector] for any number of caches, each named by the label
// cache, and for the transport/tcp peers' counters.
//
//	col := epprom.New()
//	if err := epprom.Add(col, "endpoints", cache); err != nil {
//		return err
//	}
//	prometheus.MustRegister(col)
//
// It is a module of its own, so that a program importing epcache does not
// get client_golang.
//
// # Metrics
//
// Every metric has the label cache, the name given to [Add],
// [Collector.AddStats] or [Collector.AddTCP]. Counters, from
// [epcache.Stats]:
//
//	epcache_creates_total              creations that produced a value
//	epcache_create_errors_total        creations whose callers got an error (after retries)
//	epcache_create_attempts_total      calls of Create, retries included
//	epcache_waits_total                Gets that waited on a creation another Get started
//	epcache_cancels_total              waiting Gets that left because their context ended
//	epcache_error_hits_total           Gets answered with a remembered failure
//	epcache_releases_total             values given up and released
//	epcache_release_panics_total       Release calls that panicked
//	epcache_offers_total               values stored by Offer
//	epcache_evictions_total            values removed to make room under MaxEntries
//	epcache_idle_removals_total        values removed by IdleTimeout
//	epcache_room_waits_total           creations that waited for room under MaxEntries
//
// Gauges:
//
//	epcache_entries                    values the cache holds now (Stats.Ready; Cache.Len)
//	epcache_room_used                  room taken under MaxEntries (0 without)
//	epcache_live_values                values created or offered and not yet released
//	epcache_lingering_values           values given up that leases still hold
//
// Histograms, in seconds:
//
//	epcache_create_duration_seconds    creations by how they ended: label outcome
//	                                   (value, error, panic, timeout, offered)
//	epcache_room_wait_duration_seconds waits for room under MaxEntries
//
// The histograms are epcache's own, converted: bucket i of an
// [epcache.Histogram] becomes le = [epcache.HistogramBound](i) in seconds
// (1e-06, 2e-06, … 67.108864), cumulative, and its last bucket, which has
// no bound, counts only in le="+Inf"; the sum is Histogram.Sum in seconds.
// Nothing is recorded twice: a scrape reads the cache's counters.
//
// A tcp peer ([Collector.AddTCP]) adds its transport's figures, from
// tcp.Stats, with the same cache label:
//
//	epcache_tcp_dial_attempts_total            TCP connects tried
//	epcache_tcp_connections_dialed_total       TCP connects that succeeded
//	epcache_tcp_connections_accepted_total     connections accepted, strangers included
//	epcache_tcp_connections_closed_total       connection ends closed, for any reason
//	epcache_tcp_duplicates_closed_total        of those, ends closed because the pair keeps another
//	epcache_tcp_connections_refused_total      accepted connections closed for a bad or missing hello
//	epcache_tcp_connections_abandoned_total    accepted connections closed unused
//	epcache_tcp_lookups_not_published_total    lookups the directory answered "not yet"
//	epcache_tcp_bad_frames_total               connections closed for a frame over MaxFrame
//	epcache_tcp_frames_sent_total              frames written
//	epcache_tcp_frames_received_total          frames delivered to the inbox
//	epcache_tcp_busy_answers_total             accepted connections answered "busy" (MaxConns)
//	epcache_tcp_busy_retries_total             Sends that tried again after "busy"
//	epcache_tcp_resends_total                  Sends that used another connection
//	epcache_tcp_descriptors                    connection descriptors held now (gauge)
//	epcache_tcp_descriptors_peak               their high-water mark (gauge)
//	epcache_tcp_open_connections               connection ends not yet closed (gauge)
//
// # Leases
//
// No metric counts the leases held: epcache keeps no such count, and
// summing them over [epcache.Cache.Peers] walks every key, which a scrape
// should not. epcache_lingering_values counts the values that leases keep
// after the cache gave them up, the figure that shows leases not released;
// the debug page (package observe/debugpage) sums the leases as it walks.
//
// # Scrapes
//
// A scrape calls each cache's Stats, which sums per-stripe counters
// without a lock: it blocks neither hits nor creations, and its figures are
// not an atomic snapshot across fields while the cache is busy. A panic in
// a function given to AddStats is reported as that scrape's error for the
// cache (promhttp answers 500 unless told to continue on errors), never a
// crash.
package epprom
