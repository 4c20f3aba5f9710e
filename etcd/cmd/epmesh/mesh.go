package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/etcd/internal/etcdmetrics"
)

// MeshResult is one all-to-all run of N processes, each a tcp.Peer.
type MeshResult struct {
	Processes int `json:"processes"`
	// DirMode is the etcddir mode of the processes' directories.
	DirMode    string `json:"dir_mode"`
	Goroutines int    `json:"goroutines"` // senders per process
	Messages   int    `json:"messages"`   // per ordered pair

	Expected   int64  `json:"expected"` // N(N-1)·Messages
	Sent       int64  `json:"sent"`
	Delivered  int64  `json:"delivered"`
	Duplicates int    `json:"duplicates"`
	SendErrors int64  `json:"send_errors"`
	FirstError string `json:"first_error,omitempty"`

	Pairs int `json:"pairs"` // N(N-1)/2
	// ConnsMin and ConnsMax are the connections each pair holds once every
	// message has arrived, counted from the kernel's socket tables (end
	// matched to end across processes): both must be 1.
	ConnsMin       int      `json:"conns_per_pair_min"`
	ConnsMax       int      `json:"conns_per_pair_max"`
	Stray          int      `json:"stray_ends"`
	SocketsChecked bool     `json:"sockets_checked"`
	BadPairs       []string `json:"bad_pairs,omitempty"`
	// OpenEnds is tcp.Stats.Open summed over the processes: 2 per pair.
	OpenEnds int64 `json:"open_ends"`

	DialAttempts     uint64 `json:"dial_attempts"`
	Dialed           uint64 `json:"dialed"`
	Accepted         uint64 `json:"accepted"`
	DuplicatesClosed uint64 `json:"duplicates_closed"` // ends closed because the pair keeps another connection
	Refused          uint64 `json:"refused"`
	NotPublished     uint64 `json:"not_published"`
	// Creates and Offers are the endpoint caches' (epcache): one endpoint
	// per process and peer, dialed (a creation) or accepted (an Offer).
	Creates uint64 `json:"creates"`
	Offers  uint64 `json:"offers"`

	// Startup is from the first process started to every process seeing
	// every address in etcd.
	Startup time.Duration `json:"startup_ns"`
	// Complete is the mesh's completion: the longest any process took,
	// from the start signal, until it held a connection to every other
	// (its first message to each had been written). CompleteMedian is the
	// median process's.
	Complete       time.Duration `json:"complete_ns"`
	CompleteMedian time.Duration `json:"complete_median_ns"`
	// Elapsed is from the start signal to the last message delivered.
	Elapsed time.Duration `json:"elapsed_ns"`

	// FDsBefore and FDsAfter are the open descriptors summed over the
	// processes, before each made its peer and once each had closed it.
	FDsBefore int `json:"fds_before"`
	FDsAfter  int `json:"fds_after"`

	Violations []string `json:"violations,omitempty"`

	// Dir is the processes' directory counters, summed, read once every
	// message has arrived: what the directory cost etcd.
	Dir etcddir.Counters `json:"dir"`
	// Etcd is what etcd's metrics counted from before the processes
	// started until then (every run of the invocation shares the etcd:
	// other runs' processes are gone, but an external etcd's other
	// clients count too); EtcdErr says why not, if they could not be read.
	Etcd    etcdmetrics.Snapshot `json:"etcd"`
	EtcdErr string               `json:"etcd_err,omitempty"`

	// PerProcess is each process's own report, by id (in -json only).
	PerProcess []ProcessReport `json:"per_process"`
}

// ProcessReport is what one process of a mesh run said of itself.
type ProcessReport struct {
	ID   int    `json:"id"`
	PID  int    `json:"pid"`
	Addr string `json:"addr"` // its listener
	Open int64  `json:"open_ends"`
	// Complete is how long after the start signal it held a connection to
	// every other process.
	Complete     time.Duration `json:"complete_ns"`
	Received     map[int]int   `json:"received"` // messages by sender
	Duplicates   int           `json:"duplicates"`
	DialAttempts uint64        `json:"dial_attempts"`
	Dialed       uint64        `json:"dialed"`
	Accepted     uint64        `json:"accepted"`
	DupClosed    uint64        `json:"duplicates_closed"`
	NotPublished uint64        `json:"not_published"`
	Creates      uint64        `json:"creates"`
	Offers       uint64        `json:"offers"`
	FDsBefore    int           `json:"fds_before"`
	FDsAfter     int           `json:"fds_after"`
	// Dir is the process's directory counters.
	Dir etcddir.Counters `json:"dir"`
}

