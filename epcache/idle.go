package epcache

import (
	"sync"
	"sync/atomic"
	"time"
)

// sweeper removes idle values (Config.IdleTimeout). It is a timer, not a
// goroutine: armed while the cache holds values, it fires every
// IdleTimeout/shard.IdleSteps and walks the table once, without a lock
// (the walk reads each shard's array from a snapshot, as a hit does), aging
// every value a step and removing those that stayed unused through
// IdleSteps sweeps. A cache that holds no value has no timer armed, and a
// hit pays nothing: a use of an aged value makes it young (shard.Table.Touch).
type sweeper struct {
	every time.Duration
	armed atomic.Bool // a sweep is scheduled or running

	mu      sync.Mutex
	timer   *time.Timer    // guarded by mu
	closed  bool           // guarded by mu
	running sync.WaitGroup // the sweep under way, which Close waits for
}

// armSweep schedules a sweep, unless one is scheduled or running: after a
// value is published. The check is one atomic load.
func (c *Cache[K, V]) armSweep() {
	sw := c.sweep
	if sw == nil || sw.armed.Load() {
		return
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.closed || sw.armed.Load() {
		return
	}
	sw.armed.Store(true)
	if sw.timer == nil {
		sw.timer = time.AfterFunc(sw.every, c.sweepOnce)
	} else {
		sw.timer.Reset(sw.every)
	}
}

// sweepOnce is one sweep, on the timer's goroutine. Each Release runs on a
// goroutine of its own, so that one that panics or calls runtime.Goexit
// (reported by Close) delays no other removal, and a slow one no sweep.
func (c *Cache[K, V]) sweepOnce() {
	sw := c.sweep
	sw.mu.Lock()
	if sw.closed {
		sw.mu.Unlock()
		return
	}
	sw.running.Add(1)
	sw.mu.Unlock()
	defer sw.running.Done()
	defer func() {
		// Disarmed before Ready is read, so that a value published
		// meanwhile either sees armed false and arms, or is counted here.
		sw.armed.Store(false)
		if c.stats.sum().Ready > 0 {
			c.armSweep()
		}
	}()
	for s := range c.table.All() {
		if c.table.Closed() {
			return
		}
		st := s.State()
		if s.LeaseHeld() {
			// In use now: it has not been idle since the last sweep.
			c.table.Touch(s, st)
			continue
		}
		if c.table.Age(s, st) {
			c.remove(s, st, false, func(p *stripe) { p.idleRemovals.Add(1) })
		}
	}
}

// stopSweeps stops the timer for good, and waits for a sweep under way,
// which sees the table closed at its next slot: Close's.
func (c *Cache[K, V]) stopSweeps() {
	sw := c.sweep
	if sw == nil {
		return
	}
	sw.mu.Lock()
	sw.closed = true
	if sw.timer != nil {
		sw.timer.Stop()
	}
	sw.mu.Unlock()
	sw.running.Wait()
}
