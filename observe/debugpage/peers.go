package debugpage

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	"github.com/epcache/epcache/epcache"
)

// cachePeers lists the peers of one cache.
type cachePeers[K comparable, V any] struct{ c *epcache.Cache[K, V] }

// list walks the cache's peers once: it counts them all, and keeps the
// first offset+limit of those the query wants, in the query's order, in a
// heap whose top is the last kept. Keys are formatted only for the peers
// shown, unless the query filters by key.
func (cp cachePeers[K, V]) list(q *query, now time.Time) *peersJSON {
	out := &peersJSON{ByState: map[string]int{}, Offset: q.offset, Items: []peerJSON{}}
	var byState [numStates]int
	kept := &peerHeap[K]{q: q, max: q.offset + q.limit}
	for p := range cp.c.Peers() {
		out.Total++
		if int(p.State) < numStates {
			byState[p.State]++
		}
		out.Leases += p.Leases
		out.Waiting += p.Waiting
		if int(p.State) >= numStates || !q.states[p.State] {
			continue
		}
		if q.key != "" && fmt.Sprint(p.Key) != q.key {
			continue
		}
		out.Matched++
		kept.offer(p)
	}
	for st, n := range byState {
		out.ByState[epcache.PeerState(st).String()] = n
	}
	page := kept.sorted()
	if q.offset >= len(page) {
		return out
	}
	for _, p := range page[q.offset:] {
		out.Items = append(out.Items, row(p, now))
	}
	out.Shown = len(out.Items)
	return out
}

// row is what the page shows of p.
func row[K comparable](p epcache.Peer[K], now time.Time) peerJSON {
	r := peerJSON{Key: fmt.Sprint(p.Key), State: p.State.String(), Since: p.Since, Leases: p.Leases, Waiting: p.Waiting, Until: p.Until}
	if !p.Since.IsZero() {
		r.AgeSeconds = max(now.Sub(p.Since), 0).Seconds()
	}
	r.IdleSeconds = p.Idle.Seconds()
	if p.Err != nil {
		r.Error = p.Err.Error()
	}
	if !p.Until.IsZero() {
		r.ExpiresSeconds = p.Until.Sub(now).Seconds()
	}
	return r
}

// peerHeap keeps the first max peers in q's order: a heap whose top is
// the last of them, replaced by any peer that comes before it.
type peerHeap[K comparable] struct {
	q     *query
	max   int
	peers []epcache.Peer[K]
}

func (h *peerHeap[K]) offer(p epcache.Peer[K]) {
	if len(h.peers) < h.max {
		heap.Push(h, p)
		return
	}
	if h.cmp(&p, &h.peers[0]) < 0 {
		h.peers[0] = p
		heap.Fix(h, 0)
	}
}

// sorted returns the peers kept, in q's order.
func (h *peerHeap[K]) sorted() []epcache.Peer[K] {
	slices.SortStableFunc(h.peers, func(a, b epcache.Peer[K]) int { return h.cmp(&a, &b) })
	return h.peers
}

func (h *peerHeap[K]) cmp(a, b *epcache.Peer[K]) int {
	return h.q.compare(a.State, a.Since, b.State, b.Since)
}

func (h *peerHeap[K]) Len() int           { return len(h.peers) }
func (h *peerHeap[K]) Less(i, j int) bool { return h.cmp(&h.peers[i], &h.peers[j]) > 0 } // the last on top
func (h *peerHeap[K]) Swap(i, j int)      { h.peers[i], h.peers[j] = h.peers[j], h.peers[i] }
func (h *peerHeap[K]) Push(x any)         { h.peers = append(h.peers, x.(epcache.Peer[K])) }
func (h *peerHeap[K]) Pop() any {
	p := h.peers[len(h.peers)-1]
	h.peers = h.peers[:len(h.peers)-1]
	return p
}