// runMesh starts n processes, has each send o.m messages to every other
// from o.g goroutines at once, and checks that every message arrives once,
// over one connection per pair, and that every descriptor is given back.
func runMesh(ctx context.Context, e *env, n int) (MeshResult, error) {
	o := e.o
	res := MeshResult{Processes: n, DirMode: cmp.Or(e.dirMode, "mirror"), Goroutines: o.g, Messages: o.m, Pairs: n * (n - 1) / 2,
		Expected: int64(n * (n - 1) * o.m)}
	etcd0, etcdErr := etcdmetrics.Scrape(ctx, e.endpoints[0])
	t0 := time.Now()
	set, err := e.start(ctx, "mesh", n, -1)
	if err != nil {
		return res, err
	}
	defer set.close()
	listens, err := listenAll(ctx, set, set.procs)
	if err != nil {
		return res, err
	}
	res.Startup = time.Since(t0)
	ids := allIDs(n)

	start := time.Now()
	sends, err := callAll[sendReply](ctx, set.procs, func(p *proc) request {
		return request{Op: opSend, Phase: 1, To: others(n, p.id), M: o.m, G: o.g, SendTimeout: o.sendTimeout}
	})
	if err != nil {
		return res, err
	}
	awaits, err := awaitAll(ctx, set.procs, 1, ids, o.m, o.timeout)
	if err != nil {
		return res, err
	}
	res.Elapsed = time.Since(start)
	var completes []time.Duration
	for i, s := range sends {
		res.Sent += s.Sent
		res.SendErrors += s.Errors
		if s.FirstErr != "" && res.FirstError == "" {
			res.FirstError = fmt.Sprintf("process %d: %s", i, s.FirstErr)
		}
		completes = append(completes, s.Complete)
	}
	res.Complete, res.CompleteMedian = slices.Max(completes), median(completes)
	if slices.Min(completes) < 0 {
		res.Complete = -1
	}
	for _, a := range awaits {
		for _, k := range a.Received {
			res.Delivered += int64(k)
		}
		res.Duplicates += a.Duplicates
	}

	pc, stats, err := settlePairs(ctx, set.procs, ids, addrs(listens), o.timeout)
	if err != nil {
		return res, err
	}
	res.ConnsMin, res.ConnsMax, res.Stray, res.BadPairs, res.SocketsChecked = pc.Min, pc.Max, pc.Stray, pc.Bad, pc.checked
	if etcdErr == nil {
		var etcd1 etcdmetrics.Snapshot
		etcd1, etcdErr = etcdmetrics.Scrape(ctx, e.endpoints[0])
		res.Etcd = etcd1.Sub(etcd0)
	}
	if etcdErr != nil {
		res.EtcdErr = etcdErr.Error()
	}
	for _, s := range stats {
		res.Dir = res.Dir.Add(s.Dir)
		st := s.Stats
		res.OpenEnds += st.Open()
		res.DialAttempts += st.DialAttempts
		res.Dialed += st.Dialed
		res.Accepted += st.Accepted
		res.DuplicatesClosed += st.Duplicates
		res.Refused += st.Refused
		res.NotPublished += st.NotPublished
		res.Creates += st.Cache.Creates
		res.Offers += st.Cache.Offers
	}

	closes, err := callAll[closeReply](ctx, set.procs, func(*proc) request { return request{Op: opClose, Timeout: o.timeout} })
	if err != nil {
		return res, err
	}
	for i := range closes {
		res.FDsBefore += listens[i].FDs
		res.FDsAfter += closes[i].FDs
		st := stats[i].Stats
		res.PerProcess = append(res.PerProcess, ProcessReport{
			ID: i, PID: set.procs[i].pid, Addr: listens[i].Addr, Open: st.Open(), Complete: sends[i].Complete, Received: awaits[i].Received, Duplicates: awaits[i].Duplicates,
			DialAttempts: st.DialAttempts, Dialed: st.Dialed, Accepted: st.Accepted, DupClosed: st.Duplicates,
			NotPublished: st.NotPublished, Creates: st.Cache.Creates, Offers: st.Cache.Offers,
			FDsBefore: listens[i].FDs, FDsAfter: closes[i].FDs, Dir: stats[i].Dir,
		})
	}
	if err := set.close(); err != nil {
		return res, err
	}
	res.Violations = res.check()
	return res, nil
}

