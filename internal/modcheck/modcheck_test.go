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
	write("go.mod", "module example.com/user\n\ngo 1.26.0\n\nrequire github.com/epcache/epcache v0.0.0\n\nreplace github.com/epcache/epcache => "+root+"\n")
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
	t.Logf("go list -m all of a program importing only the library:\n%s", mods)
}
