package tcp_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/internal/meshtest"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAllToAll starts 64 peers and has 16 goroutines on each send one frame
// to every other peer, all at once and in an order that makes every pair
// dial each other simultaneously: at step k, goroutine g of peer i sends to
// peer i^k(g), and that peer's goroutine g sends to i. Every frame must
// arrive, every pair must end with exactly one connection that both ends
// use, and closing the peers must give back every file descriptor.
func TestAllToAll(t *testing.T) {
	peers, senders := 64, 16
	if testing.Short() {
		peers, senders = 16, 4
	}
	require.Zero(t, peers&(peers-1), "peers must be a power of two for the i^k pairing")
	baseline := openFDs(t)

	m := startMesh(t, peers, 0, nil)
	start := make(chan struct{})
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
	)
	began := time.Now()
	for i := range peers {
		for g := range senders {
			wg.Go(func() {
				<-start
				for step := range peers - 1 {
					k := 1 + (step+g)%(peers-1) // goroutines start at different peers
					if err := sendOrHang(m.peers[i], i^k, payload(i, g, k)); err != nil {
						failed.Add(1)
						t.Errorf("peer %d -> %d: %v", i, i^k, err)
						return
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	require.Zero(t, failed.Load())
	for i := range peers {
		waitTotal(t, m.in[i], int64((peers-1)*senders), "peer "+strconv.Itoa(i))
		for j := range peers {
			if j != i {
				assert.Equal(t, int64(senders), m.in[i].From[j].Load(), "frames from %d to %d", j, i)
			}
		}
	}
	elapsed := time.Since(began)

	ids := make([]int, peers)
	for i := range ids {
		ids[i] = i
	}
	checkOnePerPair(t, m, ids)
	// Every connection dialed is accepted, and every one accepted was
	// dialed, or is a dial an Offer cut short, refused for its missing
	// hello. A cut may also come after the connect and before the hello:
	// that one is dialed and refused, hence an inequality. Accepts and
	// refusals happen on the acceptors' own time: a connection may still
	// wait in a backlog.
	eventually(t, func() bool {
		st := sum(m.peers)
		return st.Dialed <= st.Accepted && st.Accepted <= st.Dialed+st.Refused
	}, "every connection dialed was accepted, and every one accepted was dialed or refused")
	st := sum(m.peers)
	pairs := uint64(peers * (peers - 1) / 2)
	t.Logf("%d frames in %v; %d pairs: %d dial attempts, %d dialed, %d accepted, %d refused (dials cut short), %d duplicate ends closed; endpoints: %d created, %d offered (accepted)",
		st.Sent, elapsed, pairs, st.DialAttempts, st.Dialed, st.Accepted, st.Refused, st.Duplicates, st.Cache.Creates, st.Cache.Offers)
	assert.Equal(t, uint64(peers*(peers-1)*senders), st.Sent)
	// One endpoint per peer and direction, each made once: dialed by that
	// peer (a creation) or accepted from the other (an Offer). Together
	// with checkOnePerPair (both ends use one connection, and no other is
	// open), that is one connection per pair, and no reconnection.
	assert.Equal(t, uint64(peers*(peers-1)), st.Cache.Creates+st.Cache.Offers, "one endpoint per peer and direction")
	assert.Equal(t, pairs, st.Cache.Offers, "one end of each pair accepted its connection")
	assert.LessOrEqual(t, st.Dialed, st.Accepted, "every connection dialed was accepted")
	assert.LessOrEqual(t, st.Accepted, st.Dialed+st.Refused, "every connection accepted was dialed, or a dial an Offer cut short")

	m.close(t)
	checkFDs(t, baseline)
}

// TestReconnectOnce breaks one end of a connection under 16 goroutines that
// send on it: the failure is reported with CompareAndInvalidate by every
// goroutine (and the reader) that sees it, and the peer reconnects exactly
// once.
func TestReconnectOnce(t *testing.T) {
	baseline := openFDs(t)
	m := startMesh(t, 2, 0, nil)
	a, b := m.peers[0], m.peers[1]
	ctx := context.Background()
	require.NoError(t, a.Send(ctx, 1, payload(0, 0, 0)))
	waitTotal(t, m.in[1], 1, "peer 1")
	before := a.Stats()
	require.True(t, tcp.BreakEndpoint(a, 1))

	const senders, frames = 16, 50
	var (
		wg       sync.WaitGroup
		failures atomic.Int64
	)
	for g := range senders {
		wg.Go(func() {
			for f := range frames {
				if a.Send(ctx, 1, payload(0, g, f)) != nil {
					failures.Add(1)
				}
			}
		})
	}
	wg.Wait()
	after := a.Stats()
	// How many sends see the broken connection depends on whether the
	// reader noticed first.
	t.Logf("%d of %d sends failed on the broken connection", failures.Load(), senders*frames)
	assert.Equal(t, before.DialAttempts+1, after.DialAttempts, "one reconnection")
	assert.Equal(t, before.Cache.Creates+1, after.Cache.Creates, "one new endpoint")
	assert.Zero(t, b.Stats().DialAttempts, "peer 1 never needed to dial")

	// Every frame sent after the reconnection arrives.
	got := m.in[1].Total.Load()
	require.NoError(t, a.Send(ctx, 1, payload(0, 99, 99)))
	eventually(t, func() bool { return m.in[1].Total.Load() > got }, "the frame sent after the reconnection")
	m.close(t)
	checkFDs(t, baseline)
}

// TestChurn breaks random connections between rounds of all-to-all sends
// (sends that meet a broken connection are retried until they succeed), then
// checks that the peers converge: a last round arrives in full, over one
// connection per pair.
func TestChurn(t *testing.T) {
	peers, rounds := 8, 40
	if testing.Short() {
		rounds = 10
	}
	baseline := openFDs(t)
	m := startMesh(t, peers, 0, nil)
	ids := make([]int, peers)
	for i := range ids {
		ids[i] = i
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range rounds {
		for range 3 {
			i, j := rng.IntN(peers), rng.IntN(peers)
			if i != j {
				tcp.BreakEndpoint(m.peers[i], j)
			}
		}
		// A round's retries end with success or, if a peer can never reach
		// another, after hang.
		ctx, cancel := context.WithTimeout(context.Background(), hang)
		var wg sync.WaitGroup
		for _, i := range ids {
			for _, j := range ids {
				if i == j {
					continue
				}
				wg.Go(func() {
					for m.peers[i].Send(ctx, j, payload(i, j, 0)) != nil {
						if ctx.Err() != nil {
							t.Errorf("peer %d cannot reach peer %d", i, j)
							return
						}
					}
				})
			}
		}
		wg.Wait()
		cancel()
	}
	// A connection broken in the last round may still be held by the end
	// whose reader has not seen the break yet, and a frame written on it is
	// lost: wait until every pair holds one connection at both ends or none.
	eventually(t, func() bool { return converged(m, ids) }, "the peers never agreed on one connection per pair")
	// Frames sent on a connection just before it broke may be lost, and
	// others may still be on their way: the last round's frames are told
	// apart (meshtest.Final), and every one of them must arrive.
	var wg sync.WaitGroup
	for _, i := range ids {
		for _, j := range ids {
			if i != j {
				wg.Go(func() {
					if err := m.peers[i].Send(context.Background(), j, payload(i, j, meshtest.Final)); err != nil {
						t.Errorf("peer %d -> %d: %v", i, j, err)
					}
				})
			}
		}
	}
	wg.Wait()
	for _, i := range ids {
		waitFinals(t, m.in[i], int64(peers-1), "peer "+strconv.Itoa(i))
	}
	checkOnePerPair(t, m, ids)
	st := sum(m.peers)
	t.Logf("%d dialed, %d duplicate ends, %d creations, %d creation errors", st.Dialed, st.Duplicates, st.Cache.Creates, st.Cache.CreateErrors)
	m.close(t)
	checkFDs(t, baseline)
}

// converged reports whether every pair of peers among ids holds one
// connection at both ends or none at either, and no other connection end is
// open.
func converged(m *mesh, ids []int) bool {
	pairs := 0
	var open int64
	for a, i := range ids {
		open += m.peers[i].Stats().Open()
		for _, j := range ids[a+1:] {
			li, ri, oki := tcp.Endpoint(m.peers[i], j)
			lj, rj, okj := tcp.Endpoint(m.peers[j], i)
			switch {
			case oki != okj || oki && (li != rj || ri != lj):
				return false
			case oki:
				pairs++
			}
		}
	}
	return open == int64(2*pairs)
}

// sendOrHang sends payload from p to peer to, with a context that ends only
// if the Send hangs.
func sendOrHang(p *tcp.Peer, to int, payload []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	return p.Send(ctx, to, payload)
}
