package grpcpool_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
)

// evictionPolicy is the description of eviction under MaxConns that the
// repository uses wherever it describes the policy.
const evictionPolicy = "choosing among those the one asked for least often (a CLOCK weighed by a frequency sketch)"

// TestTheDocsDescribeTheEvictionPolicyTruthfully: what the package says
// of eviction under MaxConns is what epcache does (the behaviour is
// TestMaxConnsEvictsTheAddressAskedForLeast's): no "least recently used"
// anywhere, and MaxConns's doc in the repository's words, with a link to
// the policy's own doc.
func TestTheDocsDescribeTheEvictionPolicyTruthfully(t *testing.T) {
	lru := regexp.MustCompile(`(?i)recently[\s/]+used|\bLRU\b`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var maxConnsDoc string
	for _, name := range append(files, "README.md") {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		var text []string
		if strings.HasSuffix(name, ".md") {
			b, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			text = append(text, string(b))
		} else {
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			for _, cg := range f.Comments {
				text = append(text, cg.Text())
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if fld, ok := n.(*ast.Field); ok && len(fld.Names) == 1 && fld.Names[0].Name == "MaxConns" && fld.Doc != nil {
					maxConnsDoc = fld.Doc.Text()
				}
				return true
			})
		}
		for _, s := range text {
			if m := lru.FindString(s); m != "" {
				t.Errorf("%s describes eviction as %q: %q", name, m, firstLineWith(s, m))
			}
		}
	}
	flat := strings.Join(strings.Fields(maxConnsDoc), " ")
	for _, want := range []string{evictionPolicy, "an address called often outlives one called once, even if that one was called more recently", "[epcache.Config.MaxEntries]"} {
		if !strings.Contains(flat, want) {
			t.Errorf("Config.MaxConns's doc does not say %q:\n%s", want, maxConnsDoc)
		}
	}
}

func firstLineWith(s, sub string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return sub
}

// TestMaxConnsEvictsTheAddressAskedForLeast: under MaxConns 2, a (asked
// for four times) and b (once, last) hold the room; c's first call evicts
// b, not a, though b was used more recently.
func TestMaxConnsEvictsTheAddressAskedForLeast(t *testing.T) {
	a, b, c := startServer(t), startServer(t), startServer(t)
	var d countingDial
	p := newPool(t, grpcpool.Config{MaxConns: 2, Dial: d.dial, IsConnError: grpcpool.IsUnavailable})
	bad := func(context.Context, grpc.ClientConnInterface) error { return errBad }
	// Each of a's connections but the last is dropped by a connection
	// error, so that each of its calls is asked for anew.
	for range 3 {
		if err := p.Do(context.Background(), a.addr, check); err != nil {
			t.Fatal(err)
		}
		_ = p.Do(context.Background(), a.addr, bad)
	}
	for _, addr := range []string{a.addr, b.addr, c.addr} {
		if err := p.Do(context.Background(), addr, check); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Do(context.Background(), a.addr, check); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.DropsEvicted != 1 || d.of(a.addr) != 4 || b.accepted.Load() != 1 {
		t.Fatalf("%d evicted, %d dials of a, %d connections to b; want 1, 4, 1", st.DropsEvicted, d.of(a.addr), b.accepted.Load())
	}
	if err := p.Do(context.Background(), b.addr, check); err != nil {
		t.Fatal(err)
	}
	if n := d.of(b.addr); n != 2 {
		t.Errorf("b dialed %d times; want 2: it was evicted, not a, which was asked for more often", n)
	}
}

// TestConcurrentFirstCallsEvictNoMoreThanNeeded: six first calls at once
// to six addresses under MaxConns 2 need four evictions, and leave two
// connections, not one. Ten rounds, each on a pool of its own.
func TestConcurrentFirstCallsEvictNoMoreThanNeeded(t *testing.T) {
	const servers, maxConns, rounds = 6, 2, 10
	var addrs []string
	for range servers {
		addrs = append(addrs, startServer(t).addr)
	}
	bad := 0
	for round := range rounds {
		p := newPool(t, grpcpool.Config{MaxConns: maxConns})
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, addr := range addrs {
			wg.Go(func() {
				<-start
				if err := p.Do(context.Background(), addr, check); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		// The evicted connections' Releases run on goroutines of their
		// own: no eviction begins once every call has returned.
		waitFor(t, "the evicted connections close", func() bool { st := p.Stats(); return st.Open == st.Ready })
		if st := p.Stats(); st.DropsEvicted != servers-maxConns || st.Open != maxConns || st.Ready != maxConns {
			bad++
			t.Errorf("round %d: %d evictions, %d open, %d ready; want %d, %d, %d", round, st.DropsEvicted, st.Open, st.Ready, servers-maxConns, maxConns, maxConns)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if bad > 0 {
		t.Logf("%d of %d rounds evicted too many", bad, rounds)
	}
}
