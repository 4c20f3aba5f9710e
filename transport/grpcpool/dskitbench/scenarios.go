package dskitbench

import (
	"fmt"
	"time"
)

// Config sizes the whole run.
type Config struct {
	CloseUnderUse  CloseUnderUseConfig
	FanOut         FanOutConfig
	LateRounds     int
	RollingRestart RollingRestartConfig
	DeadCallers    int
	DeadFor        time.Duration
	BenchCount     int // best of BenchCount testing.Benchmark runs per case
	BudgetServers  int
	BudgetMaxConns int
	BudgetRounds   int
	BudgetHold     time.Duration
	StreamLimit    StreamLimitConfig
}

// Default is the run cmd/grpcbench makes by default.
var Default = Config{
	CloseUnderUse:  DefaultCloseUnderUse,
	FanOut:         DefaultFanOut,
	LateRounds:     50,
	RollingRestart: DefaultRollingRestart,
	DeadCallers:    8,
	DeadFor:        time.Second,
	BenchCount:     3,
	BudgetServers:  64,
	BudgetMaxConns: 8,
	BudgetRounds:   8,
	BudgetHold:     5 * time.Millisecond,
	StreamLimit:    DefaultStreamLimit,
}

// Scenario is one of the eight.
type Scenario struct {
	ID  string
	Run func(Config) (*Table, error)
}

// Scenarios are the eight, in order.
var Scenarios = []Scenario{
	{"1", func(c Config) (*Table, error) { return CloseUnderUse(c.CloseUnderUse) }},
	{"2", func(c Config) (*Table, error) { return FanOut(c.FanOut) }},
	{"3", func(c Config) (*Table, error) { return LateReport(c.LateRounds) }},
	{"4", func(c Config) (*Table, error) { return RollingRestart(c.RollingRestart) }},
	{"5", func(c Config) (*Table, error) { return DeadMember(c.DeadCallers, c.DeadFor) }},
	{"6", func(c Config) (*Table, error) { return Overhead(c.BenchCount) }},
	{"7", func(c Config) (*Table, error) {
		return DescriptorBudget(c.BudgetServers, c.BudgetMaxConns, c.BudgetRounds, c.BudgetHold)
	}},
	{"8", func(c Config) (*Table, error) { return StreamLimit(c.StreamLimit) }},
}

// Measure runs the scenario, timing it.
func (s Scenario) Measure(c Config) (*Table, error) {
	start := time.Now()
	t, err := s.Run(c)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", s.ID, err)
	}
	t.Elapsed = time.Since(start).Round(time.Millisecond).String()
	return t, nil
}

// Quick is a smaller, shorter run: a smoke test of every scenario.
var Quick = Config{
	CloseUnderUse:  CloseUnderUseConfig{Servers: 4, Workers: 4, Duration: 300 * time.Millisecond, HoldMin: 5 * time.Millisecond, HoldMax: 10 * time.Millisecond, Every: 40 * time.Millisecond},
	FanOut:         FanOutConfig{Servers: 8, Callers: 4, RTT: 20 * time.Millisecond, DialTimeout: 300 * time.Millisecond, CallTimeout: 2 * time.Second},
	LateRounds:     3,
	RollingRestart: RollingRestartConfig{Servers: 4, Workers: 4, HoldMin: 5 * time.Millisecond, HoldMax: 10 * time.Millisecond, Settle: 30 * time.Millisecond},
	DeadCallers:    2,
	DeadFor:        100 * time.Millisecond,
	BenchCount:     1,
	BudgetServers:  8,
	BudgetMaxConns: 2,
	BudgetRounds:   2,
	BudgetHold:     time.Millisecond,
	StreamLimit:    StreamLimitConfig{Callers: 50, Streams: 10, Hold: 10 * time.Millisecond, RTT: 10 * time.Millisecond, IdleTimeout: 50 * time.Millisecond},
}
