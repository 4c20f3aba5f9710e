package grpcpool

import "time"

// NewWithClock is New with now as the pool's clock, for the health checks'
// grace period and the drain delay (timers still run on real time).
func NewWithClock(cfg Config, now func() time.Time) (*Pool, error) {
	return newPool(cfg, now)
}

// Guests returns the number of addresses with calls counted as a
// non-member's: zero once no call runs.
func Guests(p *Pool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.guests)
}
