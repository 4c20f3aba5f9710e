package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/etcd/internal/cmdmain"

	"github.com/epcache/epcache/etcd/etcdtest"
)

// TestMain makes the test binary a child of the mesh when the parent (a
// test below) starts it again with EPMESH_CHILD=1, as the command does with
// its own binary.
func TestMain(m *testing.M) {
	cmdmain.Copy("epmesh child", childEnv, runChild)
	code := m.Run()
	if etcdServer != nil {
		etcdServer.Close()
	}
	os.Exit(code)
}

var (
	etcdOnce   sync.Once
	etcdServer *etcdtest.Server
	etcdErr    error
)

// patience bounds every wait of a run and every step of its processes (an
// etcd request, a connection, a Send): it only detects a hang, so that no
// outcome depends on how busy the machine is.
const patience = 2 * time.Minute

// testEnv returns an env of small runs against one embedded etcd shared by
// the package's tests, each test under a prefix of its own. Only the
// process faults kills has a short lease (ttl, what the scenario tests);
// every live process's lease, and ErrorTTL, outlast the test.
func testEnv(t *testing.T, adjust func(*options)) *env {
	t.Helper()
	etcdOnce.Do(func() { etcdServer, etcdErr = etcdtest.Start("") })
	if etcdErr != nil {
		t.Fatal(etcdErr)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o := options{
		m: 5, g: 2, impls: []string{"epcache", "mutex"}, rtts: []time.Duration{0, 2 * time.Millisecond}, count: 1,
		ttl: 2 * time.Second, liveTTL: time.Hour, errorTTL: time.Hour, hammer: 700 * time.Millisecond,
		etcd: []string{etcdServer.URL()}, prefix: "/epmesh-test/" + t.Name() + "/",
		timeout: patience, sendTimeout: patience, stepTimeout: patience,
	}
	if adjust != nil {
		adjust(&o)
	}
	return &env{o: o, self: self, endpoints: o.etcd, stderr: os.Stderr}
}

// testCtx bounds a test's run: a hang the waits' own bound (patience) does
// not end fails the test with what was waited for rather than at the go
// test timeout.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	t.Cleanup(cancel)
	return ctx
}

func noViolations(t *testing.T, v []string) {
	t.Helper()
	for _, s := range v {
		t.Error(s)
	}
}

