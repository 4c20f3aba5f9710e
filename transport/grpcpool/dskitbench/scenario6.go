package dskitbench

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Overhead benchmarks: the same unary call (a health Check) on a held
// connection, through grpcpool's Do and through dskit's GetClientFor, and
// the pools' own cost alone (a call that does nothing). Each runs under
// b.RunParallel, so that GOMAXPROCS goroutines call at once.

var req = &healthpb.HealthCheckRequest{}

// BenchDirect is a unary call on a held *grpc.ClientConn.
func BenchDirect(b *testing.B, addr string) {
	cc, err := grpc.NewClient(addr, dialOptions(nil)...)
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx := context.Background()
	if _, err := hc.Check(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := hc.Check(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// unary is the call the pools run: one Check.
func unary(ctx context.Context, cc grpc.ClientConnInterface) error {
	_, err := healthpb.NewHealthClient(cc).Check(ctx, req)
	return err
}

func noop(context.Context, grpc.ClientConnInterface) error { return nil }

// BenchEpcache runs call through grpcpool's Do on a ready connection.
func BenchEpcache(b *testing.B, addr string, call Call) {
	p, err := NewEpcache(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := p.Pool.Do(ctx, addr, unary); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := p.Pool.Do(ctx, addr, call); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchDskit gets addr's client from dskit's pool and, with unary, makes
// one Check on it.
func BenchDskit(b *testing.B, addr string, withCall bool) {
	p, err := NewDskit(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	c, err := p.GetClientFor(addr)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Check(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c, err := p.GetClientFor(addr)
			if err != nil {
				b.Error(err)
				return
			}
			if withCall {
				if _, err := c.Check(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		}
	})
}

// BenchCase is one overhead benchmark.
type BenchCase struct {
	Name string
	Run  func(b *testing.B, addr string)
}

// BenchCases are the overhead benchmarks, named as go test names them.
var BenchCases = []BenchCase{
	{"call=unary/impl=direct", BenchDirect},
	{"call=unary/impl=epcache", func(b *testing.B, addr string) { BenchEpcache(b, addr, unary) }},
	{"call=unary/impl=dskit", func(b *testing.B, addr string) { BenchDskit(b, addr, true) }},
	{"call=none/impl=epcache", func(b *testing.B, addr string) { BenchEpcache(b, addr, noop) }},
	{"call=none/impl=dskit", func(b *testing.B, addr string) { BenchDskit(b, addr, false) }},
}

// Overhead is scenario 6: every BenchCase under GOMAXPROCS 1 and 2 with
// testing.Benchmark (benchtime as set by -test.benchtime), best of count
// runs (the least disturbed by the machine's other work).
func Overhead(count int) (*Table, error) {
	t := newTable("6", "overhead: a unary Check through the pool vs on a held ClientConn (loopback server in process)",
		"GOMAXPROCS", "call", "ns/op", "allocs/op", "B/op", "pool's own cost ÷ direct unary")
	s, err := StartServer(0)
	if err != nil {
		return nil, err
	}
	defer s.Stop()
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	for _, procs := range []int{1, 2} {
		runtime.GOMAXPROCS(procs)
		res := map[string]testing.BenchmarkResult{}
		for _, bc := range BenchCases {
			var best testing.BenchmarkResult
			for range count {
				r := testing.Benchmark(func(b *testing.B) { bc.Run(b, s.Addr) })
				if r.N == 0 {
					return nil, fmt.Errorf("benchmark %s failed", bc.Name)
				}
				if best.N == 0 || r.NsPerOp() < best.NsPerOp() {
					best = r
				}
			}
			res[bc.Name] = best
		}
		direct := float64(res["call=unary/impl=direct"].T) / float64(res["call=unary/impl=direct"].N)
		for _, bc := range BenchCases {
			r := res[bc.Name]
			ns := float64(r.T) / float64(r.N)
			callName, impl, _ := strings.Cut(strings.TrimPrefix(bc.Name, "call="), "/impl=")
			call := "unary"
			if callName == "none" {
				call = "none (the pool alone)"
			}
			share := ""
			fig := map[string]float64{"ns_per_op": ns, "allocs_per_op": float64(r.AllocsPerOp()), "bytes_per_op": float64(r.AllocedBytesPerOp()), "gomaxprocs": float64(procs)}
			if call != "unary" {
				share = fmt.Sprintf("%.3f%%", 100*ns/direct)
				fig["share_of_direct_unary"] = ns / direct
			}
			name := fmt.Sprintf("%s (cpu %d, %s)", impl, procs, call)
			t.Rows = append(t.Rows, []string{impl, itoa(procs), call, fmt.Sprintf("%.1f", ns), itoa(r.AllocsPerOp()), itoa(r.AllocedBytesPerOp()), share})
			t.Data[name] = fig
		}
	}
	t.note("best of %d runs of testing.Benchmark each; the pool's own cost is a call that does nothing, through the pool, against a unary Check on a held connection", count)
	return t, nil
}
