//go:build !epcache_slowdemo

package epcache

// slowdemo does nothing, and is inlined into nothing: only the
// epcache_slowdemo build's (slowdemo.go) makes evictions cost more.
func (c *Cache[K, V]) slowdemo() {}
