package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/epcache/epcache/bench"
)

// variants expands s over -ctx and, for the mesh workloads, -rtt.
func (o options) variants(s bench.Spec) []bench.Spec {
	rtts := []time.Duration{0}
	if s.IsMesh() {
		rtts = o.rtts
	}
	var out []bench.Spec
	for _, cx := range o.ctxs {
		for _, rtt := range rtts {
			v := s
			v.RTT = rtt
			if cx == "cancel" {
				v.Ctx = cx
			}
			out = append(out, v)
		}
	}
	return out
}

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
				if im, _ := bench.ImplNamed(impl); s.Workload == "lease" && !im.Leases {
					continue // holds nothing while it is used: no lease to measure
				}
				t := s
				t.Impl, t.Goroutines = impl, g
				specs = append(specs, t)
			}
		}
	}
	base := bench.Spec{Dist: "uniform", Duration: o.duration, Cost: o.cost, Churn: o.churn, Failures: o.failures, Seed: o.seed}
	all := bench.ImplNames()
	// The suites run the comparators written for the lease workload (a
	// pool, a hand-counted map) in it alone.
	caches, leasers := []string{}, []string{}
	for _, im := range bench.Impls {
		if !im.LeaseOnly {
			caches = append(caches, im.Name)
		}
		if im.Leases {
			leasers = append(leasers, im.Name)
		}
	}
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
								s := base
								s.Workload, s.Keys, s.Peers, s.Goroutines, s.Dist, s.Reads = w, k, p, g, dist, r
								for _, v := range o.variants(s) {
									add(v, all)
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
					// A hit never creates: no cost model to name.
					s.Workload, s.Keys, s.Peers, s.Dist, s.Duration, s.Cost = "hit", k, p, dist, d, "none"
					add(s, caches)
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
			add(s, caches)
		}
		// Churn with cheap creations, where the cost of a creation itself
		// shows; at 5% also with a context that can end (epcache then
		// creates on a goroutine of its own).
		for _, churn := range []float64{0.01, 0.05} {
			s := base
			s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "churn", "uint64", 1024, d, "none", churn
			add(s, caches)
		}
		s := base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn, s.Ctx = "churn", "uint64", 1024, d, "none", 0.05, "cancel"
		add(s, caches)
		s = base
		s.Workload, s.Keys, s.Peers, s.Goroutines = "flaky", "uint64", stormPeers/4, 64
		add(s, caches)
		for _, r := range o.reads {
			s := base
			s.Workload, s.Keys, s.Peers, s.Reads, s.Duration = "mixed", "uint64", 1024, r, d/2
			add(s, caches)
		}
		// Leases on hits, with an Invalidate now and then, against the
		// pool and the hand-counted map: what a send costs beside a Get.
		s = base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "lease", "uint64", 1024, d, "none", 0.01
		add(s, leasers)
		// Real connections, on loopback as it is and with modelled delay.
		rtts := []time.Duration{0, time.Millisecond}
		if o.suite == "full" {
			rtts = append(rtts, 5*time.Millisecond, 20*time.Millisecond)
		}
		for _, rtt := range rtts {
			s := base
			s.Workload, s.Keys, s.Peers, s.Goroutines, s.RTT = "tcpstorm", "uint64", 32, 8, rtt
			add(s, caches)
		}
		if o.suite == "full" {
			for _, rtt := range []time.Duration{0, 5 * time.Millisecond} {
				s := base
				s.Workload, s.Keys, s.Peers, s.Goroutines, s.RTT, s.Ctx = "tcpstorm", "uint64", 32, 8, rtt, "cancel"
				add(s, caches)
			}
		}
	case "ci":
		// What -compare checks (see compare.go), and every comparator once
		// through a small storm, churn and tcpstorm for the leak and
		// exactly-once checks. Each compared spec runs three times, so that
		// its ratio is of medians: single runs of 100 ms swung by 2x now and
		// then in fresh-clone CI runs (tcpstorm against the array, lease
		// against the pool), past -compare's margin.
		thrice := func(s bench.Spec, impls []string) {
			for range 3 {
				add(s, impls)
			}
		}
		for _, k := range []string{"uint64", "string"} {
			s := base
			s.Workload, s.Keys, s.Peers, s.Duration, s.Cost = "hit", k, 1024, 200*time.Millisecond, "none"
			thrice(s, []string{"epcache", "syncmap", "xsync4"})
		}
		s := base
		s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "uint64", 1024, 64, "sleep:1ms"
		thrice(s, []string{"epcache", "mutex", "xsync"})
		s = base
		s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "string", 128, 16, "sleep:100us"
		thrice(s, caches)
		s = base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "churn", "uint64", 128, 100*time.Millisecond, "none", 0.05
		thrice(s, caches)
		s = base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "lease", "uint64", 128, 100*time.Millisecond, "none", 0.05
		thrice(s, leasers)
		s = base
		s.Workload, s.Keys, s.Peers, s.Goroutines = "tcpstorm", "uint64", 16, 4
		add(s, caches)
		// Compared with a modelled round trip: the ratios then measure how
		// creations overlap, not the loopback's noise.
		s.RTT = time.Millisecond
		thrice(s, []string{"epcache", "array", "mutex"})
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
