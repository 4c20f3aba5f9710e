package epcache_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type peerKey struct {
	Job  uint32
	Rank int
	Node string
}

func newHitCache[K comparable](t *testing.T, keys []K) *epcache.Cache[K, *endpoint] {
	c, err := epcache.New(epcache.Config[K, *endpoint]{
		Create: func(context.Context, K) (*endpoint, error) { return &endpoint{}, nil },
	})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	for _, k := range keys {
		_, err := c.Get(context.Background(), k)
		require.NoError(t, err)
	}
	return c
}

func assertHitAllocsNothing[K comparable](t *testing.T, keys []K) {
	c := newHitCache(t, keys)
	ctx := context.Background()
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		k := keys[i%len(keys)]
		i++
		if _, err := c.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
		if _, ok := c.Load(k); !ok {
			t.Fatal("Load missed")
		}
	})
	assert.Zero(t, allocs, "allocations per Get+Load hit")
}

func TestHitPathAllocatesNothing(t *testing.T) {
	t.Run("keys=uint64", func(t *testing.T) { assertHitAllocsNothing(t, benchUintKeys(1024)) })
	t.Run("keys=string", func(t *testing.T) { assertHitAllocsNothing(t, benchStringKeys(1024)) })
	t.Run("keys=struct", func(t *testing.T) {
		keys := make([]peerKey, 256)
		for i := range keys {
			keys[i] = peerKey{Job: 1, Rank: i, Node: benchStringKeys(1024)[i]}
		}
		assertHitAllocsNothing(t, keys)
	})
	t.Run("keys=pointer", func(t *testing.T) {
		keys := make([]*endpoint, 256)
		for i := range keys {
			keys[i] = &endpoint{peer: i}
		}
		assertHitAllocsNothing(t, keys)
	})
}

// TestHitPathMakesNoCalls is the inlining test. It builds this package's test
// binary with the compiler's inlining report and disassembles it, and checks
// for uint64 and string keys that Cache.Get and Cache.Load inline into their
// callers, leaving one call, to the table's Get, and that the table's Get
// calls nothing on a hit: hashing (a leaf call for strings), probing and the
// state check are inlined. If a helper stops inlining, a CALL appears and
// this fails.
func TestHitPathMakesNoCalls(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skip("atomics and 64-bit arithmetic are intrinsics only on 64-bit targets")
	}
	if raceEnabled {
		t.Skip("the race detector instruments every memory access with calls")
	}
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation changes the code")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build and disassemble with")
	}
	// go test strips its binaries of symbols; build one that keeps them.
	bin := filepath.Join(t.TempDir(), "epcache.test")
	report, err := exec.Command(goTool, "test", "-c", "-gcflags=-m", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go test -c: %s", report)
	calls := func(t *testing.T, symbol string) []string {
		out, err := exec.Command(goTool, "tool", "objdump", "-s", symbol, bin).CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "TEXT ", "%s is not in the binary", symbol)
		var callees []string
		for _, m := range regexp.MustCompile(`CALL (\S+)`).FindAllStringSubmatch(string(out), -1) {
			if !strings.HasPrefix(m[1], "runtime.morestack") { // stack growth, never on a hit
				callees = append(callees, m[1])
			}
		}
		return callees
	}
	for _, shape := range []string{`[go.shape.uint64,go.shape.*uint8]`, `[go.shape.string,go.shape.*uint8]`} {
		t.Run(shape, func(t *testing.T) {
			for _, m := range []string{"Get", "Load"} {
				assert.Contains(t, string(report), "inlining call to epcache.(*Cache"+shape+")."+m,
					"Cache.%s no longer inlines into its callers", m)
			}
			for _, callee := range calls(t, `shard\.\(\*Table`+regexp.QuoteMeta(shape)+`\)\.Get$`) {
				switch {
				case strings.HasSuffix(callee, ").missed(SB)"), strings.HasSuffix(callee, ").getOther(SB)"):
					// the miss, and the keys hashed by Config.Hash: never on this hit
				case strings.Contains(shape, "string") && callee == "github.com/epcache/epcache/shard.hashString(SB)":
					// a leaf, checked below
				case strings.Contains(shape, "string") && callee == "runtime.memequal(SB)":
					// two equal strings at different addresses, compared byte by byte
				default:
					t.Errorf("the table's Get calls %s", callee)
				}
			}
		})
	}
	for _, callee := range calls(t, `shard\.hashString$`) {
		if callee != "hash/maphash.String(SB)" { // strings over 64 bytes only
			t.Errorf("hashString calls %s", callee)
		}
	}
}
