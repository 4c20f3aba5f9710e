package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// FaultsResult is the kill-and-restart scenario: one process of the mesh is
// killed with SIGKILL while the others send to it, its lease expires, and
// it is started again.
type FaultsResult struct {
	Processes int           `json:"processes"`
	Victim    int           `json:"victim"`
	TTL       time.Duration `json:"lease_ttl_ns"`
	ErrorTTL  time.Duration `json:"error_ttl_ns"`
	Senders   int           `json:"senders"` // goroutines per survivor sending to the victim
	// Hammer is how long each survivor went on sending to the victim after
	// its first failed send (and until one was answered by the remembered
	// failure); HammerTook is how long the longest survivor sent, from
	// before the kill.
	Hammer     time.Duration `json:"hammer_ns"`
	HammerTook time.Duration `json:"hammer_took_ns"`

	// Sends to the victim, from before the kill to the end of Hammer.
	Sends  int64 `json:"sends"`
	Failed int64 `json:"failed"`
	// Hung counts Sends that ended only because their own timeout
	// (-send-timeout) did: there must be none.
	Hung      int64            `json:"hung"`
	MaxFailed time.Duration    `json:"max_failed_send_ns"` // the slowest failed Send
	Kinds     map[string]int64 `json:"error_kinds"`
	LastError string           `json:"last_error"`
	// FirstError is, over the survivors, the latest first failure after
	// the kill: by then every survivor had its error.
	FirstError time.Duration `json:"first_error_ns"`
	// DialAttempts are each survivor's connection attempts to the victim
	// during the run; ErrorTTL bounds them to DialBound: one per ErrorTTL
	// the survivor sent for, one for the connection the kill broke, and one
	// for each new address of the victim its watch told of (tcp.Peer
	// forgets the failure then: the victim's lease, short, may have lapsed
	// and been renewed while it lived).
	DialAttempts []uint64 `json:"dial_attempts"`
	DialBound    []uint64 `json:"dial_bound"`
	ErrorHits    uint64   `json:"error_hits"` // Sends answered by the remembered failure, all survivors

	// Survivors is the all-to-all among the survivors while the victim is
	// dead: every message must arrive.
	SurvivorsExpected  int64 `json:"survivors_expected"`
	SurvivorsDelivered int64 `json:"survivors_delivered"`

	// Withdrawn is how long after the kill each survivor's lookups of the
	// victim said "withdrawn" (its lease expired); -1: never.
	Withdrawn   []time.Duration `json:"withdrawn_ns"`
	LookupError string          `json:"lookup_error"`

	OldAddr string        `json:"old_addr"`
	NewAddr string        `json:"new_addr"`
	NewPID  int           `json:"new_pid"`
	Restart time.Duration `json:"restart_ns"` // from the new process's start to its address published

	// ForgetAvailable reports that transport/tcp's Peer has Forget, which
	// each process calls on the watch's news of a peer back.
	ForgetAvailable bool `json:"forget_available"`
	// Watch is how long after the restarted victim published its address
	// each survivor's watch told of it.
	Watch []time.Duration `json:"watch_ns"`
	// Reconnected reports that every survivor reached the restarted victim
	// by sending to it before the victim sent anything: it learned of the
	// new address from the watch. Reconnect is when, after the
	// publication.
	Reconnected   bool            `json:"reconnected"`
	Reconnect     []time.Duration `json:"reconnect_ns"`
	ProbeAttempts []int           `json:"probe_attempts"`
	ProbeError    string          `json:"probe_error,omitempty"`
	// ErrorTTLActive reports that every survivor's remembered failure
	// (from its first failed send to the victim, which it never had to
	// dial again) would still have answered at the publication: only then
	// does reaching the victim show that the watch, not the end of
	// ErrorTTL, let the survivors through. ErrorTTLLeft is, at the
	// latest reconnection, how long it would still have answered.
	ErrorTTLActive bool          `json:"error_ttl_active"`
	ErrorTTLLeft   time.Duration `json:"error_ttl_left_ns"`
	// ReconnectedBy is "watch", or "hello" when the survivors reached the
	// victim only once it had connected to them (its hello makes them
	// forget the failure): the workaround while tcp cannot forget on the
	// watch's word.
	ReconnectedBy string `json:"reconnected_by"`

	// After the restart, every process sends to every other again.
	AfterExpected   int64 `json:"after_expected"`
	AfterDelivered  int64 `json:"after_delivered"`
	AfterDuplicates int   `json:"after_duplicates"`
	AfterErrors     int64 `json:"after_send_errors"`

	ConnsMin       int      `json:"conns_per_pair_min"`
	ConnsMax       int      `json:"conns_per_pair_max"`
	Stray          int      `json:"stray_ends"`
	SocketsChecked bool     `json:"sockets_checked"`
	BadPairs       []string `json:"bad_pairs,omitempty"`
	OpenEnds       int64    `json:"open_ends"`
	FDsBefore      int      `json:"fds_before"`
	FDsAfter       int      `json:"fds_after"`

	Violations []string `json:"violations,omitempty"`
	Notes      []string `json:"notes,omitempty"`

	// PerProcess is each process's counters at the end (in -json only).
	PerProcess []ProcessReport `json:"per_process"`
}

