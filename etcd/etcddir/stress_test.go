package etcddir_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/transport/directory"
)

// OnDemand under churn: MaxEntries below the peers asked for, peers that
// publish late, restarts on new addresses, Unreachable, Prefetch and
// compactions, all at once. The transports ask for peers and report as
// unreachable each address that is not its peer's current one, as a dial
// to a dead process fails. While the late peers have not published,
// Resolves of them wait, more of them than MaxEntries' room, and every
// Resolve of a published peer answers meanwhile (one that waited behind
// them would end with the test's patience, an error). Once the churn
// ends, every peer converges to its final address: in Resolve, in Lookup
// and in the watcher's last news.
func TestOnDemandConvergesUnderChurn(t *testing.T) {
	const (
		size       = 12
		late       = 4 // peers size-late to size-1 publish only in the second phase
		maxEntries = 3
		askers     = 4
		minRounds  = 40 // per asker and phase
	)
	restarts := 3 // per peer and phase
	if testing.Short() {
		restarts = 1
	}
	s := server(t)
	tc := client(t, s.URL())
	pc := client(t, s.URL()) // the peers' processes share a client; each has its own lease
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Size, o.Mode, o.MaxEntries = size, etcddir.OnDemand, maxEntries })
	var lastMu sync.Mutex
	last := map[int]string{}
	stop := d.Watch(func(peer int, addr string) {
		lastMu.Lock()
		last[peer] = addr
		lastMu.Unlock()
	})
	defer stop()

	// The truth the transports dial against. A restart sets the peer's
	// current address before it publishes, so that an address reported
	// unreachable is always a dead process's.
	var mu sync.Mutex
	current := make([]string, size)
	procs := make([]*etcddir.Directory, size)
	gens := make([]int, size)
	restart := func(p int) {
		mu.Lock()
		gens[p]++
		addr := fmt.Sprintf("127.0.%d.%d:%d", gens[p]/250, gens[p]%250+1, 7000+p)
		current[p] = addr
		old := procs[p]
		mu.Unlock()
		proc := open(t, pc, func(o *etcddir.Options) { o.Size, o.Mode = size, etcddir.OnDemand })
		if err := proc.Publish(p, addr); err != nil {
			t.Errorf("Publish(%d, %s): %v", p, addr, err)
		}
		mu.Lock()
		procs[p] = proc
		mu.Unlock()
		if old != nil {
			old.Close() // its key holds the newer life, bound to proc's lease: nothing withdrawn
		}
	}
	isCurrent := func(p int, addr string) bool {
		mu.Lock()
		defer mu.Unlock()
		return current[p] == addr
	}
	isPeers := func(p int, addr string) bool {
		var a, b, c, port int
		_, err := fmt.Sscanf(addr, "127.%d.%d.%d:%d", &a, &b, &c, &port)
		return err == nil && port == 7000+p
	}
	// ask is one use of peer p by a transport: Resolve, and, if the
	// address is not the peer's current one, Unreachable.
	ask := func(p int) {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		addr, err := d.Resolve(ctx, p)
		if err != nil {
			t.Errorf("Resolve(%d) of a published peer: %v", p, err)
			return
		}
		if !isPeers(p, addr) {
			t.Errorf("Resolve(%d) = %q, not an address of the peer's", p, addr)
		}
		if !isCurrent(p, addr) {
			d.Unreachable(p, addr)
		}
	}
	// look is one use of peer p by a transport that only calls Lookup.
	look := func(p int) {
		addr, err := d.Lookup(p)
		switch {
		case errors.Is(err, directory.ErrNotPublished):
		case err != nil:
			t.Errorf("Lookup(%d): %v", p, err)
		case !isPeers(p, addr):
			t.Errorf("Lookup(%d) = %q, not an address of the peer's", p, addr)
		case !isCurrent(p, addr):
			d.Unreachable(p, addr)
		}
	}
	compact := func() {
		resp, err := tc.Get(request(t), "/test/"+t.Name()+"-compact")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := tc.Compact(request(t), resp.Header.Revision); err != nil {
			t.Error(err)
		}
	}
	var early int64 // a revision of the first lives, for Prefetch
	// phase churns the peers below published while the askers use them,
	// and every asker makes at least minRounds uses.
	phase := func(published int, also func(p int)) {
		done := make(chan struct{})
		var wg sync.WaitGroup
		for i := range askers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(i), uint64(published)))
				for round := 0; ; round++ {
					select {
					case <-done:
						if round >= minRounds {
							return
						}
					default:
					}
					p := r.IntN(published)
					if r.IntN(2) == 0 {
						p = r.IntN(maxEntries) // a working set that fits, so that restarts meet held addresses
					}
					if i%2 == 0 {
						ask(p)
					} else {
						look(p)
					}
					if also != nil {
						also(r.IntN(size))
					}
				}
			})
		}
		for step := range restarts * published {
			restart(step % published)
			switch step % 6 {
			case 1:
				if err := d.Prefetch(request(t), 0); err != nil {
					t.Errorf("Prefetch: %v", err)
				}
			case 3:
				compact()
			case 4:
				// Older lives than the cache may hold, or, once compacted
				// away, the newest.
				if err := d.Prefetch(request(t), early); err != nil {
					t.Errorf("Prefetch at revision %d: %v", early, err)
				}
			}
		}
		close(done)
		wg.Wait()
	}

	// Phase 1: the early peers publish; the late ones are waited for.
	for p := range size - late {
		restart(p)
	}
	early = modRevision(t, tc, etcddir.Key("/test/"+t.Name()+"/", size-late-1))
	type answer struct {
		peer int
		addr string
		err  error
	}
	waited := make(chan answer, late)
	for p := size - late; p < size; p++ {
		go func() {
			addr, err := d.Resolve(context.Background(), p)
			waited <- answer{p, addr, err}
		}()
	}
	// The guard's watch and one per late peer's wait.
	eventually(t, "the late peers are waited for", func() bool { return d.Counters().Watches >= 1+late })
	phase(size-late, func(p int) {
		if p >= size-late {
			if _, err := d.Lookup(p); !errors.Is(err, directory.ErrNotPublished) {
				t.Errorf("Lookup(%d) of a peer that has not published: %v", p, err)
			}
		}
	})
	select {
	case a := <-waited:
		t.Fatalf("Resolve(%d) of a peer that has not published returned %q, %v", a.peer, a.addr, a.err)
	default:
	}

	// Phase 2: the late peers publish, and every peer churns.
	for p := size - late; p < size; p++ {
		restart(p)
	}
	for range late {
		if a := <-waited; a.err != nil || !isPeers(a.peer, a.addr) {
			t.Errorf("Resolve(%d) waiting for its publication = %q, %v", a.peer, a.addr, a.err)
		}
	}
	phase(size, nil)

	// The churn is over: every peer converges to its final address.
	for p := range size {
		mu.Lock()
		final := current[p]
		mu.Unlock()
		eventually(t, fmt.Sprintf("Resolve(%d) converges to %s", p, final), func() bool {
			addr, err := d.Resolve(request(t), p)
			if err == nil && addr != final {
				d.Unreachable(p, addr)
			}
			return err == nil && addr == final
		})
		eventually(t, fmt.Sprintf("Lookup(%d) converges to %s", p, final), lookupIs(d, p, final))
		eventually(t, fmt.Sprintf("the watcher's last news of peer %d is %s", p, final), func() bool {
			lastMu.Lock()
			defer lastMu.Unlock()
			return last[p] == final
		})
	}
	if c := d.Counters(); c.Cached > maxEntries {
		t.Errorf("the directory holds %d addresses; want at most MaxEntries, %d", c.Cached, maxEntries)
	}
	t.Logf("counters: %+v", d.Counters())
}
