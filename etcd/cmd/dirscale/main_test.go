package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epcache/epcache/etcd/internal/cmdmain"

	"github.com/epcache/epcache/etcd/internal/etcdmetrics"
)

// TestMain makes the test binary the etcd server of a run when the test
// starts it again with DIRSCALE_ETCD=1, as the command does with itself.
func TestMain(m *testing.M) {
	cmdmain.Copy("dirscale server", serverEnv, runServer)
	os.Exit(m.Run())
}

// The command at tiny N, as a user runs it, and the counts each mode's
// design promises, exactly: they are what the fits at large N rest on.
func TestRunTiny(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx, []string{"-n", "3,5", "-coalesce", "8", "-out", dir}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errb.String())
	}
	t.Log("\n" + out.String())
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 8 {
		t.Fatalf("%d runs; want 4 modes × 2 sizes", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		n := int64(r.N)
		var want map[string][2]int64 // name → got, want
		switch r.Mode {
		case "mirror":
			// Each publication is an event to each of N mirrors; each
			// process reads the prefix, grants, puts and watches.
			want = map[string][2]int64{
				"etcd events": {int64(r.Etcd.EventsSent), n * n}, "events": {r.Dir.Events, n * n},
				"fetches": {r.Dir.Fetches, 0}, "requests": {r.Dir.Requests(), 4 * n},
			}
		case "ring":
			// One fetch per neighbour; one event per process, its own
			// write to its own watch; the guard's read and watch, grant,
			// put, the own watch, two reads.
			want = map[string][2]int64{
				"etcd events": {int64(r.Etcd.EventsSent), n}, "fetches": {r.Dir.Fetches, 2 * n},
				"range requests": {r.Dir.Ranges, 3 * n}, "requests": {r.Dir.Requests(), 7 * n},
			}
		case "all":
			want = map[string][2]int64{
				"etcd events": {int64(r.Etcd.EventsSent), n}, "fetches": {r.Dir.Fetches, n * (n - 1)},
				"range requests": {r.Dir.Ranges, n + n*(n-1)},
			}
		case "fence":
			// The fence's events: the coordinator's (at most N), one per
			// waiter that watched the fence key, one per own write.
			want = map[string][2]int64{"fetches": {r.Dir.Fetches, 0}}
			if r.Etcd.EventsSent > float64(3*n) {
				t.Errorf("fence, N=%d: %.0f events; want at most 3N", r.N, r.Etcd.EventsSent)
			}
		}
		for name, gw := range want {
			if gw[0] != gw[1] {
				t.Errorf("%s, N=%d: %s = %d; want %d", r.Mode, r.N, name, gw[0], gw[1])
			}
		}
	}
	if s, ok := rep.slope("mirror", "etcd events sent"); !ok || s < 1.99 || s > 2.01 {
		t.Errorf("mirror's events slope %.3f (%v); want 2", s, ok)
	}
	if s, ok := rep.slope("ring", "etcd events sent"); !ok || s < 0.99 || s > 1.01 {
		t.Errorf("ring's events slope %.3f (%v); want 1", s, ok)
	}
	// However many ask at once, one read per peer, and one watch per peer
	// that had not published.
	if c := rep.Coalescing; c == nil {
		t.Error("no coalescing measured")
	} else if c.Asks != 8*2*64 || c.Fetches != 8 || c.Ranges != 8 || c.Watches != 1 {
		t.Errorf("coalescing: %+v; want 1024 answers, 8 fetches, 8 range requests, 1 watch", *c)
	}
	txt, err := os.ReadFile(filepath.Join(dir, "results.txt"))
	if err != nil || !strings.Contains(string(txt), "PROJECTION, not measured") || !strings.Contains(string(txt), "machine: ") {
		t.Errorf("results.txt: %v\n%s", err, txt)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-n", "2"}, {"-mode", "all,some"}, {"-timeout", "0"}, {"-concurrency", "0"}, {"extra"}} {
		var ue cmdmain.UsageError
		if _, err := parseFlags(args, io.Discard); !errors.As(err, &ue) {
			t.Errorf("%v: %v; want a usage error", args, err)
		}
	}
}

func TestFit(t *testing.T) {
	xs := []float64{8, 32, 128}
	ys := []float64{3 * 64, 3 * 1024, 3 * 16384}
	s, c, ok := etcdmetrics.Fit(xs, ys)
	if !ok || s < 1.9999 || s > 2.0001 || c < 1.0985 || c > 1.0987 {
		t.Errorf("Fit of 3N²: slope %v, intercept %v (%v); want 2, ln 3", s, c, ok)
	}
	if _, _, ok := etcdmetrics.Fit([]float64{8}, []float64{1}); ok {
		t.Error("Fit of one point succeeded")
	}
}
