package epcache

import (
	"context"
	"fmt"
	"time"

	"github.com/epcache/epcache/shard"
)

// Config configures a [Cache]. Only Create is required.
type Config[K comparable, V any] struct {
	// Create builds the value for key. For a key, at most one Create runs at
	// a time, and every Get that arrives while it runs receives its outcome.
	//
	// Create runs on the goroutine of the Get that started it when nothing
	// could answer that Get before Create returns: its context never ends
	// (ctx.Done() returns nil, as for context.Background()) and there is no
	// CreateTimeout. That Get returns when Create does. Otherwise Create
	// runs on a goroutine of its own, so that the Get can leave on its
	// context while the creation goes on for the others: a goroutine, its
	// stack and two trips through the scheduler per creation.
	//
	// Its ctx carries the values of the context of the Get that started it
	// (trace IDs carry over) but not that Get's cancellation. ctx is
	// cancelled by CreateTimeout, by Close, by an Offer that answers the
	// creation (cause ErrOffered), and when Create returns (with Retry,
	// each attempt's ctx when that attempt returns): a value that must
	// outlive the call (a connection) must not be bound to it.
	//
	// A nil error publishes the value, whatever it is (a zero value too). A
	// panic reaches the waiting callers as a *PanicError. runtime.Goexit
	// reaches them as ErrGoexit; on the caller's goroutine it also ends that
	// goroutine, as it would in any function the caller calls. With an
	// error, the value Create returned is dropped.
	//
	// Create may use the cache for other keys. It must not Get its own key
	// (it would wait for itself until CreateTimeout or Close) and must not
	// call Close (which waits for it).
	Create func(ctx context.Context, key K) (V, error)

	// Release, if set, is called exactly once for every value Create returned
	// with a nil error (and every value an Offer stored), once the cache no
	// longer holds it: after Invalidate or CompareAndInvalidate, an eviction
	// (MaxEntries) or an idle removal (IdleTimeout), at Close, and for a
	// value whose creation finished after its callers were answered
	// otherwise (CreateTimeout, Close, an Offer); for a value a Lease holds,
	// at the end of its last lease, on that goroutine. It is
	// called only once the value has left the cache, so that no Get that
	// begins afterwards returns it (a Get already under way may, as a Load
	// of a sync.Map may return a value being deleted: report a failing
	// endpoint with CompareAndInvalidate and get another). It is never called
	// with an internal lock held: it may call Get, Load, Invalidate and
	// CompareAndInvalidate. It must not call Close, which waits for it.
	Release func(key K, v V)

	// CreateTimeout, if positive, bounds one creation, retries and their
	// waits included. When it passes, Create's ctx is cancelled and the
	// waiting callers get an error wrapping context.DeadlineExceeded at once,
	// even if Create ignores its ctx. Until that Create returns, further Gets
	// for the key get the same error, so that two creations of one key never
	// overlap; a value it returns late is released.
	CreateTimeout time.Duration

	// Retry, if set, is called after each failed attempt with the number of
	// attempts made so far (1, 2, …) and the attempt's error. It returns how
	// long to wait before the next attempt and whether to make one. Retries
	// reuse the one creation: waiters see only its final outcome. The wait is
	// cut short by CreateTimeout and Close. A panicking Create is not
	// retried. See [Backoff].
	Retry func(attempt int, err error) (wait time.Duration, retry bool)

	// ErrorTTL, if positive, makes a failed creation's final error the answer
	// for that key, at once and without calling Create, for ErrorTTL after
	// the failure: a dead peer is not hammered. Then it is forgotten.
	ErrorTTL time.Duration

	// Hash, if set, replaces the built-in seeded hash (a multiply-mix for
	// integers; for strings, a wyhash-style hash up to 64 bytes and
	// hash/maphash.String beyond; hash/maphash.Comparable for other keys).
	// The cache mixes its result with a per-cache random seed, so it need
	// not spread bits, but equal keys must hash equal. The seed cannot
	// separate keys whose Hash values are equal: with an unkeyed hash
	// (xxhash.Sum64String, say), whoever chooses the keys can make them all
	// collide, and the cache, though correct, slows to a linear scan
	// (epcache's flood tests build such keys for XXH64).
	Hash func(key K) uint64

	// IdleTimeout, if positive: a value that no Get or Acquire has returned
	// and no lease has held for about IdleTimeout is removed and released.
	// "About": it is removed between IdleTimeout and 5/4 IdleTimeout after
	// its last use, by a sweep that runs every IdleTimeout/4 while the
	// cache holds values and not at all while it holds none. A leased value
	// is never removed. Release runs on a goroutine of its own; its panics
	// are reported by Close.
	IdleTimeout time.Duration

	// MaxEntries, if positive, bounds at every instant the values created and
	// not yet released plus the creations running. A Get or Acquire that
	// needs a new value when the cache is full first evicts an unleased
	// value that has not been used since the clock hand last passed it,
	// choosing among those the one asked for least often (a CLOCK weighed by
	// a frequency sketch): a key asked for often outlives one asked for
	// once, even if that one was used more recently. It waits for the
	// evicted value's Release to return before Create starts; when every
	// value is leased or being created, it waits for room until its context
	// ends (an error wrapping ctx.Err()).
	//
	// Choose it from the descriptor budget (the process's RLIMIT_NOFILE less
	// what else it opens), not from the number of peers, and above the
	// working set (the peers used within one IdleTimeout), or every miss
	// evicts a peer that is needed again soon and every use is a reconnect.
	//
	// Waiters for room are served in the order they began to wait, except that a
	// waiter whose own eviction freed a unit of room takes that unit (each waiter
	// evicts for itself when it can). A value counts from the moment its creation
	// takes room until its Release returns: values that left the cache but wait
	// for their last lease count, and so do values whose Release is running. An
	// Offer takes room only if there is some: it never evicts, and it returns
	// false when the cache is full. With MaxEntries set, use Acquire rather than
	// Get around a use of the value: eviction may release a value a Get returned
	// as soon as the cache needs its room, and never one a Lease holds.
	//
	// A Get or Acquire that needs room and evicts a value takes the value's
	// room over when its Release returns. It runs that Release itself, on
	// its own goroutine, when its context never ends (it would wait for it
	// anyway, as it runs Create then); otherwise the Release runs on a
	// goroutine of its own, so that the Get may leave on its context
	// meanwhile, and the room then goes to whoever needs it next. Other
	// evicted values are released on goroutines of their own, and their
	// room goes to the first in line when Release returns: until then no
	// second value is evicted for the waiter it will reach, so a Release
	// that never returns keeps one waiter waiting until its context ends. A panic in
	// such a Release is recovered and reported by Close, as from a
	// creation's goroutine; a runtime.Goexit in it ends the goroutine it
	// runs on (the evicting Get's, whose key's other callers go on without
	// it). Release may call Get even then: the room it waits for is not the
	// room its caller holds. The one Get it must not make is of the key
	// whose creation evicted it: that creation waits for this Release to
	// return, and the Get would wait for that creation.
	MaxEntries int

	// Shards spreads insertions of new keys over this many independently
	// locked shards (rounded up to a power of two, at most 65,536); 0 means
	// 4×GOMAXPROCS. Hits never lock.
	Shards int
}

func (cfg *Config[K, V]) validate() error {
	switch {
	case cfg.Create == nil:
		return fmt.Errorf("epcache: Config.Create is nil; it is required")
	case cfg.Shards < 0:
		return fmt.Errorf("epcache: Config.Shards is %d; want 0 (default) or a positive count", cfg.Shards)
	case cfg.Shards > shard.MaxShards:
		return fmt.Errorf("epcache: Config.Shards is %d; want at most %d", cfg.Shards, shard.MaxShards)
	case cfg.CreateTimeout < 0:
		return fmt.Errorf("epcache: Config.CreateTimeout is %v; want 0 (none) or a positive duration", cfg.CreateTimeout)
	case cfg.ErrorTTL < 0:
		return fmt.Errorf("epcache: Config.ErrorTTL is %v; want 0 (failures not remembered) or a positive duration", cfg.ErrorTTL)
	case cfg.IdleTimeout < 0:
		return fmt.Errorf("epcache: Config.IdleTimeout is %v; want 0 (values never expire) or a positive duration", cfg.IdleTimeout)
	case cfg.MaxEntries < 0:
		return fmt.Errorf("epcache: Config.MaxEntries is %d; want 0 (no bound) or a positive count", cfg.MaxEntries)
	}
	return nil
}
