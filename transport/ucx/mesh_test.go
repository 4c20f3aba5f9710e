//go:build ucx

package ucx_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/ucx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStorm starts 32 peer workers and has 8 goroutines on each send one
// message to every other peer, all released at once, goroutine g of peer i
// starting at peer i + g·P/G and going round (as MPI ranks spread their
// first contacts). Each peer must create exactly one endpoint per other
// peer, however many of its goroutines needed it at once; every message
// must arrive, from the right sender; and after Close every endpoint
// created must have been closed with ucp_ep_close_nbx, counted in the
// wrapper around it.
func TestStorm(t *testing.T) {
	peers, senders := 32, 8
	if testing.Short() {
		peers, senders = 12, 4
	}
	c := newContext(t, nil)
	m := startMesh(t, c, peers, 0, nil)
	start := make(chan struct{})
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
	)
	for i := range peers {
		for g := range senders {
			wg.Go(func() {
				first := i + g*peers/senders
				<-start
				for k := range peers {
					to := (first + k) % peers
					if to == i {
						continue
					}
					if err := sendOrHang(m.peers[i], to, payload(i, g, k)); err != nil {
						failed.Add(1)
						t.Errorf("peer %d -> %d: %v", i, to, err)
						return
					}
				}
			})
		}
	}
	began := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(began)
	require.Zero(t, failed.Load())
	for i := range peers {
		waitTotal(t, m.in[i], int64((peers-1)*senders), fmt.Sprint("peer ", i))
		for j := range peers {
			if j != i {
				assert.EqualValues(t, senders, m.in[i].From[j].Load(), "peer %d from %d", i, j)
			}
		}
	}
	var creates, waits uint64
	for i, p := range m.peers {
		st := p.Stats()
		assert.EqualValues(t, peers-1, st.Endpoints.Created, "peer %d: endpoints created (one per other peer)", i)
		assert.EqualValues(t, peers-1, st.Cache.Creates, "peer %d: creations", i)
		assert.Zero(t, st.Endpoints.Failed, "peer %d: endpoint failures", i)
		for j := range peers {
			_, held := ucx.Held(p, j)
			assert.Equal(t, j != i, held, "peer %d holds an endpoint for %d", i, j)
		}
		creates += st.Endpoints.Created
		waits += st.Cache.Waits
	}
	t.Logf("%d peers × %d goroutines: %d messages in %v; %d endpoints created (%d per peer), %d Gets waited for a creation",
		peers, senders, peers*senders*(peers-1), elapsed, creates, creates/uint64(peers), waits)

	m.close(t)
	st := c.Stats()
	assert.EqualValues(t, peers*(peers-1), st.Created, "endpoints created in the context")
	assert.Equal(t, st.Created, st.Closed, "every endpoint created was closed")
	assert.Zero(t, st.Orphaned, "no endpoint was left for Worker.Close")
}
