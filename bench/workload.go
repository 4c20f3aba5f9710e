package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/epcache/epcache/epcache"
)

// Workloads lists the workloads Run knows, in the order tables show them.
var Workloads = []string{"hit", "storm", "churn", "flaky", "mixed", "lease", "hotset", "tcpstorm"}

// Spec is one run: one workload, one comparator, one configuration.
type Spec struct {
	Workload   string        `json:"workload"`
	Impl       string        `json:"impl"`
	Keys       string        `json:"keys"`            // uint64 or string
	Dist       string        `json:"dist,omitempty"`  // uniform or zipf: hit, churn, mixed, hotset
	Peers      int           `json:"peers"`           // P
	Goroutines int           `json:"goroutines"`      // G
	Procs      int           `json:"procs"`           // GOMAXPROCS during the run; 0 leaves it
	Duration   time.Duration `json:"duration_ns"`     // hit, churn, mixed: how long to measure
	Cost       string        `json:"cost"`            // creation cost model, see ParseCost
	Churn      float64       `json:"churn,omitempty"` // churn: fraction of operations that report failure; lease: fraction that invalidate
	Failures   int           `json:"failures,omitempty"`
	Reads      float64       `json:"reads,omitempty"` // mixed: fraction of Gets
	// Ctx is the context the workload's Gets pass: "" (or "background")
	// for one that never ends, as the send of a messaging layer that never
	// gives up on a peer passes; "cancel" for one that can end, as a
	// request-scoped call passes. epcache runs a creation on the claiming
	// Get's goroutine only in the first case (see Config.Create).
	Ctx string `json:"ctx,omitempty"`
	// RTT models network delay in the mesh workloads (tcpstorm, ucxstorm):
	// opening an endpoint first waits RTT for each round trip its setup
	// waits for (see mesh.roundTrips). Loopback has none, and on few cores
	// concurrent creation cannot help a creation that is pure CPU; real
	// networks add tens of µs to a millisecond inside a data centre and tens
	// of ms across regions. A model, not a measurement: the wait is a timer.
	RTT time.Duration `json:"rtt_ns,omitempty"`
	// Cap (hotset) bounds the endpoints a comparator may hold, creations
	// included: epcache's MaxEntries, otter's MaximumSize, the LRU's size.
	// The pool takes no bound.
	Cap int `json:"cap,omitempty"`
	// Zipf (hotset, with Dist "zipf") is the exponent s of the access
	// distribution: peer k is drawn with a probability proportional to
	// (1+k)^-s. Go's Zipf takes s > 1.
	Zipf float64 `json:"zipf,omitempty"`
	// Idle (hotset) is how long an endpoint may stay unused before the
	// comparators that remove idle endpoints remove it: the pool's reaper
	// (its only bound) and epcache-idle (IdleTimeout). 0: neither does.
	Idle time.Duration `json:"idle_ns,omitempty"`
	Seed uint64        `json:"seed"`
}