// Phases of the scenario's messages.
const (
	phaseWarm = iota + 1
	phaseSurvivors
	phaseProbe
	phaseGreet
	phaseAfter
	phaseFromVictim
)

// preKill is how long the survivors send to the victim before it is
// killed: the kill comes mid-run.
const preKill = 300 * time.Millisecond

// runFaults runs the kill-and-restart scenario with n processes; the victim
// is the last.
func runFaults(ctx context.Context, e *env, n int) (FaultsResult, error) {
	o := e.o
	victim := n - 1
	ids := allIDs(n)
	survivors := without(ids, victim)
	res := FaultsResult{Processes: n, Victim: victim, TTL: o.ttl, ErrorTTL: o.errorTTL, Senders: o.g, Hammer: o.hammer,
		SurvivorsExpected: int64(len(survivors) * (len(survivors) - 1) * o.m),
		AfterExpected:     int64(n * (n - 1) * o.m)}
	set, err := e.start(ctx, "faults", n, victim)
	if err != nil {
		return res, err
	}
	defer set.close()
	res.ForgetAvailable = set.forget
	listens, err := listenAll(ctx, set, set.procs)
	if err != nil {
		return res, err
	}
	res.OldAddr = listens[victim].Addr
	surv := pick(set.procs, survivors)
	// The victim connects to every survivor first, and each survivor keeps
	// that connection: no survivor looks the victim up while it lives. Its
	// lease is the short one the scenario tests, and a keep-alive that a
	// busy machine delays lets it lapse for a moment (etcddir publishes
	// again at once); a survivor that looked it up then would remember a
	// withdrawn, live peer as failed.
	if x, err := exchangeResult(ctx, []*proc{set.procs[victim]}, phaseFromVictim, ids, 1, o); err != nil {
		return res, err
	} else if x.errors > 0 {
		return res, fmt.Errorf("the victim's first sends to the survivors: %d failed", x.errors)
	}
	if err := exchange(ctx, set.procs, phaseWarm, ids, min(o.m, 10), o); err != nil {
		return res, err
	}

	// The survivors send to the victim; it is killed under them.
	type hammered struct {
		r   []hammerReply
		err error
	}
	hch := make(chan hammered, 1)
	go func() {
		r, err := callAll[hammerReply](ctx, surv, func(*proc) request {
			return request{Op: opHammer, Peer: victim, G: o.g, Dur: o.hammer, Timeout: o.timeout, SendTimeout: o.sendTimeout}
		})
		hch <- hammered{r, err}
	}()
	if err := pause(ctx, preKill); err != nil {
		return res, err
	}
	killed := time.Now()
	set.procs[victim].kill()
	type withdrawn struct {
		r   []withdrawnReply
		err error
	}
	wch := make(chan withdrawn, 1)
	go func() {
		r, err := callAll[withdrawnReply](ctx, surv, func(*proc) request {
			return request{Op: opWithdrawn, Peer: victim, Timeout: o.ttl + o.timeout}
		})
		wch <- withdrawn{r, err}
	}()
	h := <-hch
	if h.err != nil {
		return res, h.err
	}
	res.Kinds = map[string]int64{}
	for _, r := range h.r {
		res.Sends += r.Sends
		res.Failed += r.Failed
		res.Hung += r.Hung
		res.MaxFailed = max(res.MaxFailed, r.MaxFailed)
		res.ErrorHits += r.ErrorHits
		res.HammerTook = max(res.HammerTook, r.Elapsed)
		res.DialAttempts = append(res.DialAttempts, r.DialAttempts)
		res.DialBound = append(res.DialBound, uint64(r.Elapsed/o.errorTTL)+2+uint64(r.News))
		for k, v := range r.Kinds {
			res.Kinds[k] += v
		}
		if r.LastErr != "" {
			res.LastError = r.LastErr
		}
		if r.FirstFailure != 0 {
			res.FirstError = max(res.FirstError, time.Duration(r.FirstFailure-killed.UnixNano()))
		}
	}

	// The others are not disturbed.
	sa, err := exchangeResult(ctx, surv, phaseSurvivors, survivors, o.m, o)
	if err != nil {
		return res, err
	}
	res.SurvivorsDelivered = sa.delivered

	w := <-wch
	if w.err != nil {
		return res, w.err
	}
	for _, r := range w.r {
		d := time.Duration(-1)
		if r.Seen {
			d = time.Duration(r.At - killed.UnixNano())
		}
		res.Withdrawn = append(res.Withdrawn, d)
		res.LookupError = r.Err
	}

	// The victim comes back: a new process, the same id, a new address.
	started := time.Now()
	vp, err := set.respawn(ctx, victim)
	if err != nil {
		return res, err
	}
	res.NewPID = vp.pid
	var lr listenReply
	if err := vp.call(ctx, request{Op: opListen}, &lr); err != nil {
		return res, err
	}
	if err := vp.call(ctx, request{Op: opSync, Dir: dirTCP, Timeout: o.timeout}, nil); err != nil {
		return res, err
	}
	res.NewAddr = lr.Addr
	res.Restart = time.Duration(lr.At - started.UnixNano())
	listens[victim] = lr

	// The survivors send to it first: only the watch can tell them it is
	// back before ErrorTTL ends.
	probeFor := time.Second // enough to show that the remembered failure answers
	if res.ForgetAvailable {
		probeFor = min(o.errorTTL/2, o.timeout)
	}
	probes, err := callAll[probeReply](ctx, surv, func(*proc) request {
		return request{Op: opProbe, Peer: victim, Phase: phaseProbe, Timeout: probeFor, SendTimeout: o.sendTimeout}
	})
	if err != nil {
		return res, err
	}
	res.Reconnected = true
	res.ErrorTTLActive = true
	res.ErrorTTLLeft = o.errorTTL
	for k, p := range probes {
		if f := h.r[k].FirstFailure; f == 0 || f+int64(o.errorTTL) <= lr.At {
			res.ErrorTTLActive = false
		}
		res.ProbeAttempts = append(res.ProbeAttempts, p.Attempts)
		wd := time.Duration(-1)
		if p.WatchAt != 0 {
			// 0 when the watch told of it before the restarted process
			// had etcd's answer to its publication.
			wd = max(time.Duration(p.WatchAt-lr.At), 0)
		}
		res.Watch = append(res.Watch, wd)
		if !p.OK {
			res.Reconnected = false
			res.ProbeError = p.LastErr
			res.Reconnect = append(res.Reconnect, -1)
			continue
		}
		res.Reconnect = append(res.Reconnect, time.Duration(p.At-lr.At))
		if f := h.r[k].FirstFailure; f != 0 {
			res.ErrorTTLLeft = min(res.ErrorTTLLeft, time.Duration(f+int64(o.errorTTL)-p.At))
		}
	}
	if res.Reconnected {
		res.ReconnectedBy = "watch"
		a, err := awaitAll(ctx, []*proc{vp}, phaseProbe, survivors, 1, o.timeout)
		if err != nil {
			return res, err
		}
		if !a[0].Complete {
			res.Violations = append(res.Violations, fmt.Sprintf("the restarted process received %v of the survivors' first sends; want one each", a[0].Received))
		}
	} else {
		// The workaround: the restarted process greets every survivor;
		// its hello (a new incarnation) makes each forget the failure.
		res.ReconnectedBy = "hello"
		if _, err := exchangeResult(ctx, []*proc{vp}, phaseGreet, ids, 1, o); err != nil {
			return res, err
		}
		if _, err := awaitAll(ctx, surv, phaseGreet, []int{victim}, 1, o.timeout); err != nil {
			return res, err
		}
	}

	// Everyone sends to everyone again: every message arrives.
	aa, err := exchangeResult(ctx, set.procs, phaseAfter, ids, o.m, o)
	if err != nil {
		return res, err
	}
	res.AfterDelivered, res.AfterDuplicates, res.AfterErrors = aa.delivered, aa.duplicates, aa.errors

	pc, stats, err := settlePairs(ctx, set.procs, ids, append(addrs(listens), res.OldAddr), o.timeout)
	if err != nil {
		return res, err
	}
	res.ConnsMin, res.ConnsMax, res.Stray, res.BadPairs, res.SocketsChecked = pc.Min, pc.Max, pc.Stray, pc.Bad, pc.checked
	for _, s := range stats {
		res.OpenEnds += s.Stats.Open()
	}
	res.PerProcess = processReports(set.procs, listens, stats)
	closes, err := callAll[closeReply](ctx, set.procs, func(*proc) request { return request{Op: opClose, Timeout: o.timeout} })
	if err != nil {
		return res, err
	}
	for i := range closes {
		res.FDsBefore += listens[i].FDs
		res.FDsAfter += closes[i].FDs
		res.PerProcess[i].FDsAfter = closes[i].FDs
	}
	if err := set.close(); err != nil {
		return res, err
	}
	res.Violations = append(res.Violations, res.check()...)
	if !res.Reconnected && !res.ForgetAvailable {
		res.Notes = append(res.Notes, fmt.Sprintf("transport/tcp's Peer has no Forget and does not watch the directory itself: "+
			"after the restart, the failure each survivor remembered (ErrorTTL %v) answered its sends for %v (%s); "+
			"the restarted process's own connections (their hello names a new incarnation) made the survivors forget it", o.errorTTL, probeFor, res.ProbeError))
	}
	return res, nil
}

