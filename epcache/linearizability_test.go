package epcache_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/epcache/epcache/epcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The linearizability campaign records concurrent histories of Get, Load,
// Invalidate and CompareAndInvalidate and checks each with porcupine against
// linModel, a sequential specification of one key (histories are
// partitioned by key: keys are independent).
//
// Values are the ledger's conns: each creation makes a fresh one, numbered
// by its gen. The model does not predict which number a creation gets, since
// that depends on how creations of different keys interleave; it accepts any
// number the key has never held before, which is exactly what "a new value"
// means to a caller.

type linKind uint8

const (
	linGet linKind = iota
	linLoad
	linInvalidate
	linCompareAndInvalidate
	linAcquire // Get plus a lease: the same specification; the lease ends later
	linOffer
)

var linNames = [...]string{"Get", "Load", "Invalidate", "CompareAndInvalidate", "Acquire", "Offer"}

// linInput is an operation as called.
type linInput struct {
	kind linKind
	key  int
	old  int64 // CompareAndInvalidate: the gen of the value passed as old (0: a value never created); Offer: the gen of the value offered
}

// linOutput is what the operation returned. v is a value's gen, 0 for none.
type linOutput struct {
	v   int64
	ok  bool   // Load found a value; Invalidate and CompareAndInvalidate reported true
	err string // Get's error: none is expected, so any fails the history
}

// linState is one key's state: the value it holds (0: none) and the values it
// ever held, as a bit set in a string, so that states compare with ==.
type linState struct {
	held int64
	seen string
}

func (s linState) has(v int64) bool {
	i := int(v / 8)
	return i < len(s.seen) && s.seen[i]&(1<<(v%8)) != 0
}

func (s linState) holding(v int64) linState {
	b := []byte(s.seen)
	for int(v/8) >= len(b) {
		b = append(b, 0)
	}
	b[v/8] |= 1 << (v % 8)
	return linState{held: v, seen: string(b)}
}

// linStep is the sequential specification of one key.
func linStep(state, input, output any) (bool, any) {
	s, in, out := state.(linState), input.(linInput), output.(linOutput)
	if out.err != "" {
		return false, s
	}
	switch in.kind {
	case linGet, linAcquire:
		if s.held != 0 {
			return out.v == s.held, s // a hit: the held value
		}
		// A miss creates: any value the key never held before (or one that
		// an Offer made, answering the creation).
		return out.v > 0 && !s.has(out.v), s.holding(out.v)
	case linOffer:
		if s.held != 0 {
			return !out.ok, s
		}
		return out.ok && !s.has(in.old), s.holding(in.old)
	case linLoad:
		if s.held != 0 {
			return out.ok && out.v == s.held, s
		}
		return !out.ok, s // Load never creates
	case linInvalidate:
		if s.held != 0 {
			return out.ok, linState{seen: s.seen}
		}
		return !out.ok, s
	case linCompareAndInvalidate:
		if s.held != 0 && s.held == in.old {
			return out.ok, linState{seen: s.seen}
		}
		return !out.ok, s
	}
	panic(fmt.Sprintf("unknown operation %d", in.kind))
}

func describeLinOp(input, output any) string {
	in, out := input.(linInput), output.(linOutput)
	if out.err != "" {
		return fmt.Sprintf("%s(%d) -> error %q", linNames[in.kind], in.key, out.err)
	}
	switch in.kind {
	case linGet:
		return fmt.Sprintf("Get(%d) -> #%d", in.key, out.v)
	case linLoad:
		if !out.ok {
			return fmt.Sprintf("Load(%d) -> none", in.key)
		}
		return fmt.Sprintf("Load(%d) -> #%d", in.key, out.v)
	case linInvalidate:
		return fmt.Sprintf("Invalidate(%d) -> %t", in.key, out.ok)
	case linAcquire:
		return fmt.Sprintf("Acquire(%d) -> #%d", in.key, out.v)
	case linOffer:
		return fmt.Sprintf("Offer(%d, #%d) -> %t", in.key, in.old, out.ok)
	default:
		return fmt.Sprintf("CompareAndInvalidate(%d, #%d) -> %t", in.key, in.old, out.ok)
	}
}

func describeLinState(state any) string {
	s := state.(linState)
	var seen []string
	for v := int64(1); v < int64(len(s.seen))*8; v++ {
		if s.has(v) {
			seen = append(seen, fmt.Sprint("#", v))
		}
	}
	held := "none"
	if s.held != 0 {
		held = fmt.Sprint("#", s.held)
	}
	return fmt.Sprintf("holds %s; held before: %s", held, strings.Join(seen, " "))
}

