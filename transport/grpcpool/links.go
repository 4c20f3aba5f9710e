package grpcpool

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/epcache/epcache/epcache"
	"google.golang.org/grpc"
)

// Several connections per address (Config.MaxStreamsPerConn).
//
// Each connection of an address is a value of the cache of its own, under
// a key of its own (linkKey): the address's first connection under the
// address, the others ("links") under the address and their number. So
// every guarantee the pool has for one connection holds for each link
// unchanged: dialed once however many callers need it, never closed under
// a call, released once, counted in MaxConns (the cache's room: growth past
// MaxConns evicts an idle connection or waits, as a first dial does),
// closed by IdleTimeout once unused, dropped alone by a connection error,
// and reached by the health checks, SetMembers and Close, which walk the
// cache's values.
//
// What the pool adds is the choice of a link. streams counts, per link
// number, the calls that run on the link or wait for its dial, and a call
// takes a unit of a link's count before it asks for its connection:
//
//   - A ready link with fewer than MaxStreamsPerConn calls: the least
//     loaded of the ready links the address's calls need, the
//     lowest-numbered ⌈(calls + 1) ÷ MaxStreamsPerConn⌉ (the calls of all
//     its links, this one included), or failing that the lowest-numbered
//     ready link with room. When the load falls, the links it no longer
//     needs all go unused at once, and IdleTimeout closes them together
//     (the first link stays by the rules of one connection per address).
//     Spreading over every ready link instead would keep each in use, and
//     shrink one link per IdleTimeout at best.
//   - Else a link that is not ready (being dialed, or closed since) with
//     room: the call waits for its dial, which it starts if it is the
//     first. So ⌈waiting ÷ MaxStreamsPerConn⌉ dials serve the callers
//     that wait, all at once, each dial once.
//   - Else, below MaxConnsPerAddr, a new link (under streams.mu, which
//     only growth takes).
//   - Else, at MaxConnsPerAddr, the least loaded connection over the
//     limit: gRPC queues the call on the client, as it does with one
//     connection.
//
// A call to a non-member uses the address's first connection only (the
// rule for non-members: the calls that overlap share one connection).

// linkKey is the cache key of addr's link n: addr itself for the first,
// so that a pool without MaxStreamsPerConn is keyed as it always was; for
// the others addr, a NUL and n. An address that holds a NUL itself has the
// suffix on its first link too ("\x000"), so that no address's key is
// another's link: "A\x001" is not A's link 1, whose key is "A\x001" and
// whose address is A, but its own first link "A\x001\x000". The key's last
// NUL is then always the one linkKey put there.
func linkKey(addr string, n int) string {
	if n == 0 && strings.IndexByte(addr, 0) < 0 {
		return addr
	}
	return addr + "\x00" + strconv.Itoa(n)
}

// splitKey is linkKey's inverse, for the keys of a pool under
// MaxStreamsPerConn (without it every key is an address as it is).
func splitKey(key string) (addr string, n int) {
	i := strings.LastIndexByte(key, 0)
	if i < 0 {
		return key, 0
	}
	n, _ = strconv.Atoi(key[i+1:]) // linkKey's: it never fails
	return key[:i], n
}

// firstKey is the cache key of addr's first connection.
func (p *Pool) firstKey(addr string) string {
	if p.cfg.MaxStreamsPerConn == 0 {
		return addr
	}
	return linkKey(addr, 0)
}

// streams is an address's count of calls per link.
type streams struct {
	mu    sync.Mutex              // serialises growth
	links atomic.Pointer[[]*link] // grows only, under mu

	// waiting counts the calls waiting for a growth dial; while there
	// are any, a stream freed on a ready link ends the current round (and
	// puts a new one in its place), so that they look again and one of
	// them takes it rather than wait for the dial.
	waiting atomic.Int32
	roundMu sync.Mutex
	round   *round // under roundMu

	// users counts the calls that use these streams (doStreams, from
	// before their first look to after their end), or is -1 once the
	// streams are dead: tidy took them out of p.streams, so that an
	// address that left keeps no memory. Dead is for good; a call that
	// finds them dead deletes them from p.streams itself, if tidy has not
	// yet, and makes the address new ones.
	users atomic.Int32
}

