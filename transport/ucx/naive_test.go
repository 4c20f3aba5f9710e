//go:build ucx

package ucx_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/ucx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The original race, reproduced on real UCX endpoints: get_ep as Open
// MPI's pml_ucx writes it (ompi #12833) beside epcache, under one storm.

// endpoints is how a storm gets the endpoint from worker `from` to peer
// `to`; teardown closes what it holds, as the owner would at shutdown.
type endpoints interface {
	get(ctx context.Context, from, to int) (*ucx.Endpoint, error)
	teardown()
}

// naive is pml_ucx's get_ep: read the peer's slot; if it is empty, look
// the address up, create an endpoint and store it. Nothing stops two
// goroutines from both seeing the slot empty and both creating: the last
// store wins and the other endpoints are lost, never closed. (The slots are
// atomic pointers only so that the race detector accepts the program; the
// logic is the C code's: a plain load, a plain store.) afterMiss, if set,
// runs between the empty read and the creation: the gate that makes every
// goroutine lose the race.
type naive struct {
	workers   []*ucx.Worker
	dir       *directory.Directory
	slots     [][]atomic.Pointer[ucx.Endpoint] // [from][to]
	afterMiss func(from, to int)
}

func (n *naive) get(ctx context.Context, from, to int) (*ucx.Endpoint, error) {
	if ep := n.slots[from][to].Load(); ep != nil {
		return ep, nil
	}
	if n.afterMiss != nil {
		n.afterMiss(from, to)
	}
	addr, err := n.dir.Lookup(to)
	if err != nil {
		return nil, err
	}
	ep, err := n.workers[from].Connect(ctx, []byte(addr), to)
	if err != nil {
		return nil, err
	}
	n.slots[from][to].Store(ep)
	return ep, nil
}

// teardown closes the endpoints the slots hold, as pml_ucx's del_procs
// does: the ones lost to the race are not there to be closed.
func (n *naive) teardown() {
	for _, row := range n.slots {
		for i := range row {
			if ep := row[i].Swap(nil); ep != nil {
				_ = ep.Close()
			}
		}
	}
}

// cached is epcache: a cache per worker, whose Create looks the address up
// and connects, and whose Release closes. afterMiss, if set, runs when
// Load misses, before Get: the same gate as naive's, at the same place.
type cached struct {
	caches    []*epcache.Cache[int, *ucx.Endpoint]
	afterMiss func(from, to int)
}

func newCached(t *testing.T, workers []*ucx.Worker, dir *directory.Directory) *cached {
	c := &cached{}
	for _, w := range workers {
		cache, err := epcache.New(epcache.Config[int, *ucx.Endpoint]{
			Create: func(ctx context.Context, to int) (*ucx.Endpoint, error) {
				addr, err := dir.Lookup(to)
				if err != nil {
					return nil, err
				}
				return w.Connect(ctx, []byte(addr), to)
			},
			Release: func(_ int, ep *ucx.Endpoint) { _ = ep.Close() },
		})
		require.NoError(t, err)
		c.caches = append(c.caches, cache)
	}
	return c
}

func (c *cached) get(ctx context.Context, from, to int) (*ucx.Endpoint, error) {
	if ep, ok := c.caches[from].Load(to); ok {
		return ep, nil
	}
	if c.afterMiss != nil {
		c.afterMiss(from, to)
	}
	return c.caches[from].Get(ctx, to)
}

func (c *cached) teardown() {
	for _, cache := range c.caches {
		_ = cache.Close()
	}
}

// gate is a barrier per (worker, peer): each of the G goroutines that
// reach it waits until all G have, so that all of them have seen the slot
// empty before any of them goes on.
type gate struct {
	g     int
	mu    sync.Mutex
	count map[[2]int]int
	open  map[[2]int]chan struct{}
}

func newGate(g int) *gate {
	return &gate{g: g, count: map[[2]int]int{}, open: map[[2]int]chan struct{}{}}
}

func (gt *gate) arrive(from, to int) {
	k := [2]int{from, to}
	gt.mu.Lock()
	ch := gt.open[k]
	if ch == nil {
		ch = make(chan struct{})
		gt.open[k] = ch
	}
	gt.count[k]++
	if gt.count[k] == gt.g {
		close(ch)
	}
	gt.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(hang):
		gt.mu.Lock()
		n := gt.count[k]
		gt.mu.Unlock()
		panic(fmt.Sprintf("gate (%d, %d): only %d of %d goroutines arrived in %v", from, to, n, gt.g, hang))
	}
}

// tally is what a storm leaves behind.
type tally struct {
	created, stored, closed, leaked uint64
}

func (t tally) String() string {
	return fmt.Sprintf("created %d, stored %d, closed by the owner %d, leaked %d", t.created, t.stored, t.closed, t.leaked)
}