var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[int][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(linInput).key
			byKey[k] = append(byKey[k], op)
		}
		var parts [][]porcupine.Operation
		for _, k := range slices.Sorted(maps.Keys(byKey)) {
			parts = append(parts, byKey[k])
		}
		return parts
	},
	Init:              func() any { return linState{} },
	Step:              linStep,
	DescribeOperation: describeLinOp,
	DescribeState:     describeLinState,
}

// linConfig shapes one history.
type linConfig struct {
	clients, ops, keys int
	hash               func(int) uint64
}

// recordHistory runs cfg.clients goroutines, each making cfg.ops random
// calls on one fresh cache, and returns what they saw. The ledger checks,
// once the cache is closed, that creations never overlapped and that every
// value was released exactly once.
func recordHistory(t *testing.T, cfg linConfig, seed uint64) ([]porcupine.Operation, epcache.Stats) {
	t.Helper()
	l := newLedger()
	var leasedRelease atomic.Int64 // values released while a lease held them: must stay 0
	c, err := epcache.New(epcache.Config[int, *conn]{
		Hash: cfg.hash,
		Release: func(key int, v *conn) {
			if v.leases.Load() != 0 {
				leasedRelease.Add(1)
			}
			l.release(key, v)
		},
		Create: func(_ context.Context, key int) (*conn, error) {
			l.enter(key)
			defer l.leave(key)
			// A creation takes a little while, so that concurrent Gets
			// coalesce onto it and Invalidates race with it.
			for range rand.IntN(4) {
				runtime.Gosched()
			}
			if rand.IntN(8) == 0 {
				time.Sleep(10 * time.Microsecond)
			}
			return l.newConn(key), nil
		},
	})
	require.NoError(t, err)

	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) } // monotonic
	var start, wg sync.WaitGroup
	start.Add(1)
	histories := make([][]porcupine.Operation, cfg.clients)
	for id := range cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(id)))
			seen := map[int]*conn{} // the last value this client saw, per key
			var other *conn         // a value of another key: never held by this one
			var leases []epcache.Lease[int, *conn]
			defer func() {
				for _, lease := range leases {
					lease.Value().leases.Add(-1)
					lease.Release()
				}
			}()
			start.Wait()
			for range cfg.ops {
				in := linInput{key: r.IntN(cfg.keys)}
				var out linOutput
				var call int64
				// Now and then, end the oldest lease this client holds.
				if len(leases) > 0 && r.IntN(3) == 0 {
					leases[0].Value().leases.Add(-1)
					leases[0].Release()
					leases = leases[1:]
				}
				switch p := r.IntN(110); {
				case p >= 100:
					in.kind = linOffer
					v := l.newConn(in.key)
					in.old = v.gen
					call = now()
					if out.ok = c.Offer(in.key, v); !out.ok {
						l.keepBack(v)
					}
				case p >= 90:
					in.kind = linAcquire
					call = now()
					lease, err := c.Acquire(context.Background(), in.key)
					switch v := lease.Value(); {
					case err != nil:
						out.err = err.Error()
					case v == nil:
						out.err = "a nil value"
					default:
						v.leases.Add(1)
						leases = append(leases, lease)
						out.v = v.gen
						seen[in.key] = v
					}
				case p < 45:
					in.kind = linGet
					call = now()
					v, err := c.Get(context.Background(), in.key)
					switch {
					case err != nil:
						out.err = err.Error()
					case v == nil:
						out.err = "a nil value"
					default:
						out.v = v.gen
						seen[in.key] = v
						if v.key != in.key {
							out.err = fmt.Sprintf("a value of key %d", v.key)
						}
						if r.IntN(4) == 0 {
							other = v
						}
					}
				case p < 65:
					in.kind = linLoad
					call = now()
					v, ok := c.Load(in.key)
					if out.ok = ok; ok && v == nil {
						out.err = "Load: a nil value"
					} else if ok {
						out.v = v.gen
						seen[in.key] = v
					}
				case p < 80:
					in.kind = linInvalidate
					call = now()
					out.ok = c.Invalidate(in.key)
				default:
					in.kind = linCompareAndInvalidate
					old := seen[in.key]
					if r.IntN(5) == 0 && other != nil && other.key != in.key {
						old = other
					}
					if old != nil {
						in.old = old.gen
					}
					call = now()
					out.ok = c.CompareAndInvalidate(in.key, old)
				}
				histories[id] = append(histories[id], porcupine.Operation{
					ClientId: id, Input: in, Call: call, Output: out, Return: now(),
				})
			}
		}()
	}
	start.Done()
	wg.Wait()
	require.NoError(t, c.Close())
	l.checkClosed(t, c)
	require.Zero(t, leasedRelease.Load(), "values released while leased")
	return slices.Concat(histories...), c.Stats()
}

