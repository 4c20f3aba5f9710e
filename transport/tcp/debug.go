package tcp

import "github.com/epcache/epcache/epcache"

// DebugSource returns p's figures for a page or exporter that takes any
// source of counters by name, such as observe/debugpage's
// Handler.AddSource:
//
//	h.AddSource("peer 0", p.DebugSource())
//
// This package imports no such page, and the page no transport, so that
// a program links only what it uses.
func (p *Peer) DebugSource() DebugSource { return DebugSource{p} }

// DebugSource is a [Peer]'s figures by name; make one with
// [Peer.DebugSource]. Two made from the same peer are equal, so that a
// registry comparing sources refuses the peer twice.
type DebugSource struct{ p *Peer }

// CacheStats returns the totals of the peer's endpoint cache, Stats().Cache.
func (s DebugSource) CacheStats() epcache.Stats { return s.p.Stats().Cache }

// Counters returns every number of the peer's [Stats] but the cache's
// (which CacheStats returns), by field name, and Open.
func (s DebugSource) Counters() map[string]float64 {
	st := s.p.Stats()
	return map[string]float64{
		"DialAttempts":    float64(st.DialAttempts),
		"Dialed":          float64(st.Dialed),
		"Accepted":        float64(st.Accepted),
		"Closed":          float64(st.Closed),
		"Duplicates":      float64(st.Duplicates),
		"Refused":         float64(st.Refused),
		"Abandoned":       float64(st.Abandoned),
		"NotPublished":    float64(st.NotPublished),
		"BadFrames":       float64(st.BadFrames),
		"Sent":            float64(st.Sent),
		"Received":        float64(st.Received),
		"Busy":            float64(st.Busy),
		"BusyRetries":     float64(st.BusyRetries),
		"Resent":          float64(st.Resent),
		"Descriptors":     float64(st.Descriptors),
		"PeakDescriptors": float64(st.PeakDescriptors),
		"Open":            float64(st.Open()),
	}
}
