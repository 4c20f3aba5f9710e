//go:build race

package epcache_test

const raceEnabled = true