// checkHistory checks ops against linModel. For a history that is not
// linearizable it writes porcupine's visualization into dir and returns it,
// with a listing of each key whose operations cannot be linearized.
func checkHistory(ops []porcupine.Operation, dir, name string) (res porcupine.CheckResult, report, viz string) {
	if res = porcupine.CheckOperationsTimeout(linModel, ops, 10*time.Second); res != porcupine.Illegal {
		return res, "", ""
	}
	var b strings.Builder
	for _, part := range linModel.Partition(ops) {
		if porcupine.CheckOperations(linModel, part) {
			continue
		}
		fmt.Fprintf(&b, "key %d, operations by call time (µs since the first call):\n", part[0].Input.(linInput).key)
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		t0 := part[0].Call
		for _, op := range part {
			fmt.Fprintf(&b, "  client %2d  [%9.3f, %9.3f]  %s\n", op.ClientId,
				float64(op.Call-t0)/1e3, float64(op.Return-t0)/1e3, describeLinOp(op.Input, op.Output))
		}
	}
	_, info := porcupine.CheckOperationsVerbose(linModel, ops, 10*time.Second)
	viz = filepath.Join(dir, name+".html")
	if err := porcupine.VisualizePath(linModel, info, viz); err != nil {
		viz = "(no visualization: " + err.Error() + ")"
	}
	return res, b.String(), viz
}

// countOverlapping counts the operations whose interval overlaps that of
// another client's operation on the same key: the ones that make a
// history concurrent.
func countOverlapping(ops []porcupine.Operation) int {
	n := 0
	for i, a := range ops {
		for j, b := range ops {
			if i != j && a.ClientId != b.ClientId && a.Input.(linInput).key == b.Input.(linInput).key &&
				a.Call <= b.Return && b.Call <= a.Return {
				n++
				break
			}
		}
	}
	return n
}

// linDir is where visualizations of failing histories go: $EPCACHE_LIN_DIR if
// set (it survives the test), else the test's temporary directory.
func linDir(t *testing.T) string {
	if dir := os.Getenv("EPCACHE_LIN_DIR"); dir != "" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		return dir
	}
	return t.TempDir()
}

// TestLinearizability checks thousands of short concurrent histories (tens
// of thousands with -long) of Get, Load, Invalidate and CompareAndInvalidate
// on a few keys, against every hash variant: each must be linearizable
// with respect to linModel. A failure prints the offending key's history and
// the path of porcupine's HTML visualization.
func TestLinearizability(t *testing.T) {
	histories, cfg := 1000, linConfig{clients: 6, ops: 10, keys: 2}
	switch {
	case *long:
		histories, cfg = 20000, linConfig{clients: 8, ops: 24, keys: 3}
	case testing.Short():
		histories = 100
	}
	eachHash(t, func(t *testing.T, hash func(int) uint64) {
		cfg := cfg
		cfg.hash = hash
		dir := linDir(t)
		seed := rand.Uint64()
		var counts [len(linNames)]int
		var waits, creates uint64
		overlapping := 0
		for i := range histories {
			ops, st := recordHistory(t, cfg, seed+uint64(i))
			waits += st.Waits
			creates += st.Creates
			overlapping += countOverlapping(ops)
			for _, op := range ops {
				counts[op.Input.(linInput).kind]++
			}
			res, report, viz := checkHistory(ops, dir, fmt.Sprintf("history-%d", i))
			switch res {
			case porcupine.Illegal:
				t.Fatalf("history %d (operations drawn with seed %d) is not linearizable:\n%s\nvisualization: %s", i, seed+uint64(i), report, viz)
			case porcupine.Unknown:
				t.Logf("history %d: the check timed out", i)
			}
		}
		t.Logf("%d histories: %d Get, %d Load, %d Invalidate, %d CompareAndInvalidate, %d Acquire, %d Offer; %d creations, %d Gets coalesced onto one; %d operations overlapped another client's on the same key",
			histories, counts[linGet], counts[linLoad], counts[linInvalidate], counts[linCompareAndInvalidate], counts[linAcquire], counts[linOffer], creates, waits, overlapping)
		assert.Positive(t, counts[linAcquire], "no Acquire")
		assert.Positive(t, counts[linOffer], "no Offer")
		assert.Positive(t, waits, "no Get ever waited on another's creation: the histories are not concurrent")
		assert.Positive(t, overlapping, "no two operations on one key overlapped")
	})
}

