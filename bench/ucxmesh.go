//go:build ucx

package bench

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/epcache/epcache/transport/ucx"
)

// ucxstorm is built with -tags ucx only: it needs cgo and libucx-dev.
func init() {
	meshes["ucxstorm"] = newUCXMesh
	Workloads = append(Workloads, "ucxstorm")
}

// ucxMesh is P UCX workers of one context in this process, each with its
// progress goroutine. An endpoint is ucx.Worker.Connect from one worker to
// another: ucp_ep_create with peer error handling and a flush that waits
// for the wire-up, the real creation cost. Release (the endpoint's Close)
// is ucp_ep_close_nbx, waited for. Closing the mesh closes the context,
// which closes the workers and counts, as orphans, any endpoint a
// comparator failed to release.
type ucxMesh struct {
	ctx     *ucx.Context
	workers []*ucx.Worker
	addrs   [][]byte
}

func newUCXMesh(peers int) (mesh, error) {
	var cfg map[string]string
	if os.Getenv("UCX_TLS") == "" {
		// With peer error handling, UCX 1.13 carries messages between
		// workers over TCP only (its shared-memory transports have no
		// peer failure handler); leaving them in would only cost each
		// worker shared-memory segments, which a container's /dev/shm
		// runs out of. UCX_TLS, if set, wins.
		cfg = map[string]string{"TLS": "self,tcp"}
	}
	c, err := ucx.NewContext(ucx.Options{Config: cfg})
	if err != nil {
		return nil, err
	}
	m := &ucxMesh{ctx: c}
	for range peers {
		w, err := c.NewWorker(ucx.WorkerOptions{})
		if err != nil {
			return nil, errors.Join(err, c.Close())
		}
		m.workers = append(m.workers, w)
		m.addrs = append(m.addrs, w.Address())
	}
	return m, nil
}

func (m *ucxMesh) open(ctx context.Context, from, to int) (io.Closer, error) {
	if to < 0 || to >= len(m.addrs) {
		return nil, errNoPeer
	}
	return m.workers[from].Connect(ctx, m.addrs[to], to)
}

// roundTrips: UCX's TCP transport connects (one round trip), then the
// wire-up request waits for the peer's reply, which the flush waits for.
func (m *ucxMesh) roundTrips() int { return 2 }

func (m *ucxMesh) close() error { return m.ctx.Close() }
