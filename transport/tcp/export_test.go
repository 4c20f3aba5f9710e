package tcp

// Endpoint returns the local and remote addresses of the connection p's
// cache holds for peer r, if it holds one.
func Endpoint(p *Peer, r int) (local, remote string, ok bool) {
	c, ok := p.cache.Load(r)
	if !ok {
		return "", "", false
	}
	return c.nc.LocalAddr().String(), c.nc.RemoteAddr().String(), true
}

// BreakEndpoint closes the socket under p's endpoint for peer r behind the
// cache's back, as a network failure would, and reports whether there was
// one.
func BreakEndpoint(p *Peer, r int) bool {
	c, ok := p.cache.Load(r)
	if ok {
		_ = c.nc.Close()
	}
	return ok
}

// Held describes the connection an acceptor holds as its endpoint for the
// dialing peer, for Decide.
type Held struct {
	RemoteInc uint64 // the dialing peer's incarnation when it was made
	Nonce     uint64
	DialedBy  string // "acceptor" or "dialer"
}

// Decide runs the acceptor's rule for a hello from peer from (incarnation
// inc, dropped nonce dropped) reaching peer me, which is dialing from (its
// dial in flight named dialNonce) or not, and holds held (nil: nothing). It
// reports the verdict and whether the held endpoint is given up.
func Decide(me, from int, inc, dropped uint64, dialing bool, dialNonce uint64, held *Held) (accept, dropHeld bool) {
	var cur, dial *conn
	if held != nil {
		cur = &conn{remoteInc: held.RemoteInc, nonce: held.Nonce, dialed: held.DialedBy == "acceptor"}
	}
	if dialNonce != 0 {
		dial = &conn{nonce: dialNonce, dialed: true}
	}
	h := hello{from: uint32(from), to: uint32(me), inc: inc, nonce: 99, dropped: dropped}
	accept, stale := decide(me, &h, dialing, dial, cur)
	if stale != nil {
		// The acceptor invalidates the stale endpoint and decides again,
		// holding nothing.
		accept, _ = decide(me, &h, dialing, dial, nil)
		return accept, true
	}
	return accept, false
}

// ReportFailure reports p's endpoint for peer r as failed, as a Send whose
// write failed does (CompareAndInvalidate), and reports whether the cache
// gave it up.
func ReportFailure(p *Peer, r int) bool {
	c, ok := p.cache.Load(r)
	return ok && p.cache.CompareAndInvalidate(r, c)
}

// ClosedUnderWriter counts p's connections closed while a frame was being
// written on them.
func ClosedUnderWriter(p *Peer) uint64 { return p.stats.closedUnderWriter.Load() }

// Writing reports whether a frame is being written on the connection p's
// cache holds for peer r: a Send holds its lease on it.
func Writing(p *Peer, r int) bool {
	c, ok := p.cache.Load(r)
	return ok && c.writing.Load() != 0
}

// RemoteShut is remoteShut, for BenchmarkRemoteShut.
var RemoteShut = remoteShut
