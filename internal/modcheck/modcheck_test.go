// Package modcheck holds a test of the module graph: a program that
// imports the library's packages (epcache, shard, transport/tcp,
// transport/directory, observe/debugpage) must get none of the modules that only the harness,
// its charts and report, the tests of other modules or the optional modules
// (etcd, gRPC, metrics) need.
package modcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// forbidden are module path prefixes that must not appear in the module
// graph of a program importing only the library.
var forbidden = []string{
	"github.com/chromedp/", "gonum.org/", "github.com/maypok86/otter", "github.com/puzpuzpuz/xsync",
	"github.com/hashicorp/golang-lru", "github.com/HdrHistogram/", "github.com/schollz/progressbar",
	"github.com/anishathalye/porcupine", "go.etcd.io/", "google.golang.org/grpc", "github.com/grafana/",
	"github.com/prometheus/", "go.opentelemetry.io/",
}

func TestImportingTheLibraryBringsNoHarnessModule(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
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
	write("go.mod", "module example.com/user\n\ngo 1.26.0\n\nrequire github.com/epcache/epcache v0.1.0\n\nreplace github.com/epcache/epcache => "+root+"\n")
	write("main.go", `package main

import (
	"context"

	"github.com/epcache/epcache/epcache"
	_ "github.com/epcache/epcache/observe/debugpage"
	"github.com/epcache/epcache/shard"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
)

var (
	_ *shard.Table[int, int]
	_ directory.Interface
	_ *tcp.Peer
)

func main() {
	c, _ := epcache.New(epcache.Config[int, int]{Create: func(context.Context, int) (int, error) { return 1, nil }})
	defer c.Close()
}
`)
	// epcache's own go.sum vouches for every module it can bring.
	sums, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sums))
	run := func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// The module cache already holds everything epcache needs: no
		// network, and no workspace of the caller's.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mod", "tidy")
	run("build", "-o", os.DevNull, ".") // the program is real
	mods := run("list", "-m", "all")
	for _, bad := range forbidden {
		if strings.Contains(mods, bad) {
			t.Errorf("a program importing only the library has %s in go list -m all:\n%s", bad, mods)
		}
	}
	// The whole graph, as the README states it: the library, and the
	// modules its own tests use, which Go lists but builds nothing of
	// into the program.
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(mods), "\n") {
		if p := strings.Fields(line)[0]; p != "example.com/user" {
			got = append(got, p)
		}
	}
	if strings.Join(got, " ") != strings.Join(libraryGraph, " ") {
		t.Errorf("go list -m all of a program importing only the library lists %v; the README states %v", got, libraryGraph)
	}
	t.Logf("go list -m all of a program importing only the library:\n%s", mods)
}

// libraryGraph is the module graph of a program that imports only the
// library, in go list's order, as the README's "Install" states it.
var libraryGraph = []string{
	"github.com/cespare/xxhash/v2", // the flood tests' unkeyed hash
	"github.com/epcache/epcache",
	"github.com/stretchr/testify", // tests
	"go.uber.org/goleak",          // tests
	"go.yaml.in/yaml/v3",          // testify's
}
