package shard

import "time"

// epoch is the reading of the clock that Nanotime counts from. Its
// monotonic reading is what Nanotime subtracts from.
var epoch = time.Now()

// Nanotime returns the nanoseconds since the package was initialised, read
// from the monotonic clock alone: the one clock read time.Since makes, where
// time.Now makes two (the wall clock's and the monotonic one). The miss path
// stamps its flights, handles and latencies with it, several times a miss.
func Nanotime() int64 { return int64(time.Since(epoch)) }

// Time returns the time of a Nanotime reading, as a wall clock reading:
// the epoch's plus the interval the monotonic clock measured, with no
// monotonic reading of its own (as time.Unix's), so that two readings of
// one instant are ==.
func Time(ns int64) time.Time { return epoch.Add(time.Duration(ns)).Round(0) }