// TestLinearizabilityModel shows that the model is not vacuous: histories
// that a broken cache could produce are rejected, and a rejected history is
// written out for a person to read.
func TestLinearizabilityModel(t *testing.T) {
	op := func(client int, call, ret int64, in linInput, out linOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
	}
	get := linInput{kind: linGet, key: 1}
	load := linInput{kind: linLoad, key: 1}
	inv := linInput{kind: linInvalidate, key: 1}
	for _, tc := range []struct {
		name  string
		legal bool
		ops   []porcupine.Operation
	}{
		{"coalesced Gets share one value", true, []porcupine.Operation{
			op(0, 0, 10, get, linOutput{v: 5}),
			op(1, 1, 9, get, linOutput{v: 5}),
			op(2, 11, 12, load, linOutput{v: 5, ok: true}),
		}},
		{"any fresh number is a new value", true, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 9}),
			op(0, 2, 3, inv, linOutput{ok: true}),
			op(0, 4, 5, get, linOutput{v: 3}),
		}},
		{"concurrent Invalidate may go either way", true, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(1, 2, 10, inv, linOutput{ok: true}),
			op(2, 3, 4, load, linOutput{}),
			op(3, 5, 6, get, linOutput{v: 2}),
		}},
		{"a stale value after Invalidate returned", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(0, 2, 3, inv, linOutput{ok: true}),
			op(1, 4, 5, load, linOutput{v: 1, ok: true}),
		}},
		{"a released value resurrected by a Get", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(0, 2, 3, inv, linOutput{ok: true}),
			op(1, 4, 5, get, linOutput{v: 1}),
		}},
		{"two values at once", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(1, 2, 3, get, linOutput{v: 2}),
		}},
		{"Load creates nothing", false, []porcupine.Operation{
			op(0, 0, 1, load, linOutput{v: 1, ok: true}),
		}},
		{"Invalidate of an empty key", false, []porcupine.Operation{
			op(0, 0, 1, inv, linOutput{ok: true}),
		}},
		{"CompareAndInvalidate with a replaced value", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(0, 2, 3, inv, linOutput{ok: true}),
			op(0, 4, 5, get, linOutput{v: 2}),
			op(1, 6, 7, linInput{kind: linCompareAndInvalidate, key: 1, old: 1}, linOutput{ok: true}),
		}},
		{"a lost Load after a completed Get", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(1, 2, 3, load, linOutput{}),
		}},
		{"an Offer answers a Get in flight", true, []porcupine.Operation{
			op(0, 0, 10, get, linOutput{v: 7}),
			op(1, 1, 2, linInput{kind: linOffer, key: 1, old: 7}, linOutput{ok: true}),
			op(2, 11, 12, linInput{kind: linAcquire, key: 1}, linOutput{v: 7}),
		}},
		{"an Offer over a held value", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(1, 2, 3, linInput{kind: linOffer, key: 1, old: 2}, linOutput{ok: true}),
		}},
		{"an Offer refused on an empty key", false, []porcupine.Operation{
			op(0, 0, 1, linInput{kind: linOffer, key: 1, old: 2}, linOutput{}),
		}},
		{"an Acquire that resurrects a value", false, []porcupine.Operation{
			op(0, 0, 1, linInput{kind: linAcquire, key: 1}, linOutput{v: 1}),
			op(0, 2, 3, inv, linOutput{ok: true}),
			op(1, 4, 5, linInput{kind: linAcquire, key: 1}, linOutput{v: 1}),
		}},
		{"keys are independent", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(1, 2, 3, linInput{kind: linInvalidate, key: 2}, linOutput{ok: true}),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			res, report, viz := checkHistory(tc.ops, dir, "h")
			if tc.legal {
				assert.Equal(t, porcupine.Ok, res)
				return
			}
			require.Equal(t, porcupine.Illegal, res)
			last := tc.ops[len(tc.ops)-1]
			assert.Contains(t, report, describeLinOp(last.Input, last.Output), "the listing shows the operations")
			fi, err := os.Stat(viz)
			require.NoError(t, err, "the visualization is written")
			assert.Positive(t, fi.Size())
		})
	}
}
