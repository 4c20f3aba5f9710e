package debugpage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/epcache/epcache/epcache"
)

// pageJSON is the page, as format=json answers it (see the package doc).
type pageJSON struct {
	Time    time.Time    `json:"time"`
	Sort    string       `json:"sort"`
	Order   string       `json:"order"`
	States  []string     `json:"states,omitempty"`
	Key     string       `json:"key,omitempty"`
	Offset  int          `json:"offset"`
	Limit   int          `json:"limit"`
	Sources []sourceJSON `json:"sources"`
}

type sourceJSON struct {
	Name     string             `json:"name"`
	Error    string             `json:"error,omitempty"` // reading the source panicked
	Stats    *statsJSON         `json:"stats,omitempty"`
	Peers    *peersJSON         `json:"peers,omitempty"`
	Counters map[string]float64 `json:"counters,omitempty"`
}

type statsJSON struct {
	Creates       uint64 `json:"creates"`
	CreateErrors  uint64 `json:"create_errors"`
	Attempts      uint64 `json:"attempts"`
	Waits         uint64 `json:"waits"`
	Cancels       uint64 `json:"cancels"`
	ErrorHits     uint64 `json:"error_hits"`
	Releases      uint64 `json:"releases"`
	ReleasePanics uint64 `json:"release_panics"`
	Offers        uint64 `json:"offers"`
	Evictions     uint64 `json:"evictions"`
	IdleRemovals  uint64 `json:"idle_removals"`
	RoomWaits     uint64 `json:"room_waits"`
	Room          int64  `json:"room"`
	Live          int64  `json:"live"`
	Ready         int64  `json:"ready"`
	Lingering     int64  `json:"lingering"`

	CreateLatency map[string]histJSON `json:"create_latency"` // by outcome
	RoomWait      histJSON            `json:"room_wait"`
}

// histJSON summarises an epcache.Histogram. A percentile is the upper
// bound of the bucket that holds it; nil when nothing was counted or when
// it lies in the last bucket, which has no bound.
type histJSON struct {
	Count       uint64   `json:"count"`
	SumSeconds  float64  `json:"sum_seconds"`
	MeanSeconds float64  `json:"mean_seconds"`
	P50Seconds  *float64 `json:"p50_seconds"`
	P90Seconds  *float64 `json:"p90_seconds"`
	P99Seconds  *float64 `json:"p99_seconds"`
}

type peersJSON struct {
	Total   int            `json:"total"`    // peers the walk saw
	ByState map[string]int `json:"by_state"` // of them, in each state
	Leases  int            `json:"leases"`   // leases held, over the walk
	Waiting int            `json:"waiting"`  // callers waiting for creations, over the walk
	Matched int            `json:"matched"`  // peers the state and key filters kept
	Offset  int            `json:"offset"`
	Shown   int            `json:"shown"`
	Items   []peerJSON     `json:"items"`
}

type peerJSON struct {
	Key            string    `json:"key"`
	State          string    `json:"state"`
	Since          time.Time `json:"since,omitzero"`
	AgeSeconds     float64   `json:"age_seconds,omitempty"`
	IdleSeconds    float64   `json:"idle_seconds,omitempty"`
	Leases         int       `json:"leases,omitempty"`
	Waiting        int       `json:"waiting,omitempty"`
	Error          string    `json:"error,omitempty"`
	Until          time.Time `json:"until,omitzero"`
	ExpiresSeconds float64   `json:"expires_seconds,omitempty"` // until Until
}

// ServeHTTP answers GET and HEAD with the page: HTML, or JSON with
// format=json. See the package doc for the query.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "debugpage: "+r.Method+": only GET and HEAD", http.StatusMethodNotAllowed)
		return
	}
	q, err := parseQuery(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sources := h.sources.All()
	if q.cache != "" {
		i := slices.IndexFunc(sources, func(s *source) bool { return s.name == q.cache })
		if i < 0 {
			http.Error(w, fmt.Sprintf("debugpage: cache=%q: no source has that name", q.cache), http.StatusNotFound)
			return
		}
		sources = sources[i : i+1]
	}
	now := time.Now()
	p := pageJSON{Time: now, Sort: "state", Order: "desc", States: q.named, Key: q.key, Offset: q.offset, Limit: q.limit, Sources: []sourceJSON{}}
	if q.byAge {
		p.Sort = "age"
	}
	if q.asc {
		p.Order = "asc"
	}
	for _, s := range sources {
		p.Sources = append(p.Sources, s.read(q, now))
	}
	var buf bytes.Buffer
	if q.json {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		err = enc.Encode(p)
	} else {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		err = pageTemplate.Execute(&buf, newView(q, &p))
	}
	if err != nil {
		http.Error(w, "debugpage: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}

// read returns what the page shows of s. A panic in a function the
// caller registered (or in a key's String method, an error's Error) is
// shown as the source's error, not the request's end.
func (s *source) read(q *query, now time.Time) (out sourceJSON) {
	out.Name = s.name
	defer func() {
		if r := recover(); r != nil {
			out = sourceJSON{Name: s.name, Error: fmt.Sprintf("panic: %v", r)}
		}
	}()
	if s.stats != nil {
		st := s.stats()
		out.Stats = statsOf(&st)
	}
	if s.peers != nil {
		out.Peers = s.peers.list(q, now)
	}
	if s.counters != nil {
		out.Counters = s.counters()
	}
	return out
}

func statsOf(st *epcache.Stats) *statsJSON {
	j := &statsJSON{
		Creates: st.Creates, CreateErrors: st.CreateErrors, Attempts: st.Attempts, Waits: st.Waits,
		Cancels: st.Cancels, ErrorHits: st.ErrorHits, Releases: st.Releases, ReleasePanics: st.ReleasePanics,
		Offers: st.Offers, Evictions: st.Evictions, IdleRemovals: st.IdleRemovals, RoomWaits: st.RoomWaits,
		Room: st.Room, Live: st.Live, Ready: st.Ready, Lingering: st.Lingering,
		CreateLatency: map[string]histJSON{},
		RoomWait:      histOf(&st.RoomWait),
	}
	for o := range epcache.NumOutcomes {
		j.CreateLatency[o.String()] = histOf(&st.CreateLatency[o])
	}
	return j
}

func histOf(h *epcache.Histogram) histJSON {
	j := histJSON{Count: h.Count(), SumSeconds: h.Sum.Seconds()}
	if j.Count == 0 {
		return j
	}
	j.MeanSeconds = j.SumSeconds / float64(j.Count)
	quantile := func(q float64) *float64 {
		d := h.Quantile(q)
		if d == math.MaxInt64 { // the last bucket: no bound
			return nil
		}
		s := d.Seconds()
		return &s
	}
	j.P50Seconds, j.P90Seconds, j.P99Seconds = quantile(0.5), quantile(0.9), quantile(0.99)
	return j
}