func (r *FaultsResult) check() []string {
	var v []string
	if r.Hung > 0 {
		v = append(v, fmt.Sprintf("%d sends to the killed process hung until their timeout", r.Hung))
	}
	if r.Failed == 0 {
		v = append(v, "no send to the killed process failed")
	}
	for k, d := range r.DialAttempts {
		if d > r.DialBound[k] {
			v = append(v, fmt.Sprintf("survivor %d dialed the dead process %d times in at most %v; ErrorTTL %v allows %d", k, d, r.HammerTook, r.ErrorTTL, r.DialBound[k]))
		}
	}
	if r.ErrorHits == 0 {
		v = append(v, "no send was answered by the remembered failure (ErrorTTL)")
	}
	if r.SurvivorsDelivered != r.SurvivorsExpected {
		v = append(v, fmt.Sprintf("the survivors delivered %d of %d messages among themselves", r.SurvivorsDelivered, r.SurvivorsExpected))
	}
	if slices.Contains(r.Withdrawn, -1) {
		v = append(v, fmt.Sprintf("lookups of the killed process still found it (%s)", r.LookupError))
	}
	switch {
	case r.Reconnected && r.ErrorTTLActive && r.ErrorTTLLeft <= 0:
		v = append(v, "the survivors reached the restarted process only once ErrorTTL had ended")
	case !r.Reconnected && r.ForgetAvailable:
		v = append(v, fmt.Sprintf("the survivors did not reach the restarted process after the watch told of it (%s)", r.ProbeError))
	}
	if r.AfterDelivered != r.AfterExpected || r.AfterErrors > 0 {
		v = append(v, fmt.Sprintf("after the restart, %d of %d messages delivered, %d sends failed", r.AfterDelivered, r.AfterExpected, r.AfterErrors))
	}
	if r.AfterDuplicates > 0 {
		v = append(v, fmt.Sprintf("after the restart, %d messages delivered twice", r.AfterDuplicates))
	}
	v = append(v, pairViolations(r.Processes, r.SocketsChecked, r.ConnsMin, r.ConnsMax, r.Stray, r.BadPairs, r.OpenEnds)...)
	if r.FDsBefore >= 0 && r.FDsAfter != r.FDsBefore {
		v = append(v, fmt.Sprintf("%d descriptors open after close, %d before", r.FDsAfter, r.FDsBefore))
	}
	return v
}

