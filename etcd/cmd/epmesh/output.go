package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// writeTables prints a table per scenario that ran.
func writeTables(w io.Writer, r *Report) error {
	where := "etcd at " + strings.Join(r.Etcd, ",")
	if r.Embedded {
		where = "embedded etcd at " + strings.Join(r.Etcd, ",")
	}
	fmt.Fprintf(w, "epmesh: %s, prefix %s; %s/%s, %d CPUs, %s\n", where, r.Prefix, r.Machine.GOOS, r.Machine.GOARCH, r.Machine.CPUs, r.Machine.Go)
	if len(r.Mesh) > 0 {
		if err := writeMesh(w, r.Mesh); err != nil {
			return err
		}
		if err := writeDirectory(w, r.Mesh); err != nil {
			return err
		}
	}
	for _, f := range r.Faults {
		if err := writeFaults(w, f); err != nil {
			return err
		}
	}
	if len(r.Storm) > 0 {
		if err := writeStorm(w, r.Storm); err != nil {
			return err
		}
	}
	return nil
}

func writeMesh(w io.Writer, rs []MeshResult) error {
	r0 := rs[0]
	fmt.Fprintf(w, "\nmesh: N processes, each a tcp.Peer with its own endpoint cache; every process sends %d messages to every other from %d goroutines, all at once\n", r0.Messages, r0.Goroutines)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tdir\tmessages\tdelivered\tdup\tconns/pair\topen ends\tdial attempts\tdialed\taccepted\tdup closed\tcreates+offers\tmesh complete\tmedian proc\tall delivered\tstartup\tfds before→after\t status")
	for _, r := range rs {
		conns := "-"
		if r.SocketsChecked {
			conns = fmt.Sprintf("%d", r.ConnsMin)
			if r.ConnsMax != r.ConnsMin {
				conns = fmt.Sprintf("%d–%d", r.ConnsMin, r.ConnsMax)
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d+%d\t%s\t%s\t%s\t%s\t%d→%d\t%s\n",
			r.Processes, r.DirMode, r.Expected, r.Delivered, r.Duplicates, conns, r.OpenEnds, r.DialAttempts, r.Dialed, r.Accepted,
			r.DuplicatesClosed, r.Creates, r.Offers, dur(r.Complete), dur(r.CompleteMedian), dur(r.Elapsed), dur(r.Startup),
			r.FDsBefore, r.FDsAfter, status(r.Violations))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "conns/pair: connections each pair holds once every message arrived, from every process's sockets matched end to end (-: no /proc). "+
		"mesh complete: from the start signal until the slowest process held a connection to every other; median proc: the median process's. "+
		"startup: from the first process started to every process seeing every address in etcd. fds: summed over the processes, before each made its peer and after it closed it.")
	return err
}

// writeDirectory prints what the directory of each mesh run cost etcd:
// the counters cmd/dirscale reports, from real processes.
func writeDirectory(w io.Writer, rs []MeshResult) error {
	fmt.Fprintln(w, "\ndirectory: what each mesh run's etcddir cost etcd, every process learning every other's address (d = N-1)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tmode\tetcd events sent\tkeys delivered\tevent bytes\tetcd bytes sent\trequests\trange requests\tfetches\treloads\tetcd process CPU s\t")
	for _, r := range rs {
		etcdEvents, etcdBytes, etcdCPU := "-", "-", "-"
		if r.EtcdErr == "" {
			etcdEvents, etcdBytes, etcdCPU = fmt.Sprintf("%.0f", r.Etcd.EventsSent), fmt.Sprintf("%.0f", r.Etcd.SentBytes), fmt.Sprintf("%.2f", r.Etcd.CPUSeconds)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%s\t\n", r.Processes, r.DirMode, etcdEvents, r.Dir.Events+r.Dir.KeysLoaded,
			r.Dir.EventBytes, etcdBytes, r.Dir.Requests(), r.Dir.Ranges, r.Dir.Fetches, r.Dir.Reloads, etcdCPU)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "etcd events, bytes sent, process CPU: etcd's metrics, from before the processes started to every message delivered "+
		"(with the embedded etcd, the CPU is epmesh's own process: etcd and the parent); the rest: the children's etcddir Counters, summed.")
	return err
}

func writeFaults(w io.Writer, r FaultsResult) error {
	fmt.Fprintf(w, "\nfaults: %d processes; process %d killed with SIGKILL while the %d others send to it (%d goroutines each); lease TTL %v, ErrorTTL %v\n",
		r.Processes, r.Victim, r.Processes-1, r.Senders, r.TTL, r.ErrorTTL)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(step, result string) { fmt.Fprintf(tw, "  %s\t%s\n", step, result) }
	row("sends to the killed process", fmt.Sprintf("%d in %v (%v after each survivor's first failure), %d failed, %d hung; slowest failure %s; every survivor failing %s after the kill",
		r.Sends, dur(r.HammerTook), dur(r.Hammer), r.Failed, r.Hung, dur(r.MaxFailed), dur(r.FirstError)))
	row("errors", kinds(r.Kinds)+"; last: "+r.LastError)
	row("dial attempts to it, per survivor", fmt.Sprintf("%v (ErrorTTL bounds %v); %d sends answered by the remembered failure", r.DialAttempts, r.DialBound, r.ErrorHits))
	row("survivors among themselves", fmt.Sprintf("%d of %d messages delivered", r.SurvivorsDelivered, r.SurvivorsExpected))
	row("lookups say withdrawn, after the kill", durs(r.Withdrawn)+": "+r.LookupError)
	row("restarted", fmt.Sprintf("pid %d, %s (was %s), published %s after it started", r.NewPID, r.NewAddr, r.OldAddr, dur(r.Restart)))
	row("survivors' watch told of it, after publication", durs(r.Watch))
	reach := fmt.Sprintf("reached it, after publication: %s (sends each: %v)", durs(r.Reconnect), r.ProbeAttempts)
	switch {
	case r.Reconnected && r.ErrorTTLActive:
		reach += fmt.Sprintf(" (ErrorTTL would have answered for %s more)", dur(r.ErrorTTLLeft))
	case r.Reconnected:
		reach += " (ErrorTTL had ended before the restart: nothing to forget)"
	default:
		reach = fmt.Sprintf("no: %v probe sends each failed (%s); reached it once it connected to them (its hello)", r.ProbeAttempts, r.ProbeError)
	}
	row("survivors send to it first", reach)
	row("after the restart, all to all", fmt.Sprintf("%d of %d messages delivered, %d duplicates, %d send errors", r.AfterDelivered, r.AfterExpected, r.AfterDuplicates, r.AfterErrors))
	conns := "not checked (no /proc)"
	if r.SocketsChecked {
		conns = fmt.Sprintf("%d to %d per pair, %d stray ends", r.ConnsMin, r.ConnsMax, r.Stray)
	}
	row("connections", fmt.Sprintf("%s; %d ends open", conns, r.OpenEnds))
	row("descriptors", fmt.Sprintf("%d before, %d after close", r.FDsBefore, r.FDsAfter))
	row("status", status(r.Violations))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range r.Notes {
		if _, err := fmt.Fprintln(w, "  note: "+n); err != nil {
			return err
		}
	}
	return nil
}

func writeStorm(w io.Writer, rs []StormResult) error {
	r0 := rs[0]
	fmt.Fprintf(w, "\nstorm: every process gets an endpoint to every other from %d goroutines at once, through its own cache; "+
		"each endpoint a loopback connection dialed after a modelled delay of rtt; median of %d runs\n", r0.Goroutines, len(r0.Completes))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\trtt\timpl\tmesh complete\t×epcache\tmedian proc\truns\tcreates\tdup\toverlap\tfds before→after\t status")
	for _, r := range rs {
		ratio := "-"
		if i := slices.IndexFunc(rs, func(x StormResult) bool {
			return x.Impl == "epcache" && x.RTT == r.RTT && x.Processes == r.Processes
		}); i >= 0 && rs[i].Complete > 0 {
			ratio = fmt.Sprintf("%.2f", float64(r.Complete)/float64(rs[i].Complete))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d→%d\t%s\n",
			r.Processes, dur(r.RTT), r.Impl, dur(r.Complete), ratio, dur(r.PerProcess), durs(r.Completes),
			r.Creates, r.Duplicates, r.Overlap, r.FDsBefore, r.FDsAfter, status(r.Violations))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "mesh complete: until the slowest process had every endpoint; median proc: the median process's; runs: each run's mesh complete. "+
		"creates: endpoints made in a run, all processes (N(N-1) when exactly once); dup: beyond one per process and peer, all runs; overlap: most creations of one endpoint in flight at once.")
	return err
}

func status(v []string) string {
	if len(v) == 0 {
		return " ok"
	}
	return " FAIL: " + strings.Join(v, "; ")
}

func kinds(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func durs(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = dur(d)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func dur(d time.Duration) string {
	switch {
	case d < 0:
		return "never"
	case d == 0:
		return "0"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d)
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}
