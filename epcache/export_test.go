package epcache

import "unsafe"

// SweepArmed reports whether an idle sweep is scheduled or running.
func SweepArmed[K comparable, V any](c *Cache[K, V]) bool {
	return c.sweep != nil && c.sweep.armed.Load()
}

// SweepNow runs one idle sweep on the calling goroutine, as the sweep
// timer would (Config.IdleTimeout must be set).
func SweepNow[K comparable, V any](c *Cache[K, V]) { c.sweepOnce() }

// OfferInSteps runs Offer of v for key in two steps, so that a test can put
// a creation's end or Close between them, as a race would: OfferInSteps
// looks at key's slot now, as Offer does before it goes through the slot's
// gate, and the function it returns does the rest, as Offer would after
// what it saw (done false: Offer would look again). With inside, it goes
// through the gate now too, and the function leaves it.
func OfferInSteps[K comparable, V any](c *Cache[K, V], key K, v V, inside bool) func() (done, ok bool) {
	s := c.table.LoadOrInsert(key)
	st := s.State()
	if !inside {
		return func() (bool, bool) { return c.offerIn(s, st, v) }
	}
	g := &c.stats.of(unsafe.Pointer(s)).gate
	if !g.enter() {
		panic("OfferInSteps: Close has begun")
	}
	return func() (bool, bool) {
		defer g.exit()
		return c.offer(s, st, v)
	}
}

// ClockLen returns how many entries the eviction clock of a cache with
// MaxEntries keeps, on the clock and waiting to join it.
func ClockLen[K comparable, V any](c *Cache[K, V]) int {
	r := c.room
	r.handMu.Lock()
	defer r.handMu.Unlock()
	r.freshMu.Lock()
	defer r.freshMu.Unlock()
	return len(r.hand.slots) + len(r.fresh)
}

// LeaseLines returns how many lines of tickets key's value has grown for
// its leases (0: none, or key holds no value).
func LeaseLines[K comparable, V any](c *Cache[K, V], key K) int {
	s := c.table.Lookup(key)
	if s == nil {
		return 0
	}
	return s.LeaseLines()
}
