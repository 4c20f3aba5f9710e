package grpcpool

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// checkHealth is the health checker's goroutine: a round of checks every
// HealthCheckInterval, counted from the end of the previous round, so that
// rounds never overlap, until Close.
func (p *Pool) checkHealth() {
	defer p.health.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.closing:
			cancel() // checks in flight end at once
		case <-ctx.Done():
		}
	}()
	t := time.NewTimer(p.cfg.HealthCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-p.closing:
			return
		case <-t.C:
		}
		p.healthRound(ctx)
		t.Reset(p.cfg.HealthCheckInterval)
	}
}

// healthRound checks every connection of the pool, at most
// MaxConcurrentHealthChecks at a time, and waits for the checks. It also
// drops the connections to addresses that are not members that no call
// uses (one published as SetMembers ran, with no call waiting for it),
// asking the members of the moment for each: a round is long, and a
// member that SetMembers adds during it is a member for the rest of it.
func (p *Pool) healthRound(ctx context.Context) {
	p.st.healthRounds.Add(1)
	sem := make(chan struct{}, p.cfg.MaxConcurrentHealthChecks)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, c := range p.cache.All() {
		if p.retire(c.addr, c) {
			p.drop(c, dropNonMember)
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			p.checkOne(ctx, c)
		})
	}
}

// checkOne checks c, and drops it if its checks have failed for the grace
// period.
func (p *Pool) checkOne(ctx context.Context, c *conn) {
	n := p.st.checksInFlight.Add(1)
	p.st.peakChecks(n)
	err := p.check(ctx, c)
	p.st.checksInFlight.Add(-1)
	p.st.healthChecks.Add(1)
	if err == nil {
		c.failingSince.Store(0)
		return
	}
	if c.closed.Load() || c.cause.Load() != int32(notDropped) || ctx.Err() != nil {
		return // the connection left meanwhile, or the pool is closing: not its health
	}
	p.st.healthFailures.Add(1)
	now := p.now().UnixNano()
	c.failingSince.CompareAndSwap(0, now)
	if time.Duration(now-c.failingSince.Load()) >= p.cfg.HealthCheckGracePeriod {
		p.dropUnhealthy(c)
	}
}

// dropUnhealthy drops c, whose health checks failed for the grace period:
// a member's drains (dropMember); a non-member's closes when its last call
// ends, as the rule for non-members says (see the package doc).
func (p *Pool) dropUnhealthy(c *conn) {
	p.mu.Lock()
	member := p.isMember(c.addr)
	p.mu.Unlock()
	if member {
		p.dropMember(c, dropHealth)
		return
	}
	p.drop(c, dropHealth)
}

// check sends one grpc.health.v1 Check on c: nil if the answer is SERVING.
func (p *Pool) check(ctx context.Context, c *conn) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.HealthCheckTimeout)
	defer cancel()
	// Fail-fast, as the failure probe: a connection in TRANSIENT_FAILURE
	// fails its check at once, even where the user's default call
	// options ask calls to wait for Ready.
	resp, err := healthpb.NewHealthClient(c.cc).Check(ctx, &healthpb.HealthCheckRequest{Service: p.cfg.HealthService}, grpc.WaitForReady(false))
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("grpcpool: health of %q: %v", c.addr, resp.GetStatus())
	}
	return nil
}