// check returns what the run broke of the mesh's promises.
func (r *MeshResult) check() []string {
	var v []string
	if r.SendErrors > 0 {
		v = append(v, fmt.Sprintf("%d sends failed (%s)", r.SendErrors, r.FirstError))
	}
	if r.Sent != r.Expected || r.Delivered != r.Expected {
		v = append(v, fmt.Sprintf("%d messages sent and %d delivered; want %d", r.Sent, r.Delivered, r.Expected))
	}
	if r.Duplicates > 0 {
		v = append(v, fmt.Sprintf("%d messages delivered twice (or garbled)", r.Duplicates))
	}
	if r.Complete < 0 {
		v = append(v, "some process never reached every other")
	}
	v = append(v, pairViolations(r.Processes, r.SocketsChecked, r.ConnsMin, r.ConnsMax, r.Stray, r.BadPairs, r.OpenEnds)...)
	// One endpoint per process and peer, each made once (a creation or an
	// Offer of an accepted connection), and one accepted per pair: with
	// every message delivered, that is one connection per pair and no
	// reconnection (transport/tcp's TestAllToAll asserts the same).
	if want := uint64(r.Processes * (r.Processes - 1)); r.Creates+r.Offers != want {
		v = append(v, fmt.Sprintf("%d endpoints created and %d offered; want %d together", r.Creates, r.Offers, want))
	}
	if r.Offers != uint64(r.Pairs) {
		v = append(v, fmt.Sprintf("%d accepted connections offered; want one per pair, %d", r.Offers, r.Pairs))
	}
	if r.FDsBefore >= 0 && r.FDsAfter != r.FDsBefore {
		v = append(v, fmt.Sprintf("%d descriptors open after close, %d before", r.FDsAfter, r.FDsBefore))
	}
	return v
}

func pairViolations(n int, checked bool, lo, hi, stray int, bad []string, openEnds int64) []string {
	var v []string
	if checked && (lo != 1 || hi != 1) {
		v = append(v, fmt.Sprintf("connections per pair %d to %d, want exactly 1 (%v)", lo, hi, bad))
	}
	if checked && stray > 0 {
		v = append(v, fmt.Sprintf("%d connection ends whose other end no process holds", stray))
	}
	if want := int64(n * (n - 1)); openEnds != want {
		v = append(v, fmt.Sprintf("%d connection ends open; want 2 per pair, %d", openEnds, want))
	}
	return v
}

// listenAll starts the peers of procs and waits until each process sees
// every address.
func listenAll(ctx context.Context, set *procSet, procs []*proc) ([]listenReply, error) {
	listens, err := callAll[listenReply](ctx, procs, func(*proc) request { return request{Op: opListen} })
	if err != nil {
		return nil, err
	}
	_, err = callAll[struct{}](ctx, procs, func(*proc) request {
		return request{Op: opSync, Dir: dirTCP, Timeout: set.env.o.timeout}
	})
	return listens, err
}

// awaitAll waits until each process of procs has m messages of phase from
// each other process of ids.
func awaitAll(ctx context.Context, procs []*proc, phase int, ids []int, m int, timeout time.Duration) ([]awaitReply, error) {
	return callAll[awaitReply](ctx, procs, func(p *proc) request {
		return request{Op: opAwait, Phase: phase, To: without(ids, p.id), M: m, Timeout: timeout}
	})
}

type pairState struct {
	pairCount
	checked bool
}

// settlePairs reads every process's counters and sockets until the sockets
// show one connection per pair and the counters two open ends per pair, or
// timeout has passed (a duplicate's ends close on their own time), and
// returns the last reading.
func settlePairs(ctx context.Context, procs []*proc, ids []int, listeners []string, timeout time.Duration) (pairState, []statsReply, error) {
	deadline := time.Now().Add(timeout)
	for {
		stats, err := callAll[statsReply](ctx, procs, func(*proc) request { return request{Op: opStats} })
		if err != nil {
			return pairState{}, nil, err
		}
		socks := map[int][]socket{}
		ps := pairState{checked: true}
		var open int64
		for k, s := range stats {
			socks[ids[k]] = s.Sockets
			ps.checked = ps.checked && s.SocketsOK
			open += s.Stats.Open()
		}
		ps.pairCount = countPairs(ids, socks, listeners)
		n := len(ids)
		ok := open == int64(n*(n-1)) && (!ps.checked || ps.Min == 1 && ps.Max == 1 && ps.Stray == 0)
		if ok || time.Now().After(deadline) {
			return ps, stats, nil
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return pairState{}, nil, err
		}
	}
}

func addrs(ls []listenReply) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Addr
	}
	return out
}

func allIDs(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	return ids
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// processReports reads the per-process counters of a stats reading.
func processReports(procs []*proc, listens []listenReply, stats []statsReply) []ProcessReport {
	out := make([]ProcessReport, len(procs))
	for i, s := range stats {
		st := s.Stats
		out[i] = ProcessReport{
			ID: procs[i].id, PID: procs[i].pid, Addr: listens[i].Addr, Open: st.Open(),
			DialAttempts: st.DialAttempts, Dialed: st.Dialed, Accepted: st.Accepted, DupClosed: st.Duplicates,
			NotPublished: st.NotPublished, Creates: st.Cache.Creates, Offers: st.Cache.Offers, FDsBefore: listens[i].FDs,
			Dir: s.Dir,
		}
	}
	return out
}