type exchanged struct {
	delivered  int64
	duplicates int
	errors     int64
}

// exchangeResult has each of procs send m messages of phase to every other
// process of ids. When procs are the processes of ids, it then waits until
// each has received its messages from the others; a single sender's
// receivers are left for the caller to await.
func exchangeResult(ctx context.Context, procs []*proc, phase int, ids []int, m int, o options) (exchanged, error) {
	sends, err := callAll[sendReply](ctx, procs, func(p *proc) request {
		return request{Op: opSend, Phase: phase, To: without(ids, p.id), M: m, G: o.g, SendTimeout: o.sendTimeout}
	})
	if err != nil {
		return exchanged{}, err
	}
	var x exchanged
	for _, s := range sends {
		x.errors += s.Errors
	}
	if len(procs) == 1 {
		return x, nil // the receivers are awaited by the caller
	}
	awaits, err := awaitAll(ctx, procs, phase, ids, m, o.timeout)
	if err != nil {
		return x, err
	}
	for _, a := range awaits {
		for _, k := range slices.Collect(maps.Values(a.Received)) {
			x.delivered += int64(k)
		}
		x.duplicates += a.Duplicates
	}
	return x, nil
}

// exchange is exchangeResult that fails on a lost message.
func exchange(ctx context.Context, procs []*proc, phase int, ids []int, m int, o options) error {
	x, err := exchangeResult(ctx, procs, phase, ids, m, o)
	if err != nil {
		return err
	}
	if want := int64(len(ids) * (len(ids) - 1) * m); x.delivered != want || x.errors > 0 || x.duplicates > 0 {
		return fmt.Errorf("phase %d: %d of %d messages delivered, %d sends failed, %d duplicates", phase, x.delivered, want, x.errors, x.duplicates)
	}
	return nil
}
