package tcp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/epcache/epcache/observe/debugpage"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var _ debugpage.Source = tcp.DebugSource{}

// A peer's DebugSource gives every number of its Stats, and Open, as
// counters, and its endpoint cache's totals; on the debug page, the peer
// registered twice is refused.
func TestDebugSourceShowsEveryCounterAndTheCache(t *testing.T) {
	dir, err := directory.New(directory.Options{Size: 2})
	require.NoError(t, err)
	cfg := tcp.Config{Directory: dir, CreateTimeout: hang, HandshakeTimeout: hang}
	a, err := tcp.Listen(cfg)
	require.NoError(t, err)
	defer a.Close()
	cfg.ID = 1
	b, err := tcp.Listen(cfg)
	require.NoError(t, err)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	require.NoError(t, a.Send(ctx, 1, []byte("ping")))
	_, err = b.Recv(ctx)
	require.NoError(t, err)

	src := a.DebugSource()
	assert.Equal(t, uint64(1), src.CacheStats().Creates, "one connection, to peer 1")
	counters := src.Counters()
	assert.Equal(t, float64(1), counters["Dialed"])
	assert.Equal(t, float64(1), counters["Sent"])
	assert.Equal(t, float64(1), counters["Open"])
	st := reflect.TypeFor[tcp.Stats]()
	for i := range st.NumField() {
		if f := st.Field(i); f.Type.Kind() >= reflect.Int && f.Type.Kind() <= reflect.Float64 {
			assert.Contains(t, counters, f.Name, "every number of tcp.Stats")
		}
	}

	h := debugpage.New()
	require.NoError(t, h.AddSource("peer 0", a.DebugSource()))
	require.ErrorIs(t, h.AddSource("peer 0 again", a.DebugSource()), debugpage.ErrAlreadyAdded)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var page struct {
		Sources []struct {
			Name     string                    `json:"name"`
			Stats    *struct{ Creates uint64 } `json:"stats"`
			Counters map[string]float64        `json:"counters"`
		} `json:"sources"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &page))
	require.Len(t, page.Sources, 1)
	assert.Equal(t, "peer 0", page.Sources[0].Name)
	require.NotNil(t, page.Sources[0].Stats)
	assert.Equal(t, uint64(1), page.Sources[0].Stats.Creates)
	assert.Equal(t, float64(1), page.Sources[0].Counters["Dialed"])
}
