package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/epcache/epcache/bench"
)

// specs expands the options into the runs to make.
func (o options) specs() ([]bench.Spec, error) {
	var specs []bench.Spec
	add := func(s bench.Spec, impls []string) {
		for _, procs := range o.procs {
			s.Procs = procs
			g := s.Goroutines
			if g == 0 {
				g = procs
			}
			for _, impl := range impls {
				if !slices.Contains(o.impls, impl) {
					continue
				}
				t := s
				t.Impl, t.Goroutines = impl, g
				specs = append(specs, t)
			}
		}
	}
	base := bench.Spec{Dist: "uniform", Duration: o.duration, Cost: o.cost, Churn: o.churn, Failures: o.failures, Seed: o.seed}
	all := bench.ImplNames()
	d := o.duration
	switch o.suite {
	case "":
		for _, w := range o.workloads {
			for _, k := range o.keys {
				for _, p := range o.peers {
					gs := o.goroutines
					probe := bench.Spec{Workload: w}
					if len(gs) == 0 {
						gs = []int{0} // GOMAXPROCS, or 64 for the storms, 8 per peer for a mesh
						switch {
						case w == "storm" || w == "flaky":
							gs = []int{64}
						case probe.IsStorm():
							gs = []int{8}
						}
					}
					dists, reads := o.dists, []float64{0}
					switch {
					case probe.IsStorm():
						dists = []string{"uniform"}
					case w == "mixed":
						reads = o.reads
					}
					for _, g := range gs {
						for _, dist := range dists {
							for _, r := range reads {
								for _, cx := range o.ctxs {
									s := base
									s.Workload, s.Keys, s.Peers, s.Goroutines, s.Dist, s.Reads = w, k, p, g, dist, r
									if cx == "cancel" {
										s.Ctx = cx
									}
									add(s, all)
								}
							}
						}
					}
				}
			}
		}
	case "default", "quick", "full":
		stormPeers := 1024
		if o.suite == "quick" {
			d, stormPeers = d/4, 256
		}
		keys := []string{"uint64", "string"}
		hitPeers, dists := []int{1024}, []string{"uniform"}
		if o.suite == "full" {
			hitPeers, dists = []int{1024, 1_000_000}, []string{"uniform", "zipf"}
		}
		for _, k := range keys {
			for _, p := range hitPeers {
				for _, dist := range dists {
					s := base
					s.Workload, s.Keys, s.Peers, s.Dist, s.Duration = "hit", k, p, dist, d
					add(s, all)
				}
			}
		}
		costs := []string{o.cost}
		if o.suite == "full" {
			costs = append(costs, "lognormal:500us:1.5")
		}
		for _, c := range costs {
			s := base
			s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "uint64", stormPeers, 64, c
			add(s, all)
		}
		s := base
		s.Workload, s.Keys, s.Peers, s.Duration = "churn", "uint64", 1024, d
		add(s, all)
		s = base
		s.Workload, s.Keys, s.Peers, s.Goroutines = "flaky", "uint64", stormPeers/4, 64
		add(s, all)
		for _, r := range o.reads {
			s := base
			s.Workload, s.Keys, s.Peers, s.Reads, s.Duration = "mixed", "uint64", 1024, r, d/2
			add(s, all)
		}
		s = base
		s.Workload, s.Keys, s.Peers, s.Goroutines = "tcpstorm", "uint64", 32, 8
		add(s, all)
	case "ci":
		// What -compare checks (see compare.go), and every comparator once
		// through a small storm and churn for the leak and exactly-once checks.
		for _, k := range []string{"uint64", "string"} {
			s := base
			s.Workload, s.Keys, s.Peers, s.Duration = "hit", k, 1024, 300*time.Millisecond
			add(s, []string{"epcache", "syncmap", "xsync4"})
		}
		s := base
		s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "uint64", 1024, 64, "sleep:1ms"
		add(s, []string{"epcache", "mutex", "xsync"})
		s = base
		s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "string", 128, 16, "sleep:100us"
		add(s, all)
		s = base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "churn", "uint64", 128, 100*time.Millisecond, "none", 0.05
		add(s, all)
		s = base
		s.Workload, s.Keys, s.Peers, s.Goroutines = "tcpstorm", "uint64", 16, 4
		add(s, all)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("nothing to run: no implementation of %v takes part in the chosen workloads", o.impls)
	}
	for _, s := range specs {
		if err := s.Validate(); err != nil {
			return nil, err
		}
	}
	return specs, nil
}
