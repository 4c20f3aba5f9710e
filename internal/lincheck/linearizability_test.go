package lincheck_test

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
//
// Two more kinds of operation come from the cache rather than a client: the
// end of a lease (Lease.Release), and Config.Release of a value, recorded
// over the time the callback ran, on whichever goroutine ran it. A value
// must have left the key before its Release (and a value no lease holds may
// leave by itself only in the histories below), and one released is never
// returned again.
//
// With MaxEntries or IdleTimeout (linConfig.lifecycle), the cache removes
// values by itself: an eviction or an idle removal is an Invalidate that no
// client called. The model allows one at any point for a value that no
// lease holds, and never for a leased one; it takes it only when an
// operation's output needs it (a Get that returns a new value, a Load that
// finds none, a Release), which loses nothing, since a removal that could
// happen earlier could as well happen at the last moment before it shows.
// Such histories also allow an Offer to be refused on an empty key (a full
// cache). Their clients end their leases before each Get or Acquire, so
// that no client waits for room while it holds some: every wait ends, and
// a Get never leaves on its context (a creation it started would go on,
// and publish a value no operation returned).

type linKind uint8

const (
	linGet linKind = iota
	linLoad
	linInvalidate
	linCompareAndInvalidate
	linAcquire // Get plus a lease: the same specification; the lease ends later
	linOffer
	linEnd     // Lease.Release of a lease of the value numbered old
	linRelease // Config.Release of the value numbered old, as the cache called it
)

var linNames = [...]string{"Get", "Load", "Invalidate", "CompareAndInvalidate", "Acquire", "Offer", "End", "Release"}

// linInput is an operation as called.
type linInput struct {
	kind linKind
	key  int
	old  int64 // CompareAndInvalidate: the gen of the value passed as old (0: a value never created); Offer: the gen of the value offered; End, Release: the gen of the value
	// lifecycle: the cache has MaxEntries or IdleTimeout set, and may remove
	// an unleased value by itself (an eviction, an idle removal); bounded:
	// it has MaxEntries set, and may refuse an Offer for want of room.
	lifecycle, bounded bool
}

// linOutput is what the operation returned. v is a value's gen, 0 for none.
type linOutput struct {
	v   int64
	ok  bool   // Load found a value; Invalidate and CompareAndInvalidate reported true
	err string // Get's error: none is expected, so any fails the history
}

// linState is one key's state: the value it holds (0: none), the leases
// held on it, and the values the key ever held or that were released, as a
// bit set in a string, so that states compare with ==.
type linState struct {
	held   int64
	leases int
	seen   string
}

func (s linState) has(v int64) bool {
	i := int(v / 8)
	return i < len(s.seen) && s.seen[i]&(1<<(v%8)) != 0
}

func (s linState) holding(v int64) linState {
	return linState{held: v, seen: s.marked(v)}
}

// marked returns seen with v added.
func (s linState) marked(v int64) string {
	b := []byte(s.seen)
	for int(v/8) >= len(b) {
		b = append(b, 0)
	}
	b[v/8] |= 1 << (v % 8)
	return string(b)
}

// gone is s once its value has left: nothing held, nothing leased.
func (s linState) gone() linState { return linState{seen: s.seen} }