// round is one round of the calls waiting for growth dials: those that
// looked for a stream before one was freed.
type round struct {
	freed chan struct{} // closed when a stream is freed: its calls look again
	left  chan struct{} // closed once freed is and every call of the round has left its wait
	calls int           // the calls of the round still in their wait, under roundMu
	ended bool          // freed is closed, under roundMu
}

func newRound() *round { return &round{freed: make(chan struct{}), left: make(chan struct{})} }

// joinRound counts a call that is about to look for a stream, and then
// wait for a growth dial, in the current round.
func (s *streams) joinRound() *round {
	s.roundMu.Lock()
	defer s.roundMu.Unlock()
	s.round.calls++
	return s.round
}

// leaveRound uncounts a call of r that has left its wait (or found a
// stream without one).
func (s *streams) leaveRound(r *round) {
	s.roundMu.Lock()
	defer s.roundMu.Unlock()
	if r.calls--; r.calls == 0 && r.ended {
		close(r.left)
	}
}

// end uncounts a call on l; if that freed a stream of a ready link that
// was full, it wakes the calls waiting for a growth dial. Under MaxConns
// it returns only once they have left their waits: the caller releases
// its lease of l after end, and a growth dial still in the cache's line
// for room would evict l, unleased, at once, for a connection that no
// call needs any more (the woken call takes the stream freed on l).
func (p *Pool) end(s *streams, l *link) {
	if l.calls.Add(-1) != int32(p.cfg.MaxStreamsPerConn)-1 || s.waiting.Load() == 0 || !p.ready(l) {
		return
	}
	s.roundMu.Lock()
	r := s.round
	s.round = newRound()
	r.ended = true
	close(r.freed)
	if r.calls == 0 {
		close(r.left)
	}
	s.roundMu.Unlock()
	if p.cfg.MaxConns > 0 {
		<-r.left // each leaves at once: its wait's context ends with freed
	}
}

// link is one of an address's links: its cache key, and the calls that
// run on it or wait for its dial.
type link struct {
	key   string
	calls atomic.Int32
}

