package epcache_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/epcache/epcache/internal/fixture"

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
	t.Run("keys=uint64", func(t *testing.T) { assertHitAllocsNothing(t, fixture.UintKeys(1024)) })
	t.Run("keys=string", func(t *testing.T) { assertHitAllocsNothing(t, fixture.StringKeys(1024)) })
	t.Run("keys=struct", func(t *testing.T) {
		keys := make([]peerKey, 256)
		for i := range keys {
			keys[i] = peerKey{Job: 1, Rank: i, Node: fixture.StringKeys(1024)[i]}
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

// TestHitPathMakesNoCalls is the inlining test. It builds testdata/hitpath,
// a program that imports epcache and nothing else of this module, as a
// user's program does, with the compiler's inlining report, and
// disassembles it. (Not this package's test binary: that imports shard
// directly, and the compiler inlines shard's non-generic functions into
// generic code only where shard is imported directly, so a helper that
// stopped inlining in users' programs still inlined there, and did for a
// long time: see tagOf.) For uint64 and string keys it checks that
// Cache.Get and Cache.Load inline into their callers, leaving one call, to
// the table's Get; that the table's Get calls nothing on a hit: hashing (a
// leaf call for strings outside 8 to 32 bytes), probing and the state check
// are inlined; and that a lease's hit calls nothing but the table's Lease,
// its hash and its probe, and its Release nothing. If a helper stops
// inlining, a CALL appears and this fails.
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
	bin := filepath.Join(t.TempDir(), "hitpath")
	report, err := exec.Command(goTool, "build", "-gcflags=-m", "-o", bin, "./testdata/hitpath").CombinedOutput()
	require.NoError(t, err, "go build: %s", report)
	out, err := exec.Command(bin).CombinedOutput()
	require.NoError(t, err, "testdata/hitpath: %s", out)
	calls := func(t *testing.T, symbol string) []string {
		out, err := exec.Command(goTool, "tool", "objdump", "-s", symbol, bin).CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "TEXT ", "%s is not in the binary", symbol)
		var callees []string
		for _, m := range regexp.MustCompile(`CALL (\S+)`).FindAllStringSubmatch(string(out), -1) {
			if !strings.HasPrefix(m[1], "runtime.morestack") { // stack growth, never on a hit
				callees = append(callees, strings.TrimPrefix(m[1], "github.com/epcache/epcache/"))
			}
		}
		return callees
	}
	// stores returns the instructions of symbol that write memory other
	// than its own stack frame (amd64 only: the operand syntax is
	// amd64's), and how many instructions it read.
	stores := func(t *testing.T, symbol string) (writes []string, n int) {
		out, err := exec.Command(goTool, "tool", "objdump", "-s", symbol, bin).CombinedOutput()
		require.NoError(t, err, "%s", out)
		memDest := regexp.MustCompile(`, [-\w]*\((\w+)\)(\(\w+\*\d\))?$`) // a last operand in memory: off(BASE) or off(BASE)(INDEX*s)
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.FieldsFunc(line, func(r rune) bool { return r == '\t' })
			if len(f) < 4 {
				continue
			}
			ins := strings.TrimSpace(f[3])
			n++
			op, _, _ := strings.Cut(ins, " ")
			switch {
			case strings.HasPrefix(op, "LOCK"), strings.HasPrefix(op, "XCHG"), strings.HasPrefix(op, "CMPXCHG"), strings.HasPrefix(op, "XADD"):
				writes = append(writes, ins)
			case strings.HasPrefix(op, "CMP"), strings.HasPrefix(op, "TEST"), strings.HasPrefix(op, "BT"), strings.HasPrefix(op, "PREFETCH"):
				// reads only, whatever the operand order
			default:
				if m := memDest.FindStringSubmatch(ins); m != nil && m[1] != "SP" {
					writes = append(writes, ins)
				}
			}
		}
		return writes, n
	}
	for _, shape := range []string{`[go.shape.uint64,go.shape.*uint8]`, `[go.shape.string,go.shape.*uint8]`} {
		t.Run(shape, func(t *testing.T) {
			str := strings.Contains(shape, "string")
			// A hit writes no shared memory (issue 12: not even a
			// reference bit on a young value, which IdleTimeout and
			// MaxEntries would otherwise want): the table's Get, Load's
			// too, stores nothing but to its own stack frame and takes no
			// locked instruction. An aged value's hit leaves through
			// missed, which is where it is made young.
			if runtime.GOARCH == "amd64" {
				writes, n := stores(t, `shard\.\(\*Table`+regexp.QuoteMeta(shape)+`\)\.Get$`)
				require.Greater(t, n, 40, "the table's Get disassembled to %d instructions", n)
				assert.Empty(t, writes, "the table's Get writes memory")
			}
			for _, m := range []string{"Get", "Load", "Acquire"} {
				assert.Contains(t, string(report), "inlining call to epcache.(*Cache"+shape+")."+m,
					"Cache.%s no longer inlines into its callers", m)
			}
			assert.Contains(t, string(report), "inlining call to epcache.Lease"+shape+".Release",
				"Lease.Release no longer inlines into its callers")
			table := "shard.(*Table" + shape + ")."
			for _, callee := range calls(t, `shard\.\(\*Table`+regexp.QuoteMeta(shape)+`\)\.Get$`) {
				switch {
				case callee == table+"missed(SB)", callee == table+"getOther(SB)":
					// the miss, and the keys hashed by Config.Hash: never on this hit
				case str && callee == "shard.hashString(SB)":
					// a leaf, checked below
				case str && callee == "runtime.memequal(SB)":
					// two equal strings at different addresses, compared byte by byte
				default:
					t.Errorf("the table's Get calls %s", callee)
				}
			}
			// A lease: Acquire calls the table's Acquire, which probes as
			// Get does, inline, and hashes (a call for all but integer
			// keys, which calls nothing more on a hit), and the lease's
			// Release inlines, calling only its own slow path.
			for _, callee := range calls(t, `shard\.\(\*Table`+regexp.QuoteMeta(shape)+`\)\.Acquire$`) {
				switch {
				case callee == table+"Hash(SB)":
				case str && callee == "runtime.memequal(SB)": // as in Get
				case callee == table+"leaseMissed(SB)": // no value to lease, or a removal raced the lease
				case callee == "shard.(*Slot"+shape+").Lease(SB)": // not the first ticket, or no lease table yet
				case callee == "runtime.procPin(SB)", callee == "runtime.procUnpin(SB)": // a value with lines: the caller's P picks its line
				case callee == "shard.(*leaseTable).contend(SB)": // another goroutine leased the value last: counted towards lines
				case callee == "shard.getg.abi0(SB)": // the goroutine's identity, for the ticket's hint: a leaf of three instructions (shard/goid_amd64.s)
				default:
					t.Errorf("the table's Acquire calls %s", callee)
				}
			}
			for _, fn := range []string{"locate", "Hash"} {
				for _, callee := range calls(t, `shard\.\(\*Table`+regexp.QuoteMeta(shape)+`\)\.`+fn+`$`) {
					switch {
					case fn == "Hash" && callee == table+"hashOther(SB)": // Config.Hash and composite keys
					case str && (callee == "shard.hashString(SB)" || callee == "runtime.memequal(SB)"):
					default:
						t.Errorf("the table's %s calls %s", fn, callee)
					}
				}
			}
			// Acquire and Release inline into the user's code, leaving
			// the calls to the table's Acquire and to Release's slow path:
			// the user's function calls nothing else of epcache's.
			use := `main\.use\[go\.shape\.uint64\]$` // use is generic in K only
			if str {
				use = `main\.use\[go\.shape\.string\]$`
			}
			for _, callee := range calls(t, use) {
				switch callee {
				case table + "Get(SB)", table + "Acquire(SB)":
				case "epcache.Lease" + shape + ".release(SB)": // a ticket not ended by TryEnd: watched, gone, overflowed, or misuse
				case "fmt.Fprintln(SB)", "os.Exit(SB)": // the program's own
				default:
					t.Errorf("a user of Get, Load, Acquire and Release calls %s", callee)
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