// storm runs P workers with G goroutines each; every goroutine gets the
// endpoint of every other peer, all in the same order (the worst case: all
// G need the same peer at the same moment) and sends one message on it,
// which must arrive.
// It tears down with the owner's teardown, counts what the owner closed
// and what it left open (leaked), and then closes the workers, which close
// the leaked endpoints as orphans so that the test itself leaks nothing.
func storm(t *testing.T, P, G int, build func(workers []*ucx.Worker, dir *directory.Directory) endpoints) tally {
	t.Helper()
	c := newContext(t, nil)
	dir, err := directory.New(directory.Options{Size: P})
	require.NoError(t, err)
	workers := make([]*ucx.Worker, P)
	for i := range P {
		workers[i], err = c.NewWorker(ucx.WorkerOptions{})
		require.NoError(t, err)
		require.NoError(t, dir.Publish(i, string(workers[i].Address())))
	}
	eps := build(workers, dir)
	// Each get, send and receive ends, or the storm hangs: a context per
	// operation bounds it by hang, however long the storm takes.
	opCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), hang)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for from := range P {
		for range G {
			wg.Go(func() {
				<-start
				for k := 1; k < P; k++ {
					to := (from + k) % P
					ctx, cancel := opCtx()
					ep, err := eps.get(ctx, from, to)
					if err == nil {
						err = ep.Send(ctx, uint64(from)<<32|uint64(to), []byte("hi"))
					}
					cancel()
					if err != nil {
						t.Errorf("%d -> %d: %v", from, to, err)
						return
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	// Every message arrived: the endpoints, lost ones included, carry data.
	buf := make([]byte, 16)
	for i, w := range workers {
		for range (P - 1) * G {
			ctx, cancel := opCtx()
			_, tag, err := w.Recv(ctx, buf)
			cancel()
			require.NoError(t, err, "worker %d", i)
			require.EqualValues(t, i, uint32(tag), "worker %d got a message for %d", i, uint32(tag))
		}
	}
	var tl tally
	for _, w := range workers {
		tl.stored += uint64(w.Stats().Live()) // before teardown, every open endpoint
	}
	eps.teardown()
	for _, w := range workers {
		st := w.Stats()
		tl.created += st.Created
		tl.closed += st.Closed
		tl.leaked += uint64(st.Live())
	}
	tl.stored -= tl.leaked // open before teardown and not closed by it: never stored
	for _, w := range workers {
		require.NoError(t, w.Close())
		st := w.Stats()
		assert.Equal(t, st.Created, st.Closed, "Worker.Close closes the orphans")
	}
	assert.Equal(t, tl.leaked, c.Stats().Orphaned, "the leaked endpoints were closed as orphans")
	return tl
}

// TestNaiveLeaks runs the same storm (8 workers × 8 goroutines, all asking
// for the same peer at the same moment) against the naive get_ep and
// against epcache, again and again: the naive one creates more endpoints
// than it stores, and the surplus leaks; epcache creates exactly one per
// (worker, peer) and leaks none. Whether the naive one loses the race in a
// given run depends on the scheduler, so the storms go on until it has lost
// it in two runs (else, after hang, the test fails); TestNaiveLeaksGated
// makes the loss certain.
func TestNaiveLeaks(t *testing.T) {
	const P, G, leaks = 8, 8, 2
	var leakedRuns int
	began := time.Now()
	for run := 0; leakedRuns < leaks; run++ {
		if time.Since(began) > hang {
			t.Fatalf("the naive get_ep lost the race in %d of %d runs in %v; want %d", leakedRuns, run, hang, leaks)
		}
		nv := storm(t, P, G, func(ws []*ucx.Worker, dir *directory.Directory) endpoints {
			return newNaive(ws, dir, nil)
		})
		ec := storm(t, P, G, func(ws []*ucx.Worker, dir *directory.Directory) endpoints {
			return newCached(t, ws, dir)
		})
		t.Logf("run %d, %d workers × %d goroutines: naive: %v; epcache: %v", run, P, G, nv, ec)
		assert.EqualValues(t, P*(P-1), nv.stored, "naive: one endpoint stored per (worker, peer)")
		assert.Equal(t, nv.created, nv.stored+nv.leaked, "naive: every endpoint created is stored or leaked")
		assert.EqualValues(t, P*(P-1), ec.created, "epcache: one endpoint created per (worker, peer)")
		assert.Zero(t, ec.leaked, "epcache leaks nothing")
		if nv.leaked > 0 {
			leakedRuns++
		}
	}
}

// TestNaiveLeaksGated makes the race certain: between reading the empty
// slot and creating, each goroutine waits until all G goroutines of its
// worker have read it empty. The naive get_ep then creates G endpoints per
// (worker, peer) and leaks G-1 of them; epcache, with every caller let
// through the same gate after the same miss (Load), creates one and leaks
// none.
func TestNaiveLeaksGated(t *testing.T) {
	const P, G = 6, 8
	nv := storm(t, P, G, func(ws []*ucx.Worker, dir *directory.Directory) endpoints {
		return newNaive(ws, dir, newGate(G).arrive)
	})
	ec := storm(t, P, G, func(ws []*ucx.Worker, dir *directory.Directory) endpoints {
		c := newCached(t, ws, dir)
		c.afterMiss = newGate(G).arrive
		return c
	})
	t.Logf("gated, %d workers × %d goroutines: naive: %v; epcache: %v", P, G, nv, ec)
	pairs := uint64(P * (P - 1))
	assert.Equal(t, tally{created: pairs * G, stored: pairs, closed: pairs, leaked: pairs * (G - 1)}, nv)
	assert.Equal(t, tally{created: pairs, stored: pairs, closed: pairs}, ec)
}

func newNaive(ws []*ucx.Worker, dir *directory.Directory, afterMiss func(from, to int)) *naive {
	n := &naive{workers: ws, dir: dir, afterMiss: afterMiss, slots: make([][]atomic.Pointer[ucx.Endpoint], len(ws))}
	for i := range n.slots {
		n.slots[i] = make([]atomic.Pointer[ucx.Endpoint], dir.Size())
	}
	return n
}
