// Package epcache is an exactly-once endpoint cache for messaging layers: one
// value (a connection, a UCX endpoint, a client) per key (a peer), created on
// first use by exactly one goroutine, handed to every goroutine that asked for
// it meanwhile, and released exactly once when the cache gives it up.
//
// The first time many goroutines need the same peer at once, naive code
// either creates several endpoints and leaks the losers (Open MPI's UCX layer,
// ompi #12833) or serialises every creation behind one lock. A [Cache] claims
// the key's slot with one compare-and-swap and runs [Config.Create] once: on
// the claiming caller's goroutine when that caller could never leave (its
// context never ends), otherwise on a goroutine of its own; the other
// callers park on a channel, each able to leave on its own context.
// Creations of different keys never wait for each other, and a hit
// ([Cache.Get] or [Cache.Load] of a ready key) takes no lock, allocates
// nothing and writes no shared memory.
//
// This section is the one full statement of the cache's guarantees; the
// methods' documentation adds only what is particular to each.
//
// # Guarantees
//
//   - Exactly once: for a key, at most one Create runs at a time, and every
//     Get that arrives while it runs receives its outcome.
//   - Each caller leaves on its own context, the one that started the
//     creation included, with one exception: a caller whose context never
//     ends starts a creation without [Config.CreateTimeout] by running
//     Create itself, and returns when Create does (its context could not
//     end; Close, which would have answered it, waits for Create anyway).
//     The creation's context keeps the first caller's
//     values but ends only with CreateTimeout, [Cache.Close] or Create's
//     return.
//   - A failure (after [Config.Retry] gives up) reaches every waiter; nothing
//     is stored unless [Config.ErrorTTL] asks for the error to be remembered.
//     A panic reaches them as a [*PanicError], runtime.Goexit as [ErrGoexit]
//     (a Goexit in a Create running on a caller's goroutine also ends that
//     goroutine, as in any function it calls).
//   - [Config.Release] is called exactly once for every value Create
//     returned: after [Cache.Invalidate] or [Cache.CompareAndInvalidate], at
//     Close, or as soon as a creation that finished too late is known to be
//     unwanted. Never twice, never before the value has left the cache (no
//     Get that begins afterwards returns it), never with a lock held.
//   - A value a [Lease] holds ([Cache.Acquire]) is never released before
//     the lease ends, whatever removed it: Invalidate, Close, eviction or
//     idle removal.
//   - Once a value has left the cache (Invalidate, eviction, idle removal,
//     Close), the cache keeps no reference to it: its Release may be the
//     last use of it. The exception is a value that answered a creation by
//     [Cache.Offer], which that creation holds until its Create returns.
//     What MaxEntries keeps for eviction grows with the values held, not
//     with the values that came and went.
//   - With [Config.MaxEntries], values alive (created, not yet released)
//     plus creations running never exceed it: a creation that needs room
//     evicts an unleased value that has not been used since the clock hand
//     last passed it, choosing among those the one asked for least often
//     (a CLOCK weighed by a frequency sketch), and waits, in line, for its
//     Release to return. With
//     [Config.IdleTimeout], a value unused for about that long is removed
//     and released. Neither costs a hit on a value in use anything.
//   - [Cache.Close] refuses new work, cancels and waits for creations in
//     flight, and releases everything not leased before it returns. A
//     leased value is released by its last lease's Release, which may come
//     after Close; but every Release that began before Close was called
//     has returned when Close does, so a caller may then tear down what
//     Release needs.
//
// The table underneath is package [github.com/epcache/epcache/shard].
package epcache
