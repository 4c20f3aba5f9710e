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
	b := &specBuilder{o: o, impls: implsByRole()}
	base := bench.Spec{Dist: "uniform", Duration: o.duration, Cost: o.cost, Churn: o.churn, Failures: o.failures, Seed: o.seed}
	switch o.suite {
	case "":
		b.custom(base)
	case "default", "quick", "full":
		b.standard(base)
	case "ci":
		b.ci(base)
	}
	if len(b.specs) == 0 {
		return nil, fmt.Errorf("nothing to run: no implementation of %v takes part in the chosen workloads", o.impls)
	}
	for _, s := range b.specs {
		if err := s.Validate(); err != nil {
			return nil, err
		}
	}
	return b.specs, nil
}

// roles are the comparators by what they can run: every workload (caches),
// the lease workload (leasers), the hotset workload (evictors). The suites
// run the comparators written for the lease and hotset workloads (a pool, a
// hand-counted map, otter, an LRU, epcache with an idle timeout) in those
// alone.
type roles struct {
	all, caches, leasers, evictors []string
}

func implsByRole() roles {
	r := roles{all: bench.ImplNames()}
	for _, im := range bench.Impls {
		if im.Only == nil {
			r.caches = append(r.caches, im.Name)
		}
		if im.Leases && (im.Only == nil || slices.Contains(im.Only, "lease")) {
			r.leasers = append(r.leasers, im.Name)
		}
		if im.Evicts && (im.Only == nil || slices.Contains(im.Only, "hotset")) {
			r.evictors = append(r.evictors, im.Name)
		}
	}
	return r
}

// specBuilder collects the runs of one invocation.
type specBuilder struct {
	o     options
	impls roles
	specs []bench.Spec
}

// add adds s for each of impls that -impl allows, at each -procs.
func (b *specBuilder) add(s bench.Spec, impls []string) {
	b.addAt(s, impls, b.o.procs...)
}

// addAt adds s for each of impls that -impl allows, at each of procs.
func (b *specBuilder) addAt(s bench.Spec, impls []string, procs ...int) {
	for _, p := range procs {
		s.Procs = p
		g := s.Goroutines
		if g == 0 {
			g = p
		}
		for _, impl := range impls {
			if !slices.Contains(b.o.impls, impl) {
				continue
			}
			if im, _ := bench.ImplNamed(impl); s.Workload == "lease" && !im.Leases {
				continue // holds nothing while it is used: no lease to measure
			}
			// hotset runs every comparator: those that never let go of
			// an endpoint show how far past the cap that goes.
			t := s
			t.Impl, t.Goroutines = impl, g
			b.specs = append(b.specs, t)
		}
	}
}

// thrice adds s three times, so that its ratio is of medians: single runs
// of 100 ms swung by 2x now and then in fresh-clone CI runs.
func (b *specBuilder) thrice(s bench.Spec, impls []string, procs ...int) {
	for range 3 {
		if len(procs) == 0 {
			b.add(s, impls)
		} else {
			b.addAt(s, impls, procs...)
		}
	}
}

// hotset is the hotset workload of the suites: a hot set of 1,000 among
// 100,000 peers.
func hotset(base bench.Spec) bench.Spec {
	hot := base
	hot.Workload, hot.Keys, hot.Peers, hot.Goroutines = "hotset", "uint64", hotsetPeers, hotsetGoroutines
	hot.Dist, hot.Zipf, hot.Cap, hot.Idle, hot.Cost = "zipf", hotsetZipf, hotsetCap, hotsetIdle, hotsetCost
	return hot
}

// hotPeerProcs are the GOMAXPROCS of the hot-peer lease runs: one core and
// two, whose ratio says whether leases of one peer scale with cores.
var hotPeerProcs = []int{1, 2}

// hotPeer is the lease workload on one peer that every goroutine leases,
// one per P: the lease is the only shared thing.
func hotPeer(base bench.Spec, d time.Duration) bench.Spec {
	s := base
	s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "lease", "uint64", 1, d, "none", 0
	return s
}

// custom adds the runs -workload, -keys, -peers and the rest ask for.
func (b *specBuilder) custom(base bench.Spec) {
	o := b.o
	for _, w := range o.workloads {
		for _, k := range o.keys {
			peers := o.peers
			if w == "hotset" && !o.set["peers"] {
				peers = []int{hotsetPeers}
			}
			for _, p := range peers {
				gs, dists, reads, caps := o.shape(w)
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
									b.add(v, b.impls.all)
								}
							}
						}
					}
				}
			}
		}
	}
}

// shape returns the goroutines, distributions, read shares and caps a
// custom run of workload w takes from the flags, or their defaults for w.
func (o options) shape(w string) (gs []int, dists []string, reads []float64, caps []int) {
	gs = o.goroutines
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
	dists, reads, caps = o.dists, []float64{0}, []int{0}
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
	return gs, dists, reads, caps
}