// Result is what a run measured.
type Result struct {
	Spec
	Ops         uint64        `json:"ops"`           // Gets (and Invalidates, in mixed)
	Elapsed     time.Duration `json:"elapsed_ns"`    // the measured phase
	OpsPerSec   float64       `json:"ops_per_sec"`   // Ops / Elapsed
	NsPerOp     float64       `json:"ns_per_op"`     // steady workloads: Elapsed / Ops; storm, flaky: the completion time
	Completion  time.Duration `json:"completion_ns"` // storm, flaky: until every goroutine had every peer
	P50         time.Duration `json:"p50_ns"`
	P99         time.Duration `json:"p99_ns"`
	P999        time.Duration `json:"p999_ns"`
	Max         time.Duration `json:"max_ns"`
	Sampling    int           `json:"latency_sampling"` // one Get in Sampling was timed
	CDF         []Quantile    `json:"latency_cdf,omitempty"`
	AllocsPerOp float64       `json:"allocs_per_op"`
	// BytesPerEntry is the heap the cache grew by while it was filled, less
	// the endpoints themselves, per peer (hit only).
	BytesPerEntry  float64 `json:"bytes_per_entry,omitempty"`
	Creates        uint64  `json:"creates"`
	Attempts       uint64  `json:"attempts"`
	Distinct       uint64  `json:"distinct"`
	Invalidations  uint64  `json:"invalidations"`
	Duplicates     uint64  `json:"duplicates"` // per peer: creations beyond the first and one per invalidation
	Releases       uint64  `json:"releases"`
	Leaked         int64   `json:"leaked"` // Creates - Releases, after Close
	DoubleReleases uint64  `json:"double_releases"`
	ReleasedInUse  uint64  `json:"released_in_use"` // releases under a lease's use: the bug leases prevent
	Overlap        int     `json:"overlap"`         // most creations of one peer in flight at once
	// Concurrency is the most creations in flight at once, all peers
	// together: 1 for a comparator that serialises every creation.
	Concurrency int    `json:"concurrency"`
	Errors      uint64 `json:"errors"` // Gets that failed or returned another peer's endpoint
	// MeanCreate is the mean time of a creation attempt made while the
	// run measured: the free creations that fill a cache first are left
	// out, so a run that created nothing while it measured has 0.
	MeanCreate time.Duration `json:"mean_create_ns"`
	// FDsBefore and FDsAfter are the open file descriptors before a mesh
	// workload (tcpstorm) started its peers and after it closed everything.
	FDsBefore int `json:"fds_before,omitempty"`
	FDsAfter  int `json:"fds_after,omitempty"`
	// HitRatio (hotset) is the share of the measured operations that
	// created nothing: 1 − creations/operations, with every creation the
	// measured phase made counted, duplicates and reloads included.
	HitRatio float64 `json:"hit_ratio,omitempty"`
	// PeakLive is the most endpoints live at once over the whole run, all
	// peers together: an endpoint is live from the start of its creation
	// until its release returns (see Overshoot).
	PeakLive int64 `json:"peak_live"`
	// CPUPerOp is the process's CPU time over the measured phase, user
	// and system, every thread (the workload's goroutines, the runtime's,
	// the collector's), in ns per operation; a storm's operations are its
	// Gets. Time the process waited for a core another program held is not
	// in it, as it is in NsPerOp: on a busy machine it moves less. 0 where
	// no process CPU clock is read.
	CPUPerOp float64 `json:"cpu_ns_per_op,omitempty"`
	// Pair numbers, from 1, the interleaved pair of runs (epcache, then a
	// comparator) this run was one half of, where epbench ran it as one
	// (its CPU figures); 0 for every other run. Run leaves it 0.
	Pair int `json:"pair,omitempty"`
	// SpinRatio is how much faster two spinning goroutines ran at this
	// run's GOMAXPROCS than at 1, measured just before the run, where
	// epbench measured it (the runs whose ratios need a second core
	// free); 0 for every other run. Run leaves it 0.
	SpinRatio float64 `json:"spin_ratio,omitempty"`
	// Failure says why the run is a failure: a leak, a double release, a
	// wrong answer, or a broken exactly-once promise. Empty when it is not.
	Failure string `json:"failure,omitempty"`
	// Machine is the machine the run was measured on (Machine), set by
	// epbench; Run leaves it empty.
	Machine string `json:"machine,omitempty"`
}

// Overshoot is how far the run's peak of live endpoints went above its cap
// (hotset): negative when it stayed below.
func (r Result) Overshoot() int64 { return r.PeakLive - int64(r.Cap) }

// Quantile is one point of a latency distribution.
type Quantile struct {
	Percentile float64       `json:"percentile"`
	Latency    time.Duration `json:"latency_ns"`
}

// Name is the run's benchmark name, split by benchstat into its keys:
// "Storm/impl=epcache/keys=uint64/peers=1024/goroutines=64".
func (s Spec) Name() string {
	var b strings.Builder
	b.WriteString(strings.ToUpper(s.Workload[:1]) + s.Workload[1:])
	add := func(k, v string) { b.WriteString("/" + k + "=" + v) }
	add("impl", s.Impl)
	add("keys", s.Keys)
	if !s.IsStorm() {
		add("dist", s.Dist)
	}
	if s.Workload == "hotset" && s.Dist == "zipf" {
		add("s", strconv.FormatFloat(s.Zipf, 'g', -1, 64))
	}
	add("peers", strconv.Itoa(s.Peers))
	add("goroutines", strconv.Itoa(s.Goroutines))
	if s.Workload == "hotset" {
		add("cap", strconv.Itoa(s.Cap))
		if s.Idle > 0 {
			add("idle", s.Idle.String())
		}
	}
	if s.IsMesh() {
		add("rtt", s.RTT.String())
	}
	if s.Ctx == "cancel" {
		add("ctx", s.Ctx)
	}
	if s.Workload == "storm" || s.Workload == "flaky" || s.Workload == "hotset" {
		add("cost", s.Cost)
	}
	switch s.Workload {
	case "churn":
		add("churn", strconv.FormatFloat(s.Churn*100, 'g', -1, 64)+"%")
	case "lease":
		add("invalidate", strconv.FormatFloat(s.Churn*100, 'g', -1, 64)+"%")
	case "flaky":
		add("failures", strconv.Itoa(s.Failures))
	case "mixed":
		add("reads", strconv.FormatFloat(s.Reads*100, 'g', -1, 64)+"%")
	}
	return b.String()
}

