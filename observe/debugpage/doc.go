// Package debugpage serves a page that shows an operator what epcache
// caches hold: every peer (key) of each cache and its state, and each
// cache's totals. It uses the standard library only, so that a program may
// mount it without taking on a metrics system.
//
// Register caches by name with [Add], other figures with [Handler.AddStats],
// [Handler.AddSource] (a transport's, such as transport/tcp's
// Peer.DebugSource) and [Handler.AddCounters], and mount the [Handler]:
//
//	h := debugpage.New()
//	if err := debugpage.Add(h, "endpoints", cache); err != nil {
//		return err
//	}
//	mux.Handle("/debug/epcache/", h)
//
// # What the page shows
//
// For each cache, its totals from [epcache.Cache.Stats] (creations,
// failures, waits, releases, evictions, the room taken, the values alive
// and lingering), the creation latency by outcome (count, mean and the
// 50th, 90th and 99th percentiles, each the upper bound of the bucket that
// holds it, so within a factor of two) and the waits for room; then its
// peers from [epcache.Cache.Peers], one row each:
//
//   - ready: the age of the value (with MaxEntries set; the cache keeps no
//     publication time otherwise), how long it has been idle (with
//     IdleTimeout set), the leases held;
//   - creating: how long ago the creation was claimed, how many callers wait;
//   - failed: the error remembered (ErrorTTL), and when it is forgotten;
//   - straggling: a creation an Offer answered that still runs;
//   - lingering: a value given up that leases still hold, and since when.
//
// Above the rows: how many peers the walk saw in each state, the leases
// held and callers waiting summed over them, and "showing N of M".
//
// # Query parameters
//
// The page is HTML, or JSON with format=json. Every link of the HTML page
// is a query on the same path, so the handler may be mounted anywhere.
//
//   - cache=NAME: show that source only (404 if none has the name).
//   - state=ready,failed,…: show only the peers in these states.
//   - key=K: show only the peer whose key formats (fmt's %v) as K.
//   - sort=state (the default) or age; order=desc (the default) or asc.
//     By state, desc puts lingering, straggling, failed and creating before
//     ready; by age, desc puts the oldest first. Ties go oldest first, then
//     in the table's order.
//   - limit=N: peers per cache, [DefaultPageSize] unless given, at most
//     [MaxPageSize]; offset=N skips the first N. offset+limit may not pass
//     [MaxDepth]: to see peers beyond it, reverse the order or filter.
//   - refresh=S: the HTML page reloads itself every S seconds (1 to 3600).
//
// A bad parameter gets 400 with a message that names it.
//
// # Cost
//
// Reading the page blocks neither hits nor creations: it walks each cache's
// Peers, which takes no lock, once per request. A walk is O(peers) in
// time, and formats keys only for the rows shown (and for every peer with
// key=, which compares formatted keys). It holds at most MaxDepth
// peers of a cache at once, however many the cache has (Peers itself
// allocates a little per peer as it walks). The walk is weakly consistent, as
// [epcache.Cache.All] is: a peer that changes state during it may be shown
// in either state, and the counts are not a snapshot.
//
// # JSON
//
// format=json answers an object with "time" (when the page was made), the
// query as understood ("sort", "order", "states", "key", "offset",
// "limit") and "sources", one per source shown, in name order. A source has
// "name", and whichever of these it has:
//
//   - "stats", the cache's totals: "creates", "create_errors", "attempts",
//     "waits", "cancels", "error_hits", "releases", "release_panics",
//     "offers", "evictions", "idle_removals", "room_waits", "room", "live",
//     "ready", "lingering" (the fields of epcache.Stats), and
//     "create_latency" by outcome name ("value", "error", "panic",
//     "timeout", "offered") and "room_wait", each with "count",
//     "sum_seconds", "mean_seconds", "p50_seconds", "p90_seconds" and
//     "p99_seconds"; a percentile is null when nothing was counted or when
//     it lies in the last bucket, past 2^26 µs (about 67 s);
//   - "peers": "total" (peers the walk saw), "by_state", "leases" and
//     "waiting" (summed over the walk), "matched" (peers the filters kept),
//     "offset", "shown", and "items", each with "key", "state", and those
//     of "since", "age_seconds", "idle_seconds", "leases", "waiting",
//     "error", "until" and "expires_seconds" (until "until") that are not
//     zero;
//   - "counters": name to value;
//   - "error": reading the source panicked (the panic's value).
package debugpage
