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
// inc, dropped nonce dropped) reaching peer me, which is dialing from or
// not, and holds held (nil: nothing). It reports the verdict and whether the
// held endpoint is given up.
func Decide(me, from int, inc, dropped uint64, dialing bool, held *Held) (accept, dropHeld bool) {
	lk := &link{dialing: dialing}
	if held != nil {
		lk.current = &conn{remote: from, remoteInc: held.RemoteInc, nonce: held.Nonce, dialed: held.DialedBy == "acceptor"}
	}
	h := hello{from: uint32(from), to: uint32(me), inc: inc, nonce: 99, dropped: dropped}
	accept, stale := lk.decide(me, &h)
	return accept, stale != nil
}
