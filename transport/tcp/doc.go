// Package tcp is an example of a messaging layer built on
// [github.com/epcache/epcache/epcache]: peers on loopback TCP that find each
// other through a [github.com/epcache/epcache/transport/directory] and keep
// one connection per pair of peers. It shows how to use the cache for
// endpoints; it is not a framework (no authentication, no reconnection
// policy beyond the cache's, no flow control beyond TCP's).
//
// A [Peer] has a numeric id (its number in the directory), a listener (on
// 127.0.0.1 unless Config.ListenAddr says otherwise) whose address it
// publishes, and an epcache.Cache from peer id to
// connection. [Peer.Send] gets the connection from the cache and writes one
// length-prefixed frame; [Peer.Recv] returns the frames that the peer's
// reader goroutines (one per connection) deliver. [Peer.Stats] has the
// counters a benchmark reads: connections dialed, accepted, closed,
// duplicates closed, dial attempts, descriptors held, and the cache's own
// (evictions, idle removals, waits for room); [Peer.DebugSource] gives them
// by name, to observe/debugpage's Handler.AddSource.
//
// # Connecting
//
// The cache's Create for peer r looks r up in the directory, dials, and runs
// a handshake. While the directory says r has not published its address, a
// directory that implements directory.Resolver (the in-process one does)
// is asked to wait for it: Resolve, within Config.CreateTimeout. With
// another directory the lookup fails with directory.ErrNotPublished, which
// [Retryable] and so the default Config.Retry retry (with backoff, within
// Config.CreateTimeout). Every other failure is final, and remembered for
// Config.ErrorTTL so that senders to a dead peer fail at once instead of
// redialing it; but a failure at an address the directory no longer gives
// for r (r published again: see Failures) is not r's. A dial that finds the
// address stale (refused: nothing listens there; or another peer answers)
// reports it to a Resolver with Unreachable, and dials again at once if the
// directory has another address for r by then. Release closes the
// connection. A failed write reports the connection with
// CompareAndInvalidate, so that the next Send reconnects, exactly once
// however many goroutines saw the failure, and a late report never drops the
// replacement. A reader that sees the connection end does the same.
//
// # One connection per pair
//
// When two peers first send to each other at the same time, both dial.
// Both connections could serve, but the pair must keep one: both ends must
// send on the same connection, the accepting side included, and neither may
// leak. As in Open MPI's TCP transport, the tie is broken by id: the
// connection dialed by the lower id wins.
//
// The cache holds every endpoint, dialed or accepted: an accepted
// connection goes in with epcache's Offer, which answers a creation of the
// same peer in flight (its Gets get the accepted connection at once, and
// the creation's context is cancelled with cause epcache.ErrOffered). Beside
// the cache, each peer keeps, under one mutex, a little per other peer r:
// dialing (a Create for r is connecting, and its dial), dialed (the
// connection its last Create returned, until the cache publishes or
// releases it) and last (the last connection from r that its acceptor
// admitted). The cache's Create and the accept path meet there:
//
//   - Create(r) looks r up, then, under the mutex, stops if an Offer has
//     answered it meanwhile (its context is done), and otherwise sets
//     dialing, dials, and sends a hello: its id, its incarnation (new for
//     every [Listen], so a restart is recognisable), a random id for the
//     connection, and last, as dropped: a Create runs only while the cache
//     holds no endpoint for r, so this peer has given that connection up
//     (whether or not its Release has run yet; one this peer dialed needs
//     no naming, see below). Dialing is not set during the lookup, so
//     that a peer still waiting for r's address does not refuse r's own
//     connection.
//   - The acceptor decides under the same mutex, against the endpoint the
//     cache holds for r (or the one Create just returned). It first treats
//     that endpoint as stale if r has restarted, if r says it dropped it,
//     or if r dialed it (r dials only when it holds no endpoint to this
//     peer); it invalidates a stale endpoint (outside the mutex) and
//     decides again, without waiting for that endpoint's Release. Then, if
//     it is not dialing r and holds no endpoint to r, it accepts. If it is
//     (both peers dial at once), it accepts only if r has the lower id, and
//     otherwise answers "duplicate"; a dial of its own that r names as
//     dropped does not count (r accepted it and gave it up before its
//     answer arrived here: r waits for no other connection). An accepted
//     connection is offered to the cache at once, under the mutex, so that
//     a Create for r either sees its context done before it dials or was
//     dialing already. The verdict is written while the connection's write
//     lock is held, so that a Send that gets the connection at once writes
//     after it.
//   - The dialer, on "accept", returns its connection as the endpoint. On
//     "duplicate" it closes it and waits, up to Config.HandshakeTimeout, for
//     the winner, which r dialed and this peer's accept path offers to the
//     cache (answering this creation); if it does not arrive (r's own
//     attempt failed), Create fails with [ErrSuperseded], which [Retryable]
//     retries.
//
// Why one connection survives: the decisions are made under the mutex that
// also guards dialing, and the ids order them. Take peers L < H dialing each
// other. H's acceptor, dialing too, accepts L's connection and offers it;
// L's acceptor, dialing too or already holding L's own connection, answers
// H "duplicate"; H's creation was answered by the offer. If instead an
// acceptor finds itself idle, it has not committed to dialing yet, and its
// offer stops its Create before it dials. Either way the loser never
// carries a frame: frames are written only on a connection that got
// "accept". Every duplicate is closed by both ends as soon as it is decided
// (a dial cut short by an offer counts as one), and counted in
// Stats.Duplicates. A dial whose answer had arrived when it was cut short
// is no duplicate: its answer is read and honoured (a connection r
// accepted may carry r's frames already, and is closed gracefully if the
// pair keeps another).
//
// # Sending under a lease
//
// [Peer.Send] holds an epcache lease on the connection while it writes: a
// failure report (CompareAndInvalidate, by any Send or by the connection's
// reader) drops the connection from the cache at once, so that the next
// Send reconnects, but the cache closes it only when the last Send using it
// is done, and neither eviction nor an idle sweep takes a leased
// connection. No connection is closed under a frame being written, except
// by [Peer.Close], which aborts the writes in flight. A Send that finds its
// connection unusable before it has written a byte (a failed read, a
// broken stream, or the other end closing its side) drops it and sends on
// another, so that the frame goes once. A connection this peer drops
// leaves the cache at once, and its Release (which may wait for the other
// end) runs on a goroutine of its own: neither a Send nor the acceptor
// waits for it.
//
// # Closing gracefully
//
// A connection the cache gives up while it works (eviction, idle removal, a
// stale endpoint, a failure report, a write cut short) is closed in two
// steps (conn.shutdown), so that no frame in flight is lost. This end
// closes its sending side (shutdown(SHUT_WR)): the other end's reader gets
// every frame written before (after a write cut short: the part of it, then
// the end, and the reader drops the connection), then the end of the
// stream, and drops the connection with CompareAndInvalidate. This end goes
// on reading meanwhile, and drains: its reader no longer waits for room in
// the inbox (frames that find it full wait beside the connection, in order,
// and reach the inbox after it), so that it reads to the other end's close
// whatever this peer's receiver does, and never closes a socket with
// unread data (which makes the kernel reset the connection and discard
// what the other end's Sends reported sent). The other end may still write
// on a connection whose reader has not seen the end (a reader waiting for
// room in a full inbox does not read it): so a Send asks the kernel, right
// before its write, whether the other end has closed its side (on Linux:
// the connection's TCP state), and if so writes nothing, and sends on
// another connection. The other end closes once its last Send is done; this
// end's reader then sees the end, and only then is the descriptor closed.
// A peer that stays silent for HandshakeTimeout while this end waits (not a
// byte arrives: it is hung) is cut off. The cache's Release returns once
// the descriptor is closed. A connection that failed is closed at once.
//
// While the inbox is full, a reader holds a lease on its connection, and
// every frame read marks the connection used: a connection the other end
// keeps writing on is neither idle nor unused when the clock hand passes
// it here.
//
// What a Send that returns nil means follows: its whole frame was written
// on a connection whose other end had not closed its side when the Send
// looked, and the other end reads every frame up to the end of the stream,
// whichever end closes the connection and however slowly its receiver
// takes frames. See [Peer.Send] for what still loses a frame.
//
// # A bound on descriptors
//
// Config.MaxConns bounds, at every instant, the connection descriptors a
// peer holds, whatever they are doing: dials in their handshake, accepted
// connections before their verdict, connections in the cache, connections
// being closed. It is split in two budgets that together cover every
// descriptor from before the system call that makes it to after the one
// that closes it:
//
//   - the cache's room (epcache's MaxEntries, MaxConns-1): a creation takes
//     a unit before Create starts and holds at most one descriptor at a
//     time (its dial; a connection handed to it is taken only once that
//     dial is closed), and the connection it returns keeps the unit until
//     Release, which closes the descriptor before it returns; an Offer
//     takes a unit before the cache owns the connection;
//   - one accept slot: the acceptor calls Accept only while it holds the
//     slot, and the accepted connection keeps it until the cache owns it
//     (its room covers it then) or it is closed. The other connections
//     wait in the kernel's backlog meanwhile, and a connection that says
//     nothing holds the slot for an eighth of HandshakeTimeout, a second at
//     most, not for HandshakeTimeout: a dial waiting behind it in the
//     backlog has that budget for its whole handshake. A dialer of this
//     package writes its hello as soon as its connect returns; one that is
//     that late is answered "late" (a refusal with reason 6), and its Send
//     tries again, as after "busy".
//
// Stats.Descriptors counts the same way (up before a dial or accept call,
// down after a close), and its high-water mark never exceeds MaxConns.
//
// An accepted connection joins the cache through Offer when the cache has
// room for it at once and nobody waits for room. Otherwise, if a Create for
// the dialer runs (the simultaneous connect above, or one waiting for the
// dialer), the acceptor hands the connection to it (link.inbound): the
// Create returns it, in its own room, and a dial of its own in flight is cut
// short, as an Offer would cut it. Otherwise the acceptor answers "busy"
// (a refusal with reason 5) at once, closes the connection, and connects
// back: a Get for the dialer, which waits for room in line with this
// peer's Sends, evicting a connection no Send is writing on as
// [epcache.Config.MaxEntries] chooses one.
//
// The dialer's side of "busy" is what keeps a mesh of full peers from
// deadlocking. A dialer that waits for the connection back holds room (its
// creation's) while the peer it dialed waits for room (the connection back
// waits in line there): a cycle of such waits (A for B, B for C, C for A),
// each holding what the next waits for, would stall every peer in it until
// timeouts. So only waits that climb the ids may hold room: a dialer
// answered "busy" keeps its room and waits (up to HandshakeTimeout) for the
// connection back only if it has the lower id. The higher gives its room
// up at once: its creation fails with [ErrBusy], which [Retryable] does not
// retry, and its Send waits a little and tries again, holding nothing (it
// forgets the failure, so that ErrorTTL does not keep it). Every other wait
// ends by itself: the acceptor answers at once (Offer, hand-off,
// "duplicate" or "busy"), and holds the accept slot only for a handshake.
// The highest peer's waits therefore all end, then those of the next, and
// so on down.
//
// A connection made back can cross the dial it answers: the higher answers
// "busy" and its connection arrives while the lower still waits for that
// answer, so the lower, dialing, answers it "duplicate". The lower notes
// it (link.crossed) and, told "busy", dials again at once: the higher's
// creation, waiting for the lower's connection since its "duplicate",
// takes it by hand-off.
//
// # Wire format
//
// The dialer sends a hello, the acceptor a reply; integers are big-endian,
// and both start with the magic "epT" and the protocol version, 1:
//
//	hello: "epT" 1 | from uint32 | to uint32 | incarnation uint64 | nonce uint64 | dropped uint64   (36 bytes)
//	reply: "epT" 1 | verdict uint8 | reason uint8 | 0 0 | from uint32 | incarnation uint64          (20 bytes)
//
// Verdicts are 1 (accept), 2 (duplicate) and 3 (refused); reasons of a
// refusal are 1 (the hello is for another peer: a stale address), 2 (the
// dialer's id is not in the directory), 3 (the dialer claims the acceptor's
// id), 4 (the acceptor is closing) and 5 (busy: the acceptor has no room
// for the connection now, and connects back; see MaxConns), and 6 (late:
// no hello within the acceptor's grace, while it held its accept slot; see
// MaxConns: try again). Something that is not a hello, or no hello within
// Config.HandshakeTimeout, is closed without a reply, and so
// is a hello whose dialer has already closed its end (a dial given up while
// it waited in the backlog: counted in Stats.Abandoned, never offered, so
// that no Send writes a frame into it and reports it sent). After an
// accept, both directions carry frames: a uint32 payload length, at most
// Config.MaxFrame (a larger one closes the connection), then the payload.
//
// # Failures
//
// A peer that dies closes its connections; the other peers' readers see
// the end and drop their endpoints (CompareAndInvalidate). The next Send
// dials again, fails (the listener is gone), and with Config.ErrorTTL that
// failure answers every Send to the dead peer until it expires. A
// restarted peer (a new [Listen] with the same id) publishes its new
// address; once the remembered failure has expired, or as soon as a
// watching directory reports the publication, the next Send connects to
// it, and its hellos replace any stale connection the others still hold
// for its previous life (at once: the stale endpoint's graceful close, which
// may wait for a hung previous life, runs on its own). A failure remembered
// at an address the directory no longer gives (the attempt looked the old
// address up before the peer published again, and failed after the watch
// reported it) is forgotten by the Send that meets it, which connects to
// the new address.
//
// Close of a peer closes its listener, its cache (which releases every
// endpoint), every other connection, and waits for its goroutines.
package tcp