// TestMesh: four processes send to each other at once; every message
// arrives once, over one connection per pair (the sockets of the four
// processes, matched end to end), and every descriptor is given back.
func TestMesh(t *testing.T) {
	e := testEnv(t, nil)
	r, err := runMesh(testCtx(t), e, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	noViolations(t, r.Violations)
	if r.Delivered != 4*3*5 || r.Duplicates != 0 {
		t.Errorf("%d messages delivered, %d duplicates; want 60 and 0", r.Delivered, r.Duplicates)
	}
	if !r.SocketsChecked {
		t.Log("no /proc: connections per pair not counted from the sockets")
	} else if r.ConnsMin != 1 || r.ConnsMax != 1 || r.Stray != 0 {
		t.Errorf("connections per pair %d to %d, %d stray ends; want exactly 1 and none", r.ConnsMin, r.ConnsMax, r.Stray)
	}
	if r.Creates+r.Offers != 12 || r.Offers != 6 {
		t.Errorf("%d endpoints created, %d offered; want 12 together, one offer per pair (6)", r.Creates, r.Offers)
	}
	if r.FDsAfter != r.FDsBefore {
		t.Errorf("%d descriptors after close, %d before", r.FDsAfter, r.FDsBefore)
	}
	if r.Complete <= 0 {
		t.Errorf("mesh complete %v; want the time it took", r.Complete)
	}
}

// TestMeshOnDemand: the mesh with OnDemand directories, each process
// fetching every other's address once, and counting it: one fetch per
// process and peer, the same checks as the mirror's.
func TestMeshOnDemand(t *testing.T) {
	const n = 3
	e := testEnv(t, nil)
	e.dirMode = "ondemand"
	r, err := runMesh(testCtx(t), e, n)
	if err != nil {
		t.Fatal(err)
	}
	noViolations(t, r.Violations)
	var b bytes.Buffer
	if err := writeDirectory(&b, []MeshResult{r}); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	if r.DirMode != "ondemand" || r.Dir.Fetches != n*(n-1) {
		t.Errorf("mode %q, %d fetches; want ondemand and %d, one per process and peer", r.DirMode, r.Dir.Fetches, n*(n-1))
	}
	if r.EtcdErr != "" || r.Etcd.Ranges == 0 {
		t.Errorf("etcd's metrics: %+v, %s", r.Etcd, r.EtcdErr)
	}
	for _, p := range r.PerProcess {
		if p.Dir.Fetches != n-1 {
			t.Errorf("process %d fetched %d peers; want %d", p.ID, p.Dir.Fetches, n-1)
		}
	}
}

// TestFaults kills one of three processes with SIGKILL under the others'
// sends and starts it again.
func TestFaults(t *testing.T) {
	e := testEnv(t, nil)
	r, err := runFaults(testCtx(t), e, 3)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := writeFaults(&b, r); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	// Violations cover everything below; the asserts say it in the
	// test's words.
	noViolations(t, r.Violations)
	if r.Failed == 0 || r.Hung != 0 {
		t.Errorf("sends to the killed process: %d failed, %d hung; want errors, no hang", r.Failed, r.Hung)
	}
	for k, d := range r.DialAttempts {
		if d > r.DialBound[k] {
			t.Errorf("survivor %d dialed the dead process %d times; ErrorTTL allows %d", k, d, r.DialBound[k])
		}
	}
	if r.ErrorHits == 0 {
		t.Error("no send was answered by the remembered failure")
	}
	for k, d := range r.Withdrawn {
		if d < 0 {
			t.Errorf("survivor %d: lookups never said the killed process was withdrawn", k)
		}
	}
	if r.NewAddr == r.OldAddr || r.NewAddr == "" {
		t.Errorf("restarted at %q, was %q; want a new address", r.NewAddr, r.OldAddr)
	}
	if r.AfterDelivered != r.AfterExpected || r.AfterDuplicates != 0 || r.AfterErrors != 0 {
		t.Errorf("after the restart: %d of %d delivered, %d duplicates, %d send errors", r.AfterDelivered, r.AfterExpected, r.AfterDuplicates, r.AfterErrors)
	}
	if r.FDsAfter != r.FDsBefore {
		t.Errorf("%d descriptors after close, %d before", r.FDsAfter, r.FDsBefore)
	}
	t.Run("ReconnectThroughWatch", func(t *testing.T) {
		if !r.ForgetAvailable && !r.Reconnected {
			t.Skipf("transport/tcp cannot forget a remembered failure on the watch's word yet (no Peer.Forget, no watch of its own); "+
				"the survivors reached the restarted process through its hello instead: %v", r.Notes)
		}
		if !r.Reconnected || r.ReconnectedBy != "watch" {
			t.Fatalf("the survivors did not reach the restarted process before it connected to them (%s)", r.ProbeError)
		}
		if !r.ErrorTTLActive || r.ErrorTTLLeft <= 0 {
			t.Errorf("reached it only once ErrorTTL had ended (ErrorTTL %v, %v left)", r.ErrorTTL, r.ErrorTTLLeft)
		}
		for k, w := range r.Watch {
			if w < 0 {
				t.Errorf("survivor %d: the watch never told of the restarted process", k)
			}
		}
	})
}

// TestStorm runs the storm with three processes, epcache and the mutex
// comparator, with and without a modelled round trip.
func TestStorm(t *testing.T) {
	e := testEnv(t, nil)
	rs, err := runStorm(testCtx(t), e, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 {
		t.Fatalf("%d results; want 2 comparators × 2 rtts", len(rs))
	}
	for _, r := range rs {
		t.Logf("%s rtt=%v: complete %v, creates %d, dup %d, fds %d→%d", r.Impl, r.RTT, r.Complete, r.Creates, r.Duplicates, r.FDsBefore, r.FDsAfter)
		noViolations(t, r.Violations)
		if r.Creates != 6 || r.Duplicates != 0 {
			t.Errorf("%s rtt=%v: %d endpoints made, %d duplicates; want 6 and 0", r.Impl, r.RTT, r.Creates, r.Duplicates)
		}
		if r.RTT > 0 && r.Complete < r.RTT {
			t.Errorf("%s rtt=%v: complete in %v, less than one modelled round trip", r.Impl, r.RTT, r.Complete)
		}
	}
}

// TestRun runs the command as a user would: with the embedded etcd it
// starts itself and tables, then against an etcd already running (-etcd)
// with -json. No process is killed: every lease outlasts the test, and
// every bound is patience.
func TestRun(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"-n", "2", "-m", "2", "-g", "2", "-scenario", "mesh,storm", "-impl", "epcache", "-rtt", "1ms", "-count", "1",
		"-ttl", "1h", "-timeout", patience.String(), "-send-timeout", patience.String(), "-step-timeout", patience.String()}
	file := t.TempDir() + "/report.json"
	if err := run(testCtx(t), append(args, "-out", file), &out, &errb); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"embedded etcd at http://127.0.0.1:", "\nmesh: ", "\nstorm: ", " ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "FAIL") {
		t.Error("a run failed")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var written Report
	if err := json.Unmarshal(b, &written); err != nil || len(written.Mesh) != 1 || len(written.Storm) != 1 {
		t.Errorf("-out: %v\n%s", err, b)
	}

	// An existing etcd, as across hosts.
	url := testEnv(t, nil).endpoints[0]
	out.Reset()
	if err := run(testCtx(t), append(args, "-scenario", "mesh", "-json", "-etcd", url), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("-json: %v\n%s", err, out.String())
	}
	if rep.Embedded || len(rep.Etcd) != 1 || rep.Etcd[0] != url || len(rep.Mesh) != 1 || rep.Mesh[0].Delivered != 2*1*2 ||
		len(rep.Mesh[0].PerProcess) != 2 || len(rep.Storm) != 0 {
		t.Errorf("-json: %+v", rep)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-n", "1"},
		{"-n", "x"},
		{"-m", "0"},
		{"-g", "0"},
		{"-scenario", "chaos"},
		{"-impl", "nope"},
		{"-rtt", "-1ms"},
		{"-count", "0"},
		{"-ttl", "500ms"},
		{"-error-ttl", "0"},
		{"-step-timeout", "-1s"},
		{"-prefix", "/no-slash"},
		{"-dir", "everything"},
		{"extra"},
	} {
		_, err := parseFlags(args, io.Discard)
		var ue cmdmain.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: %v; want a usage error", args, err)
		}
	}
	o, err := parseFlags([]string{"-n", "8,32", "-rtt", "0,5ms", "-etcd", "http://a:2379, http://b:2379"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(o.ns, o.rtts, o.etcd) != "[8 32] [0s 5ms] [http://a:2379 http://b:2379]" {
		t.Errorf("parsed %v %v %v", o.ns, o.rtts, o.etcd)
	}
}

func TestParseProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"00000000000000000000000001000000:0050": "[::1]:80",
		"0000000000000000FFFF00000100007F:01BB": "127.0.0.1:443",
	} {
		got, err := parseProcAddr(in)
		if err != nil || got != want {
			t.Errorf("parseProcAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0100007F", "0100007F:XYZ", "01007F:0050"} {
		if _, err := parseProcAddr(in); err == nil {
			t.Errorf("parseProcAddr(%q): no error", in)
		}
	}
}

// countPairs matches ends across processes: a pair with two connections,
// a pair with none and a half-closed end all show.
func TestCountPairs(t *testing.T) {
	const l0, l1, l2 = "127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1002"
	socks := map[int][]socket{
		0: {{"127.0.0.1:5000", l1}, {"127.0.0.1:5001", l1}, {"127.0.0.1:5002", "127.0.0.1:2379"}},
		1: {{l1, "127.0.0.1:5000"}, {l1, "127.0.0.1:5001"}, {"127.0.0.1:6000", l2}},
		2: {{l2, "127.0.0.1:6000"}, {l2, "127.0.0.1:7000"}},
	}
	pc := countPairs([]int{0, 1, 2}, socks, []string{l0, l1, l2})
	if pc.Min != 0 || pc.Max != 2 || pc.Stray != 1 || len(pc.Bad) != 2 {
		t.Errorf("%+v; want pairs 0-1: 2, 0-2: 0, 1-2: 1, one stray end (the etcd connection is none)", pc)
	}
}
