//go:build ucx

package ucx

// Held returns the endpoint p's cache holds for peer r, if it holds one.
func Held(p *Peer, r int) (*Endpoint, bool) { return p.cache.Load(r) }