// linStep is the sequential specification of one key.
func linStep(state, input, output any) (bool, any) {
	s, in, out := state.(linState), input.(linInput), output.(linOutput)
	if out.err != "" {
		return false, s
	}
	// The cache may remove the held value by itself (an eviction, an idle
	// removal) only with the lifecycle options, and never one a lease holds.
	removable := in.lifecycle && s.held != 0 && s.leases == 0
	switch in.kind {
	case linGet, linAcquire:
		leased := 0
		if in.kind == linAcquire {
			leased = 1
		}
		if s.held != 0 && out.v == s.held {
			s.leases += leased
			return true, s // a hit: the held value
		}
		if s.held != 0 && !removable {
			return false, s
		}
		// A miss creates (after a removal, if the key held a value): any
		// value the key never held before (or one that an Offer made,
		// answering the creation).
		ns := s.holding(out.v)
		ns.leases = leased
		return out.v > 0 && !s.has(out.v), ns
	case linOffer:
		if !out.ok {
			// Refused: the key holds a value (or it may, if a removal is
			// allowed: taken when something needs it), or, under
			// MaxEntries, the cache is full. The value is never the
			// cache's: no Get may return it.
			return s.held != 0 || in.bounded, linState{held: s.held, leases: s.leases, seen: s.marked(in.old)}
		}
		if s.held != 0 && !removable {
			return false, s
		}
		return !s.has(in.old), s.holding(in.old)
	case linLoad:
		switch {
		case s.held != 0 && out.ok:
			return out.v == s.held, s
		case s.held != 0: // none: removed by the cache, if it may
			return removable, s.gone()
		}
		return !out.ok, s // Load never creates
	case linInvalidate:
		switch {
		case s.held != 0 && out.ok:
			return true, s.gone()
		case s.held != 0:
			return removable, s.gone()
		}
		return !out.ok, s
	case linCompareAndInvalidate:
		if s.held != 0 && s.held == in.old {
			if out.ok {
				return true, s.gone()
			}
			return removable, s.gone()
		}
		return !out.ok, s
	case linEnd:
		if s.held == in.old {
			s.leases--
			return s.leases >= 0, s
		}
		return true, s // a lease of a value that left the key
	case linRelease:
		// Released: the value must have left the key, by an Invalidate, a
		// Close, or a removal the cache may make now; and never comes back.
		if s.held == in.old {
			return removable, s.gone()
		}
		return true, linState{held: s.held, leases: s.leases, seen: s.marked(in.old)}
	}
	panic(fmt.Sprintf("unknown operation %d", in.kind))
}

func describeLinOp(input, output any) string {
	in, out := input.(linInput), output.(linOutput)
	if out.err != "" {
		return fmt.Sprintf("%s(%d) -> error %q", linNames[in.kind], in.key, out.err)
	}
	switch in.kind {
	case linEnd:
		return fmt.Sprintf("End(lease of #%d)", in.old)
	case linRelease:
		return fmt.Sprintf("Release(%d, #%d)", in.key, in.old)
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
		held = fmt.Sprintf("#%d (%d leases)", s.held, s.leases)
	}
	return fmt.Sprintf("holds %s; held or released before: %s", held, strings.Join(seen, " "))
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
	// The lifecycle options; with either, a client ends its leases before
	// each Get or Acquire, and the Get or Acquire gets a context that ends
	// after linWait: a wait for room that lasts that long fails the
	// history.
	maxEntries int
	idle       time.Duration
}

func (cfg linConfig) lifecycle() bool { return cfg.maxEntries > 0 || cfg.idle > 0 }

// linWait bounds a Get or Acquire of a lifecycle history: every wait for
// room ends when another client ends its leases, which it does before its
// next Get or Acquire, so only a cache that fails to hand the room over
// waits so long: linWait only detects that hang.
const linWait = hang

// linModes are the option sets the campaign rotates through: plain (half
// the histories), and a cap below the keys, a short IdleTimeout, and both.
// With IdleTimeout a client now and then pauses for linPause before an
// operation, so that values go idle while others are used.
var linModes = []struct {
	name       string
	maxEntries int
	idle       time.Duration
}{
	{"plain", 0, 0},
	{"MaxEntries", 1, 0},
	{"plain", 0, 0},
	{"IdleTimeout", 0, 40 * time.Microsecond},
	{"plain", 0, 0},
	{"MaxEntries+IdleTimeout", 2, 40 * time.Microsecond},
}

// linPause is a client's pause in a history with IdleTimeout: longer than
// the IdleTimeout and the sweeps' lag.
const linPause = 100 * time.Microsecond

