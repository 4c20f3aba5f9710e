package epcache

// SweepArmed reports whether an idle sweep is scheduled or running.
func SweepArmed[K comparable, V any](c *Cache[K, V]) bool {
	return c.sweep != nil && c.sweep.armed.Load()
}

// SweepNow runs one idle sweep on the calling goroutine, as the sweep
// timer would (Config.IdleTimeout must be set).
func SweepNow[K comparable, V any](c *Cache[K, V]) { c.sweepOnce() }
