package grpcpool_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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

// slotDisagreement reports whether the pool waits for a slot under
// MaxConns that the cache underneath does not know is taken: the pool's
// count of slot waits runs ahead of the cache's waits for room.
func slotDisagreement(st grpcpool.Stats) bool { return st.SlotWaits > st.Cache.RoomWaits }

// TestUnderMaxConnsACallEvictsAnIdleConnectionRatherThanWaitForADrainingOne:
// a draining connection holds its slot, and the cache knows it: a call
// that needs a slot evicts a connection no call uses, at once, rather
// than wait for the drain.
func TestUnderMaxConnsACallEvictsAnIdleConnectionRatherThanWaitForADrainingOne(t *testing.T) {
	a, b, c := startServer(t), startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxConns: 2, DrainDelay: patience})
	if err := p.Warm(context.Background(), a.addr, b.addr); err != nil {
		t.Fatal(err)
	}
	p.SetMembers([]string{b.addr, c.addr})
	waitFor(t, "a drains", func() bool { return p.Stats().Draining == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Do(ctx, c.addr, check) }()
	var err error
	waitFor(t, "the call returns, or waits for a slot the cache does not count", func() bool {
		select {
		case err = <-done:
			return true
		default:
			return slotDisagreement(p.Stats())
		}
	})
	if st := p.Stats(); slotDisagreement(st) {
		cancel()
		<-done
		t.Fatalf("the call to c waits for the draining connection's slot (SlotWaits=%d, the cache's RoomWaits=%d, Room=%d of 2) while b's connection is idle; want b evicted", st.SlotWaits, st.Cache.RoomWaits, st.Cache.Room)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.DropsEvicted != 1 || st.Draining != 1 || st.Open != 2 || st.PeakOpen != 2 {
		t.Errorf("after the call to c: %d evicted, %d draining, %d open, peak %d; want 1, 1, 2, 2", st.DropsEvicted, st.Draining, st.Open, st.PeakOpen)
	}
}

// TestAWaitForASlotIsNotADialFailure: a call that waits for a slot under
// MaxConns and leaves on its context gets an error that says so, naming
// the pool and the address and wrapping ctx.Err(); the wait was no dial,
// so nothing is remembered (ErrorTTL): the next call waits for a slot
// again.
func TestAWaitForASlotIsNotADialFailure(t *testing.T) {
	a, b := startServer(t), startServer(t)
	p := newPool(t, grpcpool.Config{MaxConns: 1, DrainDelay: patience, ErrorTTL: patience})
	if err := p.Warm(context.Background(), a.addr); err != nil {
		t.Fatal(err)
	}
	p.SetMembers([]string{b.addr}) // a drains, holding the one slot
	for i := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Do(ctx, b.addr, check) }()
		var err error
		waitFor(t, "the call waits for a slot, or returns", func() bool {
			select {
			case err = <-done:
				return true
			default:
				return p.Stats().SlotWaits == uint64(i+1)
			}
		})
		if err == nil {
			cancel()
			err = <-done
		}
		cancel()
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if !errors.Is(err, context.Canceled) || !strings.HasPrefix(msg, "grpcpool: ") || !strings.Contains(msg, strconv.Quote(b.addr)) ||
			!strings.Contains(msg, "slot under MaxConns") || strings.Contains(msg, "DialTimeout") {
			t.Fatalf("call %d, left while it waited for a slot: %v; want a grpcpool error naming %q that says it waited for a slot under MaxConns, wrapping context.Canceled", i+1, err, b.addr)
		}
		if st := p.Stats(); st.ErrorHits != 0 || st.DialErrors != 0 || st.Cache.CreateErrors != 0 || st.Dials != 1 {
			t.Fatalf("after call %d waited for a slot: ErrorHits=%d DialErrors=%d, the cache's CreateErrors=%d, Dials=%d; want 0, 0, 0, 1 (a's)", i+1, st.ErrorHits, st.DialErrors, st.Cache.CreateErrors, st.Dials)
		}
	}
}