// getContext returns the context the workload's Gets pass (see Spec.Ctx),
// from the run's ctx: ctx itself for "cancel", otherwise its values without
// its cancellation, whose Done is nil.
func (s Spec) getContext(ctx context.Context) context.Context {
	if s.Ctx == "cancel" {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// IsMesh reports whether s runs on a mesh of real endpoints (tcpstorm,
// ucxstorm), whose creation cost is their own, not Cost's.
func (s Spec) IsMesh() bool {
	_, isMesh := meshes[s.Workload]
	return isMesh
}

// IsStorm reports whether s is a storm (storm, flaky, or a mesh storm such as
// tcpstorm): one operation is the whole storm, measured to completion.
func (s Spec) IsStorm() bool {
	return s.Workload == "storm" || s.Workload == "flaky" || s.IsMesh()
}

// MeasuresCreation reports whether the measured phase of s creates
// endpoints, so that a creation cost means something beside its results: a
// storm creates every peer and hotset creates on its misses, while hit
// never creates, and churn, mixed and lease create only after they
// invalidate (churn above 0, reads below 1). The steady workloads fill
// their cache before they measure, at no cost (see Result.MeanCreate).
func (s Spec) MeasuresCreation() bool {
	switch s.Workload {
	case "hit":
		return false
	case "churn", "lease":
		return s.Churn > 0
	case "mixed":
		return s.Reads < 1
	}
	return true
}

// Validate reports the first thing wrong with s.
func (s Spec) Validate() error {
	switch {
	case !slices.Contains(Workloads, s.Workload):
		return fmt.Errorf("bench: unknown workload %q; want one of %s", s.Workload, strings.Join(Workloads, ", "))
	case s.Keys != "uint64" && s.Keys != "string":
		return fmt.Errorf("bench: keys %q; want uint64 or string", s.Keys)
	case s.Dist != "uniform" && s.Dist != "zipf":
		return fmt.Errorf("bench: dist %q; want uniform or zipf", s.Dist)
	case s.Peers < 1 || s.Peers > 1<<30:
		return fmt.Errorf("bench: peers %d; want 1 to 2^30", s.Peers)
	case s.Goroutines < 1 || s.Goroutines > 1<<16:
		return fmt.Errorf("bench: goroutines %d; want 1 to 65536", s.Goroutines)
	case s.Procs < 0:
		return fmt.Errorf("bench: procs %d; want 0 (leave GOMAXPROCS) or more", s.Procs)
	case s.Duration <= 0 && (s.Workload == "hit" || s.Workload == "churn" || s.Workload == "mixed" || s.Workload == "lease" || s.Workload == "hotset"):
		return fmt.Errorf("bench: duration %v; want a positive duration for %s", s.Duration, s.Workload)
	case s.Churn < 0 || s.Churn > 1:
		return fmt.Errorf("bench: churn %v; want a fraction from 0 to 1", s.Churn)
	case s.Reads < 0 || s.Reads > 1:
		return fmt.Errorf("bench: reads %v; want a fraction from 0 to 1", s.Reads)
	case s.Failures < 0:
		return fmt.Errorf("bench: failures %d; want 0 or more", s.Failures)
	case s.Ctx != "" && s.Ctx != "background" && s.Ctx != "cancel":
		return fmt.Errorf("bench: ctx %q; want background or cancel", s.Ctx)
	case s.RTT < 0:
		return fmt.Errorf("bench: rtt %v; want 0 (loopback as it is) or a positive duration", s.RTT)
	case s.RTT > 0 && !s.IsMesh():
		return fmt.Errorf("bench: rtt %v for %s; only the mesh workloads (tcpstorm, ucxstorm) model network delay", s.RTT, s.Workload)
	case s.Workload != "hotset" && (s.Cap != 0 || s.Zipf != 0 || s.Idle != 0):
		return fmt.Errorf("bench: cap %d, zipf %v, idle %v for %s; only hotset bounds the cache", s.Cap, s.Zipf, s.Idle, s.Workload)
	case s.Workload == "hotset" && s.Cap < 1:
		return fmt.Errorf("bench: cap %d; hotset wants a positive bound", s.Cap)
	case s.Workload == "hotset" && s.Dist == "zipf" && !(s.Zipf > 1 && s.Zipf < 100):
		return fmt.Errorf("bench: zipf %v; want an exponent above 1 (and below 100)", s.Zipf)
	case s.Idle < 0:
		return fmt.Errorf("bench: idle %v; want 0 (never) or a positive duration", s.Idle)
	}
	if _, err := ParseCost(s.Cost); err != nil {
		return err
	}
	_, err := ImplNamed(s.Impl)
	return err
}

// Run runs s and returns what it measured. A comparator that cannot serve the
// keys gives ErrUnsupported; a run that leaks or breaks a promise is not an
// error but a Result with Failure set.
func Run(ctx context.Context, s Spec) (Result, error) {
	if err := s.Validate(); err != nil {
		return Result{}, err
	}
	if s.Procs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(s.Procs))
	}
	switch s.Keys {
	case "string":
		return run(ctx, s, stringKeys(s.Peers), false)
	default:
		return run(ctx, s, uint64Keys(s.Peers), true)
	}
}

