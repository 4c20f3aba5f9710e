package epcache

// SweepArmed reports whether an idle sweep is scheduled or running.
func SweepArmed[K comparable, V any](c *Cache[K, V]) bool {
	return c.sweep != nil && c.sweep.armed.Load()
}
