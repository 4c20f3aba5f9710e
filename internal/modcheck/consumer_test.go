package modcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A module outside this repository's tree that imports epcache, grpcpool
// and epprom as a user's module would builds and runs: it has only its own
// go.mod, which requires the released versions the modules here require of
// each other, with replace lines pointing at this checkout standing in for
// the module proxy. It dials a gRPC server of its own through the pool and
// scrapes the cache's metrics, so that the program is real.
func TestAConsumerModuleBuildsAndRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command, which may download the sub-modules' dependencies")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	version := func(gomod, mod string) string {
		for _, r := range requires(t, filepath.Join(root, gomod)) {
			if r.path == mod {
				return r.version
			}
		}
		t.Fatalf("%s does not require %s", gomod, mod)
		return ""
	}
	// The versions a user would require: those the modules here require
	// of each other (TestModulesRequireReleasedVersions holds them to the
	// releases).
	epv := version("transport/grpcpool/go.mod", repo)
	sub := func(p string) string { return version("transport/grpcpool/dskitbench/go.mod", p) }
	write("go.mod", "module example.com/consumer\n\ngo 1.26.0\n\nrequire (\n"+
		"\t"+repo+" "+epv+"\n"+
		"\t"+repo+"/transport/grpcpool "+sub(repo+"/transport/grpcpool")+"\n"+
		"\t"+repo+"/observe/prometheus "+epv+"\n"+
		")\n\n"+
		"replace "+repo+" => "+root+"\n"+
		"replace "+repo+"/transport/grpcpool => "+filepath.Join(root, "transport/grpcpool")+"\n"+
		"replace "+repo+"/observe/prometheus => "+filepath.Join(root, "observe/prometheus")+"\n")
	write("main.go", consumerMain)
	// The modules' own go.sum files vouch for everything they bring.
	var sums strings.Builder
	for _, m := range []string{".", "transport/grpcpool", "observe/prometheus"} {
		b, err := os.ReadFile(filepath.Join(root, m, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sums.Write(b)
	}
	write("go.sum", sums.String())
	run := func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// Outside any workspace of the caller's, as a user's module is;
		// the module proxy (or the module cache) serves the sub-modules'
		// dependencies, whose sums are in go.sum already.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOSUMDB=off", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mod", "tidy")
	out := run("run", ".")
	if !strings.Contains(out, "consumer: ok") {
		t.Fatalf("the consumer's program printed:\n%s", out)
	}
	t.Log(out)
}

const consumerMain = `package main

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/epcache/epcache/epcache"
	epprom "github.com/epcache/epcache/observe/prometheus"
	"github.com/epcache/epcache/transport/grpcpool"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
	fmt.Println("consumer: ok")
}

func run() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	defer srv.Stop()

	pool, err := grpcpool.New(grpcpool.Config{
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	err = pool.Do(context.Background(), ln.Addr().String(), func(ctx context.Context, cc grpc.ClientConnInterface) error {
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	})
	if err != nil {
		return err
	}

	cache, err := epcache.New(epcache.Config[string, int]{
		Create: func(context.Context, string) (int, error) { return 1, nil },
	})
	if err != nil {
		return err
	}
	defer cache.Close()
	if _, err := cache.Get(context.Background(), "peer"); err != nil {
		return err
	}
	col := epprom.New()
	if err := epprom.Add(col, "peers", cache); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(col); err != nil {
		return err
	}
	families, err := reg.Gather()
	if err != nil {
		return err
	}
	if len(families) == 0 {
		return fmt.Errorf("no metrics gathered")
	}
	fmt.Println("pool:", pool.Stats().Dials, "dials; metrics:", len(families), "families")
	return nil
}
`