// flakyRetry is the retry policy of the flaky workload, for every comparator:
// inside epcache's one creation, in the caller for the others.
var flakyRetry = epcache.Backoff(100*time.Microsecond, 5*time.Millisecond, 0,
	func(err error) bool { return errors.Is(err, ErrNotPublished) })

func run[K comparable](ctx context.Context, s Spec, ks keySet[K], dense bool) (Result, error) {
	cost, _ := ParseCost(s.Cost)
	failures := 0
	if s.Workload == "flaky" {
		failures = s.Failures
	}
	l := NewLedger(s.Peers, cost, failures)
	env := Env[K]{
		Create:  func(ctx context.Context, k K) (*Endpoint, error) { return l.Create(ctx, ks.peer(k)) },
		Release: func(_ K, ep *Endpoint) { l.Release(ep) },
		Peers:   s.Peers,
		Cap:     s.Cap,
		Idle:    s.Idle,
	}
	if dense {
		env.Index = ks.peer
	}
	if s.Workload == "flaky" {
		env.Retry = flakyRetry
	}
	var heapBefore uint64
	if s.Workload == "hit" {
		heapBefore = heapInUse()
	}
	im, _ := ImplNamed(s.Impl)
	r := Result{Spec: s}
	if _, isMesh := meshes[s.Workload]; isMesh {
		if im.Dense && !dense {
			return Result{}, ErrUnsupported
		}
		if err := warmMesh(ctx, s, ks, dense); err != nil {
			return Result{}, err
		}
		ph, ml, err := meshStorm(ctx, s, ks, dense, &r)
		if ml == nil {
			return Result{}, err
		}
		return finish(r, ph, ml, im, err), nil
	}
	c, err := New(s.Impl, env)
	if err != nil {
		return Result{}, err
	}
	if _, ok := c.(Leaser[K]); !ok && s.Workload == "lease" {
		_ = c.Close()
		return Result{}, ErrUnsupported
	}
	var ph phase
	switch s.Workload {
	case "storm", "flaky":
		ph = storm(ctx, s, c, ks, !im.Retries)
	case "hotset":
		ph = hotset(ctx, s, c, ks, l)
	default:
		fill(ctx, c, ks, s.Goroutines, l)
		if s.Workload == "hit" {
			grown := float64(heapInUse()) - float64(heapBefore)
			r.BytesPerEntry = (grown - float64(l.Counts().Creates)*float64(unsafe.Sizeof(Endpoint{}))) / float64(s.Peers)
		}
		ph = steady(ctx, s, c, ks, l)
	}
	return finish(r, ph, l, im, c.Close()), nil
}

var (
	warmMu sync.Mutex
	warmed = map[string]bool{} // mesh workloads and sizes this process has warmed up
)

// warmMesh runs, and discards, one storm of s's mesh the first time this
// process runs a mesh of its size: the first one pays for the process's
// first hundreds of goroutine stacks, sockets and heap growth, and took 2 to
// 3 times as long as the next, whichever comparator ran first (epcache, in
// Impls order).
func warmMesh[K comparable](ctx context.Context, s Spec, ks keySet[K], dense bool) error {
	key := fmt.Sprintf("%s/%d/%d", s.Workload, s.Peers, s.Goroutines)
	warmMu.Lock()
	defer warmMu.Unlock()
	if warmed[key] {
		return nil
	}
	w := s
	w.RTT = 0
	var r Result
	_, l, err := meshStorm(ctx, w, ks, dense, &r)
	if l == nil {
		return err
	}
	warmed[key] = true
	return nil
}

