// Package etcdmetrics reads what an etcd server says of its own work (its
// Prometheus metrics, served on its client URL at /metrics) and what a
// process cost in CPU time (from /proc), for the directory's scaling
// measurements: dirscale and epmesh count, they do not time.
package etcdmetrics

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Snapshot is a reading of an etcd server's counters and gauges.
type Snapshot struct {
	// EventsSent is etcd_debugging_mvcc_events_total: watch events the
	// member sent, to every watcher.
	EventsSent float64 `json:"events_sent"`
	// SentBytes is etcd_network_client_grpc_sent_bytes_total: every byte
	// of every gRPC message the member sent its clients (responses,
	// events, keep-alives).
	SentBytes float64 `json:"sent_bytes"`
	// ReceivedBytes is etcd_network_client_grpc_received_bytes_total.
	ReceivedBytes float64 `json:"received_bytes"`
	// Ranges, Puts, Txns and Deletes are etcd_mvcc_*_total.
	Ranges  float64 `json:"ranges"`
	Puts    float64 `json:"puts"`
	Txns    float64 `json:"txns"`
	Deletes float64 `json:"deletes"`
	// Unary is grpc_server_started_total of unary calls: requests.
	Unary float64 `json:"unary_requests"`
	// Watchers and WatchStreams are the gauges
	// etcd_debugging_mvcc_watcher_total and _watch_stream_total.
	Watchers     float64 `json:"watchers"`
	WatchStreams float64 `json:"watch_streams"`
	// SlowWatchers is etcd_debugging_mvcc_slow_watcher_total: watchers
	// that fell behind and are served from the store in batches.
	SlowWatchers float64 `json:"slow_watchers"`
	// CPUSeconds is process_cpu_seconds_total of the server's process.
	CPUSeconds float64 `json:"cpu_seconds"`
	// ResidentBytes is process_resident_memory_bytes.
	ResidentBytes float64 `json:"resident_bytes"`
}

// Sub returns the counters of s less those of o; gauges are s's.
func (s Snapshot) Sub(o Snapshot) Snapshot {
	return Snapshot{
		EventsSent: s.EventsSent - o.EventsSent, SentBytes: s.SentBytes - o.SentBytes, ReceivedBytes: s.ReceivedBytes - o.ReceivedBytes,
		Ranges: s.Ranges - o.Ranges, Puts: s.Puts - o.Puts, Txns: s.Txns - o.Txns, Deletes: s.Deletes - o.Deletes,
		Unary: s.Unary - o.Unary, Watchers: s.Watchers, WatchStreams: s.WatchStreams, SlowWatchers: s.SlowWatchers,
		CPUSeconds: s.CPUSeconds - o.CPUSeconds, ResidentBytes: s.ResidentBytes,
	}
}

// Scrape reads the metrics of the etcd member whose client URL is url.
func Scrape(ctx context.Context, url string) (Snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/metrics", nil)
	if err != nil {
		return Snapshot{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Snapshot{}, fmt.Errorf("etcdmetrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Snapshot{}, fmt.Errorf("etcdmetrics: %s/metrics: %s", url, resp.Status)
	}
	var s Snapshot
	fields := map[string]*float64{
		"etcd_debugging_mvcc_events_total":              &s.EventsSent,
		"etcd_network_client_grpc_sent_bytes_total":     &s.SentBytes,
		"etcd_network_client_grpc_received_bytes_total": &s.ReceivedBytes,
		"etcd_mvcc_range_total":                         &s.Ranges,
		"etcd_mvcc_put_total":                           &s.Puts,
		"etcd_mvcc_txn_total":                           &s.Txns,
		"etcd_mvcc_delete_total":                        &s.Deletes,
		"etcd_debugging_mvcc_watcher_total":             &s.Watchers,
		"etcd_debugging_mvcc_watch_stream_total":        &s.WatchStreams,
		"etcd_debugging_mvcc_slow_watcher_total":        &s.SlowWatchers,
		"process_cpu_seconds_total":                     &s.CPUSeconds,
		"process_resident_memory_bytes":                 &s.ResidentBytes,
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil || math.IsNaN(v) {
			continue
		}
		name, labels, _ := strings.Cut(line[:sp], "{")
		if name == "grpc_server_started_total" && strings.Contains(labels, `grpc_type="unary"`) {
			s.Unary += v
			continue
		}
		if p := fields[name]; p != nil {
			*p += v
		}
	}
	return s, sc.Err()
}

// clockTick is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times: 100 on every Linux that Go supports.
const clockTick = 100

// ProcCPU returns the CPU time (user and system) the process pid has
// used, from /proc/<pid>/stat: 10 ms resolution.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields after its closing parenthesis are counted from there.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("etcdmetrics: /proc/%d/stat: %d fields after the name", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("etcdmetrics: /proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * time.Second / clockTick, nil
}

// SelfCPU returns the CPU time (user and system) this process has used,
// from getrusage.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Fit returns the least-squares line through (ln x, ln y) of the points
// whose y is positive: y ≈ e^intercept · x^slope. ok is false with fewer
// than two such points.
func Fit(xs, ys []float64) (slope, intercept float64, ok bool) {
	var n, sx, sy, sxx, sxy float64
	for i := range xs {
		if ys[i] <= 0 || xs[i] <= 0 {
			continue
		}
		x, y := math.Log(xs[i]), math.Log(ys[i])
		n++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	if n < 2 || n*sxx-sx*sx == 0 {
		return 0, 0, false
	}
	slope = (n*sxy - sx*sy) / (n*sxx - sx*sx)
	return slope, (sy - slope*sx) / n, true
}
