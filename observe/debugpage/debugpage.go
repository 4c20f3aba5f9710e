package debugpage

import (
	"errors"
	"fmt"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/internal/registry"
)

// Errors of registration, for errors.Is.
var (
	// ErrBadName: the name is empty or not valid UTF-8.
	ErrBadName = errors.New("debugpage: a source's name must be non-empty UTF-8")
	// ErrNameTaken: another source has the name.
	ErrNameTaken = errors.New("debugpage: name already registered")
	// ErrAlreadyAdded: the cache (or source) is registered under another
	// name.
	ErrAlreadyAdded = errors.New("debugpage: already registered")
	// ErrNil: the handler, cache, source or function is nil.
	ErrNil = errors.New("debugpage: nil")
)

// Handler serves the debug page of the sources registered with it: an
// http.Handler for GET and HEAD. Its methods are safe for concurrent use,
// with each other and with requests. Make one with [New].
//
// Registering and removing take a mutex that a request holds only to copy
// the list of sources: a request walking a million peers delays neither.
type Handler struct {
	sources registry.Registry[*source]
}

// New returns a handler with no source: its page says so.
func New() *Handler { return &Handler{} }

var errs = registry.Errors{BadName: ErrBadName, NameTaken: ErrNameTaken, AlreadyAdded: ErrAlreadyAdded}

// source is one registered name, immutable once registered: the page shows
// whichever of stats, peers and counters it has.
type source struct {
	name     string
	owner    any // the cache or peer behind it, if any
	stats    func() epcache.Stats
	peers    peerLister
	counters func() map[string]float64
}

// peerLister is a cache's side of the page: it walks the cache's peers once
// and returns the part the query asks for. Generic over the cache's key and
// value types, so that keys are formatted only for the peers shown.
type peerLister interface {
	list(q *query, now time.Time) *peersJSON
}

// Add registers c under name: the page shows its totals and its peers, each
// key formatted with fmt's %v. It returns an error, and registers nothing,
// if h or c is nil ([ErrNil]), if name is empty ([ErrBadName]), if another
// source has the name ([ErrNameTaken]) or if c is registered already under
// another name ([ErrAlreadyAdded]).
func Add[K comparable, V any](h *Handler, name string, c *epcache.Cache[K, V]) error {
	if c == nil {
		return fmt.Errorf("%w cache for %q", ErrNil, name)
	}
	return h.add(&source{name: name, owner: c, stats: c.Stats, peers: cachePeers[K, V]{c}})
}

// AddStats registers stats under name: the page shows the totals it
// returns, for a cache whose Peers are out of reach (a transport's own). It
// is called once per request; a panic in it is shown as the source's error.
// Errors as for [Add].
func (h *Handler) AddStats(name string, stats func() epcache.Stats) error {
	if stats == nil {
		return fmt.Errorf("%w stats function for %q", ErrNil, name)
	}
	return h.add(&source{name: name, stats: stats})
}

// Source is what the page shows of something whose peers it cannot walk,
// such as a transport: the totals of the endpoint cache behind it, and
// figures of its own by name. transport/tcp's Peer.DebugSource is one;
// this package imports no transport, so that a program serving the page
// links only the transports it uses.
type Source interface {
	// CacheStats returns the endpoint cache's totals.
	CacheStats() epcache.Stats
	// Counters returns the source's own figures by name.
	Counters() map[string]float64
}

// AddSource registers s under name: the page shows the totals and the
// figures it returns, sorted by name. Both methods are called once per
// request; a panic in either is shown as the source's error. Errors as
// for [Add]; s registered twice (compared with ==, when its type is
// comparable) is [ErrAlreadyAdded].
func (h *Handler) AddSource(name string, s Source) error {
	if s == nil {
		return fmt.Errorf("%w source for %q", ErrNil, name)
	}
	var owner any
	if hashable(s) {
		owner = s
	}
	return h.add(&source{name: name, owner: owner, stats: s.CacheStats, counters: s.Counters})
}

// hashable reports whether v can be a map key: not a slice, map or func,
// nor a struct or array that holds one, directly or in an interface.
func hashable(v any) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	_ = map[any]bool{v: true}
	return true
}

// AddCounters registers counters under name: the page shows the figures
// it returns, by name, sorted. It is called once per request; a panic in
// it is shown as the source's error. Errors as for [Add].
func (h *Handler) AddCounters(name string, counters func() map[string]float64) error {
	if counters == nil {
		return fmt.Errorf("%w counters function for %q", ErrNil, name)
	}
	return h.add(&source{name: name, counters: counters})
}

// Remove unregisters the source called name, reporting whether there was
// one. A request under way may still show it.
func (h *Handler) Remove(name string) bool {
	return h != nil && h.sources.Remove(name)
}

func (h *Handler) add(s *source) error {
	if h == nil {
		return fmt.Errorf("%w Handler: make one with debugpage.New", ErrNil)
	}
	return h.sources.Add(s.name, s.owner, s, errs)
}