// finish fills r from the measured phase and the ledger, and judges it.
func finish(r Result, ph phase, l *Ledger, im Impl, closeErr error) Result {
	ph.fill(&r)
	counts := l.Counts()
	r.Creates, r.Attempts, r.Distinct, r.Releases = counts.Creates, counts.Attempts, counts.Distinct, counts.Releases
	r.DoubleReleases, r.Overlap, r.MeanCreate = counts.DoubleReleases, counts.Overlap, counts.MeanCreate
	r.Duplicates, r.Concurrency, r.ReleasedInUse = counts.Duplicates, counts.Concurrency, counts.ReleasedInUse
	r.PeakLive = counts.PeakLive
	if r.Workload == "hotset" {
		// Every eviction entitles its peer to a new creation, and the
		// ledger does not see evictions: overlap is the exactly-once check
		// here.
		r.Duplicates = 0
	}
	r.Leaked = int64(r.Creates) - int64(r.Releases)
	r.Failure = failure(r, im, closeErr)
	return r
}

func failure(r Result, im Impl, closeErr error) string {
	var why []string
	if r.Leaked != 0 {
		why = append(why, fmt.Sprintf("leaked %d endpoints", r.Leaked))
	}
	if r.DoubleReleases != 0 {
		why = append(why, fmt.Sprintf("released %d endpoints twice", r.DoubleReleases))
	}
	// A comparator without leases (otter, the LRU) may release an endpoint
	// its caller still uses: the hotset workload reports how often, as
	// the finding it is, not as a failure of the run.
	if r.ReleasedInUse != 0 && im.Leases {
		why = append(why, fmt.Sprintf("released %d endpoints while a lease used them", r.ReleasedInUse))
	}
	if im.Bounded && r.Workload == "hotset" && r.PeakLive > int64(r.Cap) {
		why = append(why, fmt.Sprintf("peak live %d above the cap %d", r.PeakLive, r.Cap))
	}
	if r.Errors != 0 {
		why = append(why, fmt.Sprintf("%d Gets failed or returned another peer's endpoint", r.Errors))
	}
	if im.ExactlyOnce && (r.Overlap > 1 || r.Duplicates > 0) {
		why = append(why, fmt.Sprintf("exactly-once broken: overlap %d, duplicates %d", r.Overlap, r.Duplicates))
	}
	if closeErr != nil {
		why = append(why, "Close: "+closeErr.Error())
	}
	if leak := fdLeak(r); leak != "" {
		why = append(why, leak)
	}
	return strings.Join(why, "; ")
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC() // the second cycle frees what the first one's finalizers left
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// phase is what the measured part of a workload reports.
type phase struct {
	ops, errors, invalidations uint64
	elapsed, completion        time.Duration
	allocs                     uint64
	cpu                        time.Duration // processCPU over the phase
	hist                       *hdrhistogram.Histogram
	sampling                   int
	hitRatio                   float64 // hotset
}

func (ph phase) fill(r *Result) {
	r.Ops, r.Errors, r.Invalidations = ph.ops, ph.errors, ph.invalidations
	r.Elapsed, r.Completion, r.Sampling, r.HitRatio = ph.elapsed, ph.completion, ph.sampling, ph.hitRatio
	if ph.elapsed > 0 {
		r.OpsPerSec = float64(ph.ops) / ph.elapsed.Seconds()
	}
	switch {
	case ph.completion > 0:
		r.NsPerOp = float64(ph.completion)
	case ph.ops > 0:
		r.NsPerOp = float64(ph.elapsed) / float64(ph.ops)
	}
	if ph.ops > 0 {
		r.AllocsPerOp = float64(ph.allocs) / float64(ph.ops)
		r.CPUPerOp = float64(ph.cpu) / float64(ph.ops)
	}
	h := ph.hist
	r.P50 = time.Duration(h.ValueAtQuantile(50))
	r.P99 = time.Duration(h.ValueAtQuantile(99))
	r.P999 = time.Duration(h.ValueAtQuantile(99.9))
	r.Max = time.Duration(h.Max())
	for _, p := range []float64{0, 10, 25, 50, 75, 90, 95, 97.5, 99, 99.5, 99.75, 99.9, 99.95, 99.99, 100} {
		r.CDF = append(r.CDF, Quantile{p, time.Duration(h.ValueAtQuantile(p))})
	}
}

// newHist tracks latencies from 1 ns to 100 s with three significant digits.
func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, int64(100*time.Second), 3) }
