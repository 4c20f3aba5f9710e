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
	t.Run("keys=uint64", func(t *testing.T) { assertHitAllocsNothing(t, benchUintKeys()) })
	t.Run("keys=string", func(t *testing.T) { assertHitAllocsNothing(t, benchStringKeys()) })
	t.Run("keys=struct", func(t *testing.T) {
		keys := make([]peerKey, 256)
		for i := range keys {
			keys[i] = peerKey{Job: 1, Rank: i, Node: benchStringKeys()[i]}
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
// for uint64 keys that Cache.Get inlines into its callers, leaving one call,
// to the table's Get, and that the table's Get calls
// nothing on a hit: hashing, probing and the state check are inlined. If a
// helper stops inlining, a CALL appears and this fails.
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
	shape := `[go.shape.uint64,go.shape.*uint8]`
	assert.Contains(t, string(report), "inlining call to epcache.(*Cache"+shape+").Get",
		"Cache.Get no longer inlines into its callers")

	out, err := exec.Command(goTool, "tool", "objdump", "-s", `shard\.\(\*Table`+regexp.QuoteMeta(shape)+`\)\.Get$`, bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "TEXT ", "the table's Get is not in the binary")
	indirect := 0
	for _, m := range regexp.MustCompile(`CALL (\S+)`).FindAllStringSubmatch(string(out), -1) {
		switch callee := m[1]; {
		case strings.HasPrefix(callee, "runtime.morestack"), callee == "runtime.panicBounds(SB)":
			// stack growth and bounds failures: never taken on a hit
		case callee == "hash/maphash.String(SB)", strings.HasSuffix(callee, ").hashOther(SB)"):
			// the hashes of other key kinds, on branches a uint64 key never takes
		case !strings.HasSuffix(callee, "(SB)"):
			indirect++ // through a register: Misser.Miss, on a miss
		default:
			t.Errorf("the table's Get calls %s", callee)
		}
	}
	assert.Equal(t, 1, indirect, "one indirect call (the miss) expected:\n%s", out)
}