// recordHistory runs cfg.clients goroutines, each making cfg.ops random
// calls on one fresh cache, and returns what they saw. The ledger checks,
// once the cache is closed, that creations never overlapped and that every
// value was released exactly once.
func recordHistory(t *testing.T, cfg linConfig, seed uint64) ([]porcupine.Operation, epcache.Stats) {
	t.Helper()
	l := newLedger()
	var leasedRelease atomic.Int64 // values released while a lease held them: must stay 0
	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) } // monotonic
	// The Releases the cache makes while the clients run, as operations of
	// a client of their own (Close's come after the history).
	var (
		releaseMu sync.Mutex
		releases  []porcupine.Operation
		recording atomic.Bool
	)
	recording.Store(true)
	c, err := epcache.New(epcache.Config[int, *conn]{
		Hash:        cfg.hash,
		MaxEntries:  cfg.maxEntries,
		IdleTimeout: cfg.idle,
		Release: func(key int, v *conn) {
			call := now()
			if v.leases.Load() != 0 {
				leasedRelease.Add(1)
			}
			l.release(key, v)
			if recording.Load() {
				op := porcupine.Operation{
					ClientId: cfg.clients,
					Input:    linInput{kind: linRelease, key: key, old: v.gen, lifecycle: cfg.lifecycle(), bounded: cfg.maxEntries > 0},
					Call:     call, Output: linOutput{}, Return: now(),
				}
				releaseMu.Lock()
				releases = append(releases, op)
				releaseMu.Unlock()
			}
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
			// end ends a lease, recorded as an operation.
			end := func(lease epcache.Lease[int, *conn]) {
				v := lease.Value()
				in := linInput{kind: linEnd, key: lease.Key(), old: v.gen, lifecycle: cfg.lifecycle(), bounded: cfg.maxEntries > 0}
				call := now()
				v.leases.Add(-1)
				lease.Release()
				histories[id] = append(histories[id], porcupine.Operation{ClientId: id, Input: in, Call: call, Output: linOutput{}, Return: now()})
			}
			defer func() {
				for _, lease := range leases {
					end(lease)
				}
			}()
			// getCtx is the context of a Get or an Acquire. With the
			// lifecycle options, the client holds no lease while it may
			// wait for room.
			getCtx := func() (context.Context, context.CancelFunc) {
				if !cfg.lifecycle() {
					return context.Background(), func() {}
				}
				for _, lease := range leases {
					end(lease)
				}
				leases = leases[:0]
				return context.WithTimeout(context.Background(), linWait)
			}
			start.Wait()
			for range cfg.ops {
				in := linInput{key: r.IntN(cfg.keys), lifecycle: cfg.lifecycle(), bounded: cfg.maxEntries > 0}
				var out linOutput
				var call int64
				// Now and then, end the oldest lease this client holds.
				if len(leases) > 0 && r.IntN(3) == 0 {
					end(leases[0])
					leases = leases[1:]
				}
				if cfg.idle > 0 && r.IntN(20) == 0 {
					time.Sleep(linPause)
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
					ctx, cancel := getCtx()
					call = now()
					lease, err := c.Acquire(ctx, in.key)
					cancel()
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
					ctx, cancel := getCtx()
					call = now()
					v, err := c.Get(ctx, in.key)
					cancel()
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
	recording.Store(false)
	require.NoError(t, c.Close())
	l.checkClosed(t, c)
	require.Zero(t, leasedRelease.Load(), "values released while leased")
	releaseMu.Lock()
	defer releaseMu.Unlock()
	return slices.Concat(append(histories, releases)...), c.Stats()
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
// of thousands with -long) of Get, Load, Invalidate, CompareAndInvalidate,
// Acquire, Offer, lease ends and Releases on a few keys, against every hash
// variant: each must be linearizable with respect to linModel. Half the
// histories run with MaxEntries (below the keys), IdleTimeout or both
// (linModes), so that values also leave by eviction and idle removal. A
// failure prints the offending key's history and the path of porcupine's
// HTML visualization.
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
		var waits, creates, evictions, idleRemovals, roomWaits uint64
		overlapping := 0
		for i := range histories {
			mode := linModes[i%len(linModes)]
			cfg := cfg
			cfg.maxEntries, cfg.idle = mode.maxEntries, mode.idle
			ops, st := recordHistory(t, cfg, seed+uint64(i))
			waits += st.Waits
			creates += st.Creates
			evictions += st.Evictions
			idleRemovals += st.IdleRemovals
			roomWaits += st.RoomWaits
			overlapping += countOverlapping(ops)
			for _, op := range ops {
				counts[op.Input.(linInput).kind]++
			}
			res, report, viz := checkHistory(ops, dir, fmt.Sprintf("history-%d", i))
			switch res {
			case porcupine.Illegal:
				t.Fatalf("history %d (%s, operations drawn with seed %d) is not linearizable:\n%s\nvisualization: %s", i, mode.name, seed+uint64(i), report, viz)
			case porcupine.Unknown:
				t.Logf("history %d: the check timed out", i)
			}
		}
		t.Logf("%d histories: %d Get, %d Load, %d Invalidate, %d CompareAndInvalidate, %d Acquire, %d Offer, %d lease ends, %d Releases; %d creations, %d Gets coalesced onto one; %d operations overlapped another client's on the same key; %d evictions, %d idle removals, %d waits for room",
			histories, counts[linGet], counts[linLoad], counts[linInvalidate], counts[linCompareAndInvalidate], counts[linAcquire], counts[linOffer], counts[linEnd], counts[linRelease], creates, waits, overlapping, evictions, idleRemovals, roomWaits)
		assert.Positive(t, counts[linAcquire], "no Acquire")
		assert.Positive(t, counts[linOffer], "no Offer")
		assert.Positive(t, counts[linEnd], "no lease ended")
		assert.Positive(t, counts[linRelease], "no Release")
		assert.Positive(t, evictions, "no value was evicted")
		if !testing.Short() { // a few dozen in 1,000 histories: maybe none in 100
			assert.Positive(t, idleRemovals, "no value was removed idle")
		}
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
	// With the lifecycle options: values may leave by themselves.
	lget := linInput{kind: linGet, key: 1, lifecycle: true}
	lload := linInput{kind: linLoad, key: 1, lifecycle: true}
	lacq := linInput{kind: linAcquire, key: 1, lifecycle: true}
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
		{"a Release inside the end of the last lease of an invalidated value", true, []porcupine.Operation{
			op(0, 0, 1, linInput{kind: linAcquire, key: 1}, linOutput{v: 1}),
			op(1, 2, 3, inv, linOutput{ok: true}),
			op(0, 4, 7, linInput{kind: linEnd, key: 1, old: 1}, linOutput{}),
			op(2, 5, 6, linInput{kind: linRelease, key: 1, old: 1}, linOutput{}),
		}},
		{"a Release of a value the key holds", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(1, 2, 3, linInput{kind: linRelease, key: 1, old: 1}, linOutput{}),
		}},
		{"a Release under a lease", false, []porcupine.Operation{
			op(0, 0, 1, lacq, linOutput{v: 1}),
			op(1, 2, 3, linInput{kind: linRelease, key: 1, old: 1, lifecycle: true}, linOutput{}),
		}},
		{"an evicted value replaced with no Invalidate", true, []porcupine.Operation{
			op(0, 0, 1, lget, linOutput{v: 1}),
			op(1, 2, 3, lload, linOutput{}),
			op(1, 4, 5, lget, linOutput{v: 2}),
			op(2, 6, 7, linInput{kind: linInvalidate, key: 1, lifecycle: true}, linOutput{ok: true}),
			op(2, 8, 9, linInput{kind: linCompareAndInvalidate, key: 1, old: 3, lifecycle: true}, linOutput{}),
		}},
		{"a value leaves by itself only with the lifecycle options", false, []porcupine.Operation{
			op(0, 0, 1, get, linOutput{v: 1}),
			op(1, 2, 3, inv, linOutput{}),
		}},
		{"a leased value is never evicted", false, []porcupine.Operation{
			op(0, 0, 1, lacq, linOutput{v: 1}),
			op(1, 2, 3, lget, linOutput{v: 2}),
		}},
		{"a value evicted once its lease ended", true, []porcupine.Operation{
			op(0, 0, 1, lacq, linOutput{v: 1}),
			op(0, 2, 3, linInput{kind: linEnd, key: 1, old: 1, lifecycle: true}, linOutput{}),
			op(1, 4, 5, lget, linOutput{v: 2}),
		}},
		{"a value returned after its Release returned", false, []porcupine.Operation{
			op(0, 0, 1, lget, linOutput{v: 1}),
			op(1, 2, 3, linInput{kind: linRelease, key: 1, old: 1, lifecycle: true}, linOutput{}),
			op(2, 4, 5, lload, linOutput{v: 1, ok: true}),
		}},
		{"an evicted value that comes back", false, []porcupine.Operation{
			op(0, 0, 1, lget, linOutput{v: 1}),
			op(1, 2, 3, lload, linOutput{}),
			op(2, 4, 5, lget, linOutput{v: 1}),
		}},
		{"a full cache refuses an Offer", true, []porcupine.Operation{
			op(0, 0, 1, linInput{kind: linOffer, key: 1, old: 5, lifecycle: true, bounded: true}, linOutput{}),
		}},
		{"a refused Offer's value in the cache", false, []porcupine.Operation{
			op(0, 0, 1, linInput{kind: linOffer, key: 1, old: 5, lifecycle: true, bounded: true}, linOutput{}),
			op(1, 2, 3, lget, linOutput{v: 5}),
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
