package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Cache is the one interface every comparator implements: the operations a
// messaging layer makes on its endpoint cache.
type Cache[K comparable] interface {
	// Get returns key's endpoint, creating it if there is none.
	Get(ctx context.Context, key K) (*Endpoint, error)
	// Report says that ep failed: the cache drops and releases it only if it
	// is still key's endpoint (compare-and-delete), and reports whether it did.
	Report(key K, ep *Endpoint) bool
	// Invalidate drops and releases key's endpoint, whatever it is.
	Invalidate(key K) bool
	// Close releases every endpoint the cache holds. The workloads call it
	// once every goroutine has stopped.
	Close() error
}

// Env is what a comparator is built from.
type Env[K comparable] struct {
	Create  func(ctx context.Context, key K) (*Endpoint, error)
	Release func(key K, ep *Endpoint)
	// Retry is the creation retry policy, for comparators that retry inside
	// one creation (Impl.Retries); the others' callers retry with it.
	Retry func(attempt int, err error) (time.Duration, bool)
	// Index maps a key to its dense peer number, for comparators that need
	// one (Impl.Dense); nil when the keys are not dense integers.
	Index func(K) int
	Peers int
	// Cap bounds the values a comparator that takes a bound may hold
	// (epcache's MaxEntries, otter's MaximumSize, the LRU's size); 0 for
	// none. Only the hotset workload sets it.
	Cap int
	// Idle is how long a value may stay unused before the comparators
	// that remove idle values remove it: the pool's reaper and
	// epcache-idle's IdleTimeout. 0 for never. Only the hotset workload
	// sets it.
	Idle time.Duration
}

// Impl describes a comparator.
type Impl struct {
	Name        string
	ExactlyOnce bool // at most one creation per key in flight, no duplicates
	Retries     bool // retries a failed creation itself, waiters see only the outcome
	Dense       bool // needs dense integer keys (Env.Index)
	Leases      bool // holds an endpoint while it is used (Leaser): runs the lease workload
	// Evicts: removes values on its own, by a bound (Env.Cap) or an idle
	// reaper (Env.Idle): the suites run it in the hotset workload.
	Evicts bool
	// Bounded: never holds more than Env.Cap endpoints, creations
	// included, so that a hotset run whose peak live is above the cap is a
	// failure. The others' overshoot is reported, not judged.
	Bounded bool
	// Only, if set, names the workloads the suites run it in: those it was
	// written for. A custom run (-workload) runs it wherever it can run.
	Only  []string
	About string
}

// Impls lists the comparators, in the order tables show them.
var Impls = []Impl{
	{Name: "epcache", ExactlyOnce: true, Retries: true, Leases: true, Evicts: true, Bounded: true, About: "epcache.Cache: CAS-claimed slot, waiters on a channel"},
	{Name: "epcache-idle", ExactlyOnce: true, Retries: true, Leases: true, Evicts: true, Bounded: true, Only: []string{"hotset"}, About: "epcache with IdleTimeout = Env.Idle besides MaxEntries = Env.Cap"},
	{Name: "xsync4", ExactlyOnce: true, About: "xsync/v4 Map.LoadOrCompute: bucket lock held while creating"},
	{Name: "xsync3", ExactlyOnce: true, About: "xsync/v3 MapOf.LoadOrTryCompute: bucket lock held while creating"},
	{Name: "syncmap", About: "sync.Map Load, create, LoadOrStore; the loser is released"},
	{Name: "singleflight", ExactlyOnce: true, About: "x/sync/singleflight in front of a sync.Map, string keys"},
	{Name: "mutex", ExactlyOnce: true, About: "map behind one sync.Mutex, creation under the lock"},
	{Name: "rwmutex", ExactlyOnce: true, About: "RLock fast path; Lock, double-check, create under the lock"},
	{Name: "array", ExactlyOnce: true, Dense: true, About: "dense slice of atomic pointers, CAS claim: the floor"},
	// otter coalesces the loads of a key, but an Invalidate that comes
	// while the key loads discards the load, which is made again: a
	// duplicate endpoint, by design (the load may have read stale data).
	{Name: "otter", Evicts: true, Only: []string{"hotset"}, About: "otter/v2 Cache.Get with a Loader; MaximumSize = cap; OnDeletion releases"},
	{Name: "lru", Evicts: true, Only: []string{"hotset"}, About: "golang-lru/v2 simplelru behind one mutex, creation outside it; eviction releases"},
	{Name: "pool", ExactlyOnce: true, Leases: true, Evicts: true, Only: []string{"lease", "hotset"}, About: "Consul/Nomad-style pool: map and reference counts behind one mutex, dials coalesced, idle connections reaped"},
	{Name: "xsync4rc", ExactlyOnce: true, Leases: true, Only: []string{"lease"}, About: "xsync/v4 Map of reference-counted entries: a hand-written lease"},
}

// ImplNamed returns the comparator called name.
func ImplNamed(name string) (Impl, error) {
	for _, im := range Impls {
		if im.Name == name {
			return im, nil
		}
	}
	return Impl{}, fmt.Errorf("bench: unknown implementation %q; want one of %s", name, strings.Join(ImplNames(), ", "))
}

// ImplNames returns the comparators' names.
func ImplNames() []string {
	names := make([]string, len(Impls))
	for i, im := range Impls {
		names[i] = im.Name
	}
	return names
}

// ErrUnsupported is returned by New for a comparator that cannot serve the
// keys (array with non-dense keys).
var ErrUnsupported = errors.New("bench: implementation does not support these keys")

// New builds the comparator called name.
func New[K comparable](name string, env Env[K]) (Cache[K], error) {
	switch name {
	case "epcache":
		return newEpcache(env, false)
	case "epcache-idle":
		return newEpcache(env, true)
	case "xsync4":
		return newXsync4(env), nil
	case "xsync3":
		return newXsync3(env), nil
	case "syncmap":
		return newSyncMap(env), nil
	case "singleflight":
		return newSingleflight(env), nil
	case "mutex":
		return newMutex(env), nil
	case "rwmutex":
		return newRWMutex(env), nil
	case "array":
		if env.Index == nil {
			return nil, ErrUnsupported
		}
		return newArray(env), nil
	case "pool":
		return newPool(env), nil
	case "xsync4rc":
		return newXsync4rc(env), nil
	case "otter":
		return newOtter(env)
	case "lru":
		return newLRU(env)
	}
	_, err := ImplNamed(name)
	return nil, err
}
