package dskitbench

import (
	"context"
	"fmt"
	"time"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errBad is the connection error the late-report scenario reports.
var errBad = status.Error(codes.Unavailable, "bench: this connection is bad")

// LateReport is scenario 3, rounds times on one server: a call holds the
// old connection; another call reports it bad; a third call gets the
// replacement and holds it; then the first call, ending, reports the old
// connection bad (late); a fourth call looks at which connection the pool
// hands out. The replacement must survive, and neither held call may fail
// because the pool closed its connection. dskit's users report a bad
// connection with RemoveClientFor(addr) (the pattern of mimir #13123) or,
// since dskit #439, RemoveClient(client, addr).
func LateReport(rounds int) (*Table, error) {
	t := newTable("3", "late report: a failure report about an old connection after its replacement exists",
		"rounds", "replacement survived", "calls on the old closed by pool", "calls on the replacement closed by pool")
	s, err := StartServer(0)
	if err != nil {
		return nil, err
	}
	defer s.Stop()
	for _, v := range []struct {
		name   string
		report Report
	}{{"epcache", ReportNothing}, {"dskit RemoveClientFor(addr)", ReportByAddr}, {"dskit RemoveClient(client, addr)", ReportByValue}} {
		o := Options{DialTimeout: 5 * time.Second, OnConnError: v.report}
		var p Pool
		if v.name == "epcache" {
			// The report is the caller's: its rule takes every
			// Unavailable for a bad connection (the default would keep a
			// Ready connection that a server answered Unavailable on).
			o.IsConnError = grpcpool.IsUnavailable
			p, err = NewEpcache(o)
		} else {
			p, err = NewDskit(o)
		}
		if err != nil {
			return nil, err
		}
		var survived, oldClosed, newClosed int
		for range rounds {
			sv, oc, nc, err := lateReportRound(p, s.Addr)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			survived += b2i(sv)
			oldClosed += b2i(oc)
			newClosed += b2i(nc)
		}
		if err := p.Close(); err != nil {
			return nil, err
		}
		t.row(v.name, map[string]float64{"rounds": float64(rounds), "survived": float64(survived), "old_closed_by_pool": float64(oldClosed), "new_closed_by_pool": float64(newClosed)},
			itoa(rounds), itoa(survived), itoa(oldClosed), itoa(newClosed))
	}
	t.note("epcache's calls report with Config.IsConnError = grpcpool.IsUnavailable, as dskit's users report every Unavailable")
	t.note("each held call, once released, makes one more Check on the connection it holds: it fails with Canceled \"the client connection is closing\" if the pool closed that connection under it")
	return t, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// heldCapture is a call that records its connection, says it started,
// waits for its gate, then makes a Check on the same connection and
// returns ret (or the Check's error if ret is nil).
type heldCapture struct {
	cc            *grpc.ClientConn
	started, gate chan struct{}
	checkErr      error
	ret           error
	done          chan error
}

func newHeldCapture(ret error) *heldCapture {
	return &heldCapture{started: make(chan struct{}), gate: make(chan struct{}), done: make(chan error, 1), ret: ret}
}

func (h *heldCapture) call(ctx context.Context, cc grpc.ClientConnInterface) error {
	h.cc, _ = cc.(*grpc.ClientConn)
	close(h.started)
	<-h.gate
	h.checkErr = Check()(ctx, cc)
	if h.ret != nil {
		return h.ret
	}
	return h.checkErr
}

func (h *heldCapture) start(p Pool, addr string) error {
	go func() { h.done <- p.Do(context.Background(), addr, h.call) }()
	select {
	case <-h.started:
		return nil
	case err := <-h.done:
		return fmt.Errorf("held call returned before holding: %v", err)
	}
}

func lateReportRound(p Pool, addr string) (survived, oldClosed, newClosed bool, err error) {
	old := newHeldCapture(errBad) // ends with the late report
	if err := old.start(p, addr); err != nil {
		return false, false, false, err
	}
	// The old connection is reported bad while the old call holds it.
	_ = p.Do(context.Background(), addr, func(context.Context, grpc.ClientConnInterface) error { return errBad })
	repl := newHeldCapture(nil)
	if err := repl.start(p, addr); err != nil {
		return false, false, false, err
	}
	close(old.gate)
	<-old.done // the late report
	var now *grpc.ClientConn
	if err := p.Do(context.Background(), addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
		now, _ = cc.(*grpc.ClientConn)
		return Check()(ctx, cc)
	}); err != nil && !ClosedByPool(err) {
		return false, false, false, err
	}
	close(repl.gate)
	<-repl.done
	// The next round starts on a fresh connection.
	_ = p.Do(context.Background(), addr, func(context.Context, grpc.ClientConnInterface) error { return errBad })
	return now == repl.cc, ClosedByPool(old.checkErr), ClosedByPool(repl.checkErr), nil
}