// standard adds the default, quick or full suite.
func (b *specBuilder) standard(base bench.Spec) {
	o, r := b.o, b.impls
	d := o.duration
	stormPeers := 1024
	if o.suite == "quick" {
		d, stormPeers = d/4, 256
	}
	hitPeers, dists := []int{1024}, []string{"uniform"}
	if o.suite == "full" {
		hitPeers, dists = []int{1024, 1_000_000}, []string{"uniform", "zipf"}
	}
	for _, k := range []string{"uint64", "string"} {
		for _, p := range hitPeers {
			for _, dist := range dists {
				s := base
				// A hit never creates: no cost model to name.
				s.Workload, s.Keys, s.Peers, s.Dist, s.Duration, s.Cost = "hit", k, p, dist, d, "none"
				b.add(s, r.caches)
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
		b.add(s, r.caches)
	}
	// Churn with cheap creations, where the cost of a creation itself
	// shows; at 5% also with a context that can end (epcache then creates
	// on a goroutine of its own).
	for _, churn := range []float64{0.01, 0.05} {
		s := base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "churn", "uint64", 1024, d, "none", churn
		b.add(s, r.caches)
	}
	s := base
	s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn, s.Ctx = "churn", "uint64", 1024, d, "none", 0.05, "cancel"
	b.add(s, r.caches)
	s = base
	s.Workload, s.Keys, s.Peers, s.Goroutines = "flaky", "uint64", stormPeers/4, 64
	b.add(s, r.caches)
	for _, rd := range o.reads {
		s := base
		s.Workload, s.Keys, s.Peers, s.Reads, s.Duration = "mixed", "uint64", 1024, rd, d/2
		b.add(s, r.caches)
	}
	// Leases on hits, with an Invalidate now and then, against the pool
	// and the hand-counted map: what a send costs beside a Get. And on one
	// hot peer, at one core and two: whether leases scale with cores.
	s = base
	s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "lease", "uint64", 1024, d, "none", 0.01
	b.add(s, r.leasers)
	b.addAt(hotPeer(base, d), r.leasers, hotPeerProcs...)
	// A hot set under a cap, against otter, an LRU and the pool's reaper:
	// hit ratio, peak live endpoints, releases under a use.
	hot := hotset(base)
	hot.Duration = d
	b.add(hot, r.evictors)
	// Real connections, on loopback as it is and with modelled delay.
	rtts := []time.Duration{0, time.Millisecond}
	if o.suite == "full" {
		rtts = append(rtts, 5*time.Millisecond, 20*time.Millisecond)
	}
	for _, rtt := range rtts {
		s := base
		s.Workload, s.Keys, s.Peers, s.Goroutines, s.RTT = "tcpstorm", "uint64", 32, 8, rtt
		b.add(s, r.caches)
	}
	if o.suite == "full" {
		for _, rtt := range []time.Duration{0, 5 * time.Millisecond} {
			s := base
			s.Workload, s.Keys, s.Peers, s.Goroutines, s.RTT, s.Ctx = "tcpstorm", "uint64", 32, 8, rtt, "cancel"
			b.add(s, r.caches)
		}
	}
}

// ci adds the ci suite: what -compare checks (see compare.go), each
// compared spec three times, and every comparator once through a small
// storm, churn and tcpstorm for the leak and exactly-once checks.
func (b *specBuilder) ci(base bench.Spec) {
	r := b.impls
	for _, k := range []string{"uint64", "string"} {
		s := base
		s.Workload, s.Keys, s.Peers, s.Duration, s.Cost = "hit", k, 1024, 200*time.Millisecond, "none"
		b.thrice(s, []string{"epcache", "syncmap", "xsync4"})
	}
	s := base
	s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "uint64", 1024, 64, "sleep:1ms"
	b.thrice(s, []string{"epcache", "mutex", "xsync3"})
	s = base
	s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "string", 128, 16, "sleep:100us"
	b.thrice(s, r.caches)
	s = base
	s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "churn", "uint64", 128, 100*time.Millisecond, "none", 0.05
	b.thrice(s, r.caches)
	s = base
	s.Workload, s.Keys, s.Peers, s.Duration, s.Cost, s.Churn = "lease", "uint64", 128, 100*time.Millisecond, "none", 0.05
	b.thrice(s, r.leasers)
	// One hot peer at one core and two: -compare holds epcache's two-core
	// time over its one-core time to the baseline's (see scalings).
	b.thrice(hotPeer(base, 200*time.Millisecond), []string{"epcache", "pool"}, hotPeerProcs...)
	// hotset once through, for its checks: epcache's peak live within the
	// cap and no release under a lease (failures, as leaks are); and
	// against otter, compared.
	hot := hotset(base)
	hot.Duration = 200 * time.Millisecond
	b.add(hot, r.evictors)
	b.thrice(hot, []string{"epcache", "otter"})
	s = base
	s.Workload, s.Keys, s.Peers, s.Goroutines = "tcpstorm", "uint64", 16, 4
	b.add(s, r.caches)
	// Compared with a modelled round trip: the ratios then measure how
	// creations overlap, not the loopback's noise.
	s.RTT = time.Millisecond
	b.thrice(s, []string{"epcache", "array", "mutex"})
}

// cpuFigures returns the CPU figures of the ci suite (see guard.go), none
// for another suite: hotset, storm and hit (both key types), each at
// GOMAXPROCS 1.
func (o options) cpuFigures() []bench.Spec {
	if o.suite != "ci" {
		return nil
	}
	base := bench.Spec{Dist: "uniform", Procs: 1, Seed: o.seed}
	hot := hotset(base)
	hot.Duration = cpuHotsetDuration
	figs := []bench.Spec{hot}
	s := base
	s.Workload, s.Keys, s.Peers, s.Goroutines, s.Cost = "storm", "uint64", 1024, 64, "sleep:1ms"
	figs = append(figs, s)
	for _, k := range []string{"uint64", "string"} {
		s := base
		s.Workload, s.Keys, s.Peers, s.Goroutines, s.Duration, s.Cost = "hit", k, 1024, 1, cpuHitDuration, "none"
		figs = append(figs, s)
	}
	return figs
}

// How long each run of a CPU figure's pair measures.
const (
	cpuHotsetDuration = 100 * time.Millisecond
	cpuHitDuration    = 50 * time.Millisecond
)
