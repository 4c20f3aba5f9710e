package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/epcache/epcache/bench"
)

// The hotset workload's shape in the suites, and in a custom run (-workload
// hotset) where the flags do not say otherwise: a hot set of about a
// thousand endpoints among 100,000 peers drawn by Zipf with s = 1.01 (the
// exponent of the other workloads' zipf, and the nearest Go's rand.Zipf,
// which takes s > 1, comes to YCSB's 0.99), 64 senders, creations that
// sleep 100µs, and the pool's reaper (and epcache-idle) after 100ms unused.
const (
	hotsetPeers      = 100_000
	hotsetGoroutines = 64
	hotsetCap        = 1000
	hotsetZipf       = 1.01
	hotsetIdle       = 100 * time.Millisecond
	hotsetCost       = "sleep:100us"
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
				// hotset runs every comparator: those that never let go
				// of an endpoint show how far past the cap that goes.
				t := s
				t.Impl, t.Goroutines = impl, g
				specs = append(specs, t)
			}
		}
	}
	base := bench.Spec{Dist: "uniform", Duration: o.duration, Cost: o.cost, Churn: o.churn, Failures: o.failures, Seed: o.seed}
	all := bench.ImplNames()
	// The suites run the comparators written for the lease and hotset
	// workloads (a pool, a hand-counted map, otter, an LRU, epcache with
	// an idle timeout) in those alone.
	caches, leasers, evictors := []string{}, []string{}, []string{}
	for _, im := range bench.Impls {
		if im.Only == nil {
			caches = append(caches, im.Name)
		}
		if im.Leases && (im.Only == nil || slices.Contains(im.Only, "lease")) {
			leasers = append(leasers, im.Name)
		}
		if im.Evicts && (im.Only == nil || slices.Contains(im.Only, "hotset")) {
			evictors = append(evictors, im.Name)
		}
	}
	// hotset in the suites: a hot set of 1,000 among 100,000 peers.
	hot := base
	hot.Workload, hot.Keys, hot.Peers, hot.Goroutines = "hotset", "uint64", hotsetPeers, hotsetGoroutines
	hot.Dist, hot.Zipf, hot.Cap, hot.Idle, hot.Cost = "zipf", hotsetZipf, hotsetCap, hotsetIdle, hotsetCost
	d := o.duration
	switch o.suite {
	case "":
		for _, w := range o.workloads {
			for _, k := range o.keys {
				peers := o.peers
				if w == "hotset" && !o.set["peers"] {
					peers = []int{hotsetPeers}
				}
				for _, p := range peers {
					gs := o.goroutines
					probe := bench.Spec{Workload: w}
					if len(gs) == 0 {
						gs = []int{0} // GOMAXPROCS, or 64 for the storms and hotset, 8 per peer for a mesh
						switch {
						case w == "storm" || w == "flaky" || w == "hotset":
							gs = []int{64}
						case probe.IsStorm():
							gs = []int{8}
						}
					}
					dists, reads, caps := o.dists, []float64{0}, []int{0}
					switch {
					case probe.IsStorm():
						dists = []string{"uniform"}
					case w == "mixed":
						reads = o.reads
					case w == "hotset":
						caps = o.caps
						if !o.set["dist"] {
							dists = []string{"zipf"}
						}
					}
					for _, g := range gs {
						for _, dist := range dists {
							for _, r := range reads {
								for _, cp := range caps {
									s := base
									s.Workload, s.Keys, s.Peers, s.Goroutines, s.Dist, s.Reads = w, k, p, g, dist, r
									if w == "hotset" {
										s.Cap, s.Idle = cp, o.idle
										if dist == "zipf" {
											s.Zipf = o.zipf
										}
										if !o.set["cost"] {
											s.Cost = hotsetCost
										}
									}
									for _, v := range o.variants(s) {
										add(v, all)
									}
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
		// A hot set under a cap, against otter, an LRU and the pool's
		// reaper: hit ratio, peak live endpoints, releases under a use.
		hot.Duration = d
		add(hot, evictors)
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
		thrice(s, []string{"epcache", "mutex", "xsync3"})
		s = base
		s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "string", 128, 16, "sleep:100us"
		thrice(s, caches)
		s = base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "churn", "uint64", 128, 100*time.Millisecond, "none", 0.05
		thrice(s, caches)
		s = base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "lease", "uint64", 128, 100*time.Millisecond, "none", 0.05
		thrice(s, leasers)
		// hotset once through, for its checks: epcache's peak live within
		// the cap and no release under a lease (failures, as leaks are);
		// and against otter, compared.
		hot.Duration = 200 * time.Millisecond
		add(hot, evictors)
		thrice(hot, []string{"epcache", "otter"})
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