// tryAdd counts a call on l unless l carries max calls already.
func (l *link) tryAdd(max int32) bool {
	for {
		n := l.calls.Load()
		if n >= max {
			return false
		}
		if l.calls.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// useStreams returns addr's streams, made on first use, counting the call
// as one of its users until doneStreams.
func (p *Pool) useStreams(addr string) *streams {
	for {
		s := p.streamsOf(addr)
		for n := s.users.Load(); n >= 0; n = s.users.Load() {
			if s.users.CompareAndSwap(n, n+1) {
				return s
			}
		}
		p.streams.CompareAndDelete(addr, s) // dead: help tidy, then make new ones
	}
}

// doneStreams uncounts a user of s, addr's streams; the last call to a
// non-member tidies them away, and so does the last call to a member that
// found no connection (noConn: its dial failed), which no connection's
// close would tidy.
func (p *Pool) doneStreams(addr string, s *streams, noConn bool) {
	if s.users.Add(-1) == 0 && (noConn || !p.isMember(addr)) {
		p.tidy(addr, noConn)
	}
}

// tidy deletes addr's streams from p.streams if none of its links has a
// call, a connection, a dial in flight or a remembered dial failure, and
// addr is not a member or anyMember (one of its connections has closed,
// or its last call found none: a member's streams may be idle too): its
// next call starts from a first link, as a new address does, and nothing
// is lost. A call that is just reserving holds the streams as a user, so
// tidy leaves them; a dial in flight, whose caller may have left, keeps
// them until its connection, published, closes, so that the link it
// publishes is one the counts know; a remembered failure keeps them for
// SetMembers and Forget to find. It runs when an address leaves the
// members, when a non-member's last call ends, when a member's last call
// found no connection, and when one of an address's connections closes,
// so that addresses that come and go without SetMembers keep no memory
// either.
func (p *Pool) tidy(addr string, anyMember bool) {
	v, ok := p.streams.Load(addr)
	if !ok || !anyMember && p.isMember(addr) {
		return
	}
	s := v.(*streams)
	if s.users.Load() != 0 {
		return
	}
	for _, l := range *s.links.Load() {
		if _, held := p.cache.Peer(l.key); held {
			return
		}
	}
	if s.users.CompareAndSwap(0, -1) {
		p.streams.CompareAndDelete(addr, s)
	}
}

// streamsOf returns addr's streams, made on first use (dead ones
// included: see useStreams).
func (p *Pool) streamsOf(addr string) *streams {
	if s, ok := p.streams.Load(addr); ok {
		return s.(*streams)
	}
	s := &streams{}
	first := []*link{{key: linkKey(addr, 0)}}
	s.links.Store(&first)
	s.round = newRound()
	got, _ := p.streams.LoadOrStore(addr, s)
	return got.(*streams)
}

// keysOf returns the cache keys of addr's links: addr alone for an address
// that has never had more than one.
func (p *Pool) keysOf(addr string) []string {
	s, ok := p.streams.Load(addr)
	if !ok {
		return []string{p.firstKey(addr)}
	}
	links := *s.(*streams).links.Load()
	keys := make([]string, len(links))
	for i, l := range links {
		keys[i] = l.key
	}
	return keys
}

// ready reports whether l's connection is in the pool now.
func (p *Pool) ready(l *link) bool {
	_, ok := p.cache.Load(l.key)
	return ok
}

// anyReady reports whether one of links is ready.
func (p *Pool) anyReady(links []*link) bool {
	for _, l := range links {
		if p.ready(l) {
			return true
		}
	}
	return false
}

// pickReady counts a call on the ready link the rule above picks, among
// those with fewer than max calls, and leases its connection; ok is false
// if no ready link has room.
func (p *Pool) pickReady(links []*link, max int32) (l *link, lease epcache.Lease[string, *conn], ok bool) {
	for {
		var total int64
		for _, l := range links {
			total += int64(l.calls.Load())
		}
		need := int(total/int64(p.cfg.MaxStreamsPerConn)) + 1 // links that carry total+1 calls
		best, first, seen := -1, -1, 0
		for i, l := range links {
			if !p.ready(l) {
				continue
			}
			n := l.calls.Load()
			if n >= max {
				seen++
				continue
			}
			if first < 0 {
				first = i
			}
			if seen < need && (best < 0 || n < links[best].calls.Load()) {
				best = i
			}
			seen++
		}
		if best < 0 {
			best = first
		}
		if best < 0 {
			return nil, lease, false
		}
		l = links[best]
		if !l.tryAdd(max) {
			continue // filled meanwhile: pick again
		}
		lease, err := p.cache.Acquire(p.probe, l.key)
		if err != nil {
			l.calls.Add(-1) // gone meanwhile: pick again
			continue
		}
		return l, lease, true
	}
}

// reserve counts a call on a link with room, ready or not, growing the
// address's links if none has room and MaxConnsPerAddr allows; at the bound
// it counts the call on the least loaded link, over the limit.
func (p *Pool) reserve(s *streams) *link {
	max := int32(p.cfg.MaxStreamsPerConn)
	s.mu.Lock()
	defer s.mu.Unlock()
	links := *s.links.Load()
	// Ready links first; then any with room, ready or not: a link that
	// became ready after the first pass looked at it has room all the
	// same, and skipping it would grow a link nobody needs.
	for _, l := range links {
		if p.ready(l) && l.tryAdd(max) {
			return l
		}
	}
	for _, l := range links {
		if l.tryAdd(max) {
			return l
		}
	}
	if p.cfg.MaxConnsPerAddr == 0 || len(links) < p.cfg.MaxConnsPerAddr {
		addr, _ := splitKey(links[0].key)
		l := &link{key: linkKey(addr, len(links))}
		l.calls.Store(1)
		grown := append(links[:len(links):len(links)], l)
		s.links.Store(&grown)
		return l
	}
	least := links[0]
	for _, l := range links[1:] {
		if l.calls.Load() < least.calls.Load() {
			least = l
		}
	}
	least.calls.Add(1)
	return least
}

// doStreams is Do for a member under MaxStreamsPerConn.
func (p *Pool) doStreams(ctx context.Context, addr string, call func(ctx context.Context, cc grpc.ClientConnInterface) error) error {
	s := p.useStreams(addr)
	noConn := false
	defer func() { p.doneStreams(addr, s, noConn) }()
	if l, lease, ok := p.pickReady(*s.links.Load(), int32(p.cfg.MaxStreamsPerConn)); ok {
		defer lease.Release() // after end: see end
		defer p.end(s, l)
		return p.call(ctx, lease.Value(), call)
	}
	if p.anyReady(*s.links.Load()) {
		p.st.streamWaits.Add(1) // every stream taken; a first dial is no wait for a stream
	}
	for {
		// Counted as waiting before the round is read, so that a stream
		// freed after this look wakes it (streams.end).
		s.waiting.Add(1)
		r := s.joinRound()
		if l, lease, ok := p.pickReady(*s.links.Load(), int32(p.cfg.MaxStreamsPerConn)); ok {
			s.waiting.Add(-1)
			s.leaveRound(r)
			defer lease.Release() // after end: see end
			defer p.end(s, l)
			return p.call(ctx, lease.Value(), call)
		}
		l := p.reserve(s)
		wctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-r.freed:
				cancel()
			case <-wctx.Done():
			}
		}()
		// As doCounted: the call counts itself while it waits for the
		// link's dial.
		p.join(addr)
		lease, err := p.cache.Acquire(wctx, l.key)
		woken := err != nil && ctx.Err() == nil && wctx.Err() != nil
		cancel()
		s.waiting.Add(-1)
		s.leaveRound(r)
		if err != nil {
			p.end(s, l)
			p.leave(addr)
			switch {
			case woken:
				continue // a stream was freed on a ready link: look again
			case errors.Is(err, errAbandoned):
				p.cache.Forget(l.key)
				continue
			case ctx.Err() == nil && !errors.Is(err, epcache.ErrClosed):
				// The growth dial failed (or ErrorTTL answers with its
				// failure): the call runs over the limit on a ready
				// connection, where gRPC queues it, rather than fail
				// while the address has one.
				if l, lease, ok := p.pickReady(*s.links.Load(), math.MaxInt32); ok {
					defer lease.Release() // after end: see end
					defer p.end(s, l)
					return p.call(ctx, lease.Value(), call)
				}
			}
			noConn = true
			return p.noConn(ctx, addr, err)
		}
		if c := lease.Value(); dropCause(c.cause.Load()) != notDropped {
			p.drop(c, notDropped)
			lease.Release()
			p.end(s, l)
			p.leave(addr)
			continue
		}
		// As run, with end before the lease's release (see end).
		defer func() {
			p.end(s, l)
			p.leave(addr)
			lease.Release()
		}()
		return p.call(ctx, lease.Value(), call)
	}
}

// ConnsTo returns the number of addr's connections in the pool now, ready
// for calls: at most 1 without Config.MaxStreamsPerConn.
func (p *Pool) ConnsTo(addr string) int {
	n := 0
	for _, key := range p.keysOf(addr) {
		if _, ok := p.cache.Load(key); ok {
			n++
		}
	}
	return n
}
