package epotel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/internal/registry"
	"github.com/epcache/epcache/transport/tcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Attribute keys.
const (
	// CacheName is the attribute that names the cache of every
	// observation: the name given to Add, AddStats or AddTCP.
	CacheName = attribute.Key("epcache.cache.name")
	// CreateOutcome is the attribute of epcache.create.outcomes and
	// epcache.create.time: how the creations ended (epcache.Outcome's
	// String: value, error, panic, timeout, offered).
	CreateOutcome = attribute.Key("epcache.create.outcome")
)

// Errors of registration, for errors.Is.
var (
	// ErrBadName: the name is empty or not valid UTF-8.
	ErrBadName = errors.New("epotel: a cache's name must be non-empty UTF-8")
	// ErrNameTaken: another cache has the name.
	ErrNameTaken = errors.New("epotel: name already registered")
	// ErrAlreadyAdded: the cache (or tcp peer) is registered under another
	// name.
	ErrAlreadyAdded = errors.New("epotel: already registered")
	// ErrNil: the Metrics, meter, cache, peer or function is nil.
	ErrNil = errors.New("epotel: nil")
)

// Metrics observes the caches registered with it on the meter given to
// [New]. Its methods are safe for concurrent use, with each other and with
// collections; caches may be added and removed at any time.
type Metrics struct {
	inst instruments
	reg  metric.Registration

	mu   sync.Mutex // guards reg
	made bool       // by New: a zero Metrics has no instruments

	sources registry.Registry[*source]
}

// source is one registered name, immutable once registered.
type source struct {
	name     string
	owner    any
	read     func() (epcache.Stats, *tcp.Stats) // tcp.Stats: nil but for a tcp peer
	attrs    metric.ObserveOption
	outcomes [epcache.NumOutcomes]metric.ObserveOption
}

// New creates the instruments on meter and registers the one callback
// that observes them all. Its error is the meter's, if it refuses an
// instrument or the callback. Close unregisters the callback.
func New(meter metric.Meter) (*Metrics, error) {
	if meter == nil {
		return nil, fmt.Errorf("%w meter", ErrNil)
	}
	m := &Metrics{made: true}
	observables, err := m.inst.create(meter)
	if err != nil {
		return nil, err
	}
	if m.reg, err = meter.RegisterCallback(m.observe, observables...); err != nil {
		return nil, fmt.Errorf("epotel: registering the callback: %w", err)
	}
	return m, nil
}

// Close unregisters the callback: the meter observes none of the caches
// any more. A second Close returns nil.
func (m *Metrics) Close() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	reg := m.reg
	m.reg = nil
	m.mu.Unlock()
	if reg == nil {
		return nil
	}
	return reg.Unregister()
}

// Add registers cache under name: its figures are observed with the
// attribute epcache.cache.name=name. It returns an error, and registers
// nothing, if m or cache is nil ([ErrNil]), if name is empty
// ([ErrBadName]), if another cache has the name ([ErrNameTaken]) or if
// cache is registered already under another name ([ErrAlreadyAdded]).
func Add[K comparable, V any](m *Metrics, name string, cache *epcache.Cache[K, V]) error {
	if cache == nil {
		return fmt.Errorf("%w cache for %q", ErrNil, name)
	}
	return m.add(name, cache, func() (epcache.Stats, *tcp.Stats) { return cache.Stats(), nil })
}

// AddStats registers stats under name: the figures it returns are observed
// with the attribute epcache.cache.name=name, for a cache out of reach (a
// transport's own). It is called once per collection. Errors as for [Add].
func (m *Metrics) AddStats(name string, stats func() epcache.Stats) error {
	if stats == nil {
		return fmt.Errorf("%w stats function for %q", ErrNil, name)
	}
	return m.add(name, nil, func() (epcache.Stats, *tcp.Stats) { return stats(), nil })
}

// AddTCP registers the tcp peer p under name: its endpoint cache's figures
// and its transport's (the epcache.tcp instruments) are observed with the
// attribute epcache.cache.name=name, from one p.Stats() per collection.
// Errors as for [Add].
func (m *Metrics) AddTCP(name string, p *tcp.Peer) error {
	if p == nil {
		return fmt.Errorf("%w tcp peer for %q", ErrNil, name)
	}
	return m.add(name, p, func() (epcache.Stats, *tcp.Stats) {
		st := p.Stats()
		return st.Cache, &st
	})
}

// Remove unregisters the cache called name, reporting whether there was
// one. A collection under way may still observe it.
func (m *Metrics) Remove(name string) bool {
	return m != nil && m.sources.Remove(name)
}

var errs = registry.Errors{BadName: ErrBadName, NameTaken: ErrNameTaken, AlreadyAdded: ErrAlreadyAdded}

func (m *Metrics) add(name string, owner any, read func() (epcache.Stats, *tcp.Stats)) error {
	if m == nil || !m.made {
		return fmt.Errorf("%w Metrics: make one with epotel.New", ErrNil)
	}
	s := &source{name: name, owner: owner, read: read, attrs: metric.WithAttributeSet(attribute.NewSet(CacheName.String(name)))}
	for o := range epcache.NumOutcomes {
		s.outcomes[o] = metric.WithAttributeSet(attribute.NewSet(CacheName.String(name), CreateOutcome.String(o.String())))
	}
	return m.sources.Add(name, owner, s, errs)
}

// observe is the callback: every instrument, for every source.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	var errs []error
	for _, s := range m.sources.All() {
		if err := m.inst.observe(o, s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// clamp converts a counter to an int64 observation: a uint64 past
// math.MaxInt64 (never reached in practice) is reported as the largest.
func clamp(n uint64) int64 { return int64(min(n, math.MaxInt64)) }
