// Package epotel reports epcache's figures as OpenTelemetry metrics:
// asynchronous instruments, observed from each cache's Stats when the
// meter's reader collects, for any number of caches, each named by the
// attribute epcache.cache.name.
//
//	m, err := epotel.New(provider.Meter("github.com/epcache/epcache"))
//	if err != nil {
//		return err
//	}
//	defer m.Close()
//	if err := epotel.Add(m, "endpoints", cache); err != nil {
//		return err
//	}
//
// It is a module of its own, so that a program importing epcache does not
// get OpenTelemetry.
//
// # Instruments
//
// Every observation has the attribute epcache.cache.name, the name given
// to [Add], [Metrics.AddStats] or [Metrics.AddTCP]. Counters
// (Int64ObservableCounter), from [epcache.Stats]:
//
//	epcache.creates            {creation}  creations that produced a value
//	epcache.create.errors      {creation}  creations whose callers got an error (after retries)
//	epcache.create.attempts    {attempt}   calls of Create, retries included
//	epcache.waits              {get}       Gets that waited on a creation another Get started
//	epcache.cancels            {get}       waiting Gets that left because their context ended
//	epcache.error_hits         {get}       Gets answered with a remembered failure
//	epcache.releases           {value}     values given up and released
//	epcache.release.panics     {release}   Release calls that panicked
//	epcache.offers             {value}     values stored by Offer
//	epcache.evictions          {value}     values removed to make room under MaxEntries
//	epcache.idle_removals      {value}     values removed by IdleTimeout
//	epcache.room.waits         {creation}  creations that waited for room under MaxEntries
//
// What the cache holds now (Int64ObservableUpDownCounter: the figures add
// up across caches):
//
//	epcache.entries            {entry}     values held, ready for a Get (Stats.Ready, Cache.Len)
//	epcache.room.used          {value}     room taken under MaxEntries (0 without)
//	epcache.values.live        {value}     values created or offered and not yet released
//	epcache.values.lingering   {value}     values given up that leases still hold
//
// # Durations
//
// OpenTelemetry has no asynchronous histogram, and epcache records its
// durations into histograms of its own ([epcache.Histogram]) that a
// synchronous OTel histogram could only copy by recording each creation
// twice, on the creation's path. So the histograms are exported as their
// count and their sum, both counters, from which a backend derives the mean
// over any window (rate of the sum over rate of the count):
//
//	epcache.create.outcomes    {creation}  creations ended, attribute epcache.create.outcome
//	                                       (value, error, panic, timeout, offered)
//	epcache.create.time        s           their total duration, by the same attribute
//	                                       (Float64ObservableCounter)
//	epcache.room.wait.time     s           the total duration of waits for room
//	                                       (Float64ObservableCounter; their count is
//	                                       epcache.room.waits)
//
// For percentiles, use the Prometheus collector (module observe/prometheus,
// the full buckets) or the debug page (package observe/debugpage).
//
// A tcp peer ([Metrics.AddTCP]) adds its transport's figures, from
// tcp.Stats, with the same attribute:
//
//	epcache.tcp.dial.attempts            {attempt}     TCP connects tried
//	epcache.tcp.connections.dialed       {connection}  TCP connects that succeeded
//	epcache.tcp.connections.accepted     {connection}  connections accepted, strangers included
//	epcache.tcp.connections.closed       {connection}  connection ends closed, for any reason
//	epcache.tcp.duplicates.closed        {connection}  of those, closed because the pair keeps another
//	epcache.tcp.connections.refused      {connection}  accepted, closed for a bad or missing hello
//	epcache.tcp.connections.abandoned    {connection}  accepted, closed unused
//	epcache.tcp.lookups.not_published    {lookup}      lookups the directory answered "not yet"
//	epcache.tcp.bad_frames               {connection}  connections closed for a frame over MaxFrame
//	epcache.tcp.frames.sent              {frame}       frames written
//	epcache.tcp.frames.received          {frame}       frames delivered to the inbox
//	epcache.tcp.busy.answers             {connection}  accepted connections answered "busy"
//	epcache.tcp.busy.retries             {send}        Sends that tried again after "busy"
//	epcache.tcp.resends                  {send}        Sends that used another connection
//	epcache.tcp.descriptors              {descriptor}  descriptors held now (up-down counter)
//	epcache.tcp.connections.open         {connection}  connection ends not yet closed (up-down counter)
//	epcache.tcp.peak_descriptors         {descriptor}  the high-water mark of descriptors (gauge)
//
// # Leases
//
// No instrument counts the leases held: epcache keeps no such count, and
// summing them over [epcache.Cache.Peers] walks every key, which a
// collection should not. epcache.values.lingering counts the values that
// leases keep after the cache gave them up, the figure that shows leases
// not released.
//
// # Collection
//
// One callback observes every instrument, reading each cache's Stats once:
// it blocks neither hits nor creations, and its figures are not an atomic
// snapshot across fields while the cache is busy. A panic in a function
// given to AddStats becomes the callback's error for that cache (the
// reader's Collect returns it), never a crash; the other caches are still
// observed.
package epotel
