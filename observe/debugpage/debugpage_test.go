package debugpage_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/observe/debugpage"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type conn struct{ key int }

var errDown = errors.New("peer down")

// goGet starts a Get of key and returns where its error will come.
func goGet[K comparable, V any](c *epcache.Cache[K, V], ctx context.Context, key K) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, key)
		done <- err
	}()
	return done
}

// states is a cache, made inside a synctest bubble, with a peer in each
// state: key 1 ready (its Create took 3ms) and leased, 2 creating with
// three callers waiting, 3 failed (remembered for an hour), 4 lingering (a
// lease holds it after Invalidate), 5 straggling (an Offer answered its
// creation, then it was invalidated), all at start+3ms; then, a second
// later, 6 ready and unused; then 30 seconds pass.
type states struct {
	c     *epcache.Cache[int, *conn]
	start time.Time
	end   func() // lets every creation return, ends the leases, closes the cache
}

func newStates(t *testing.T) *states {
	t.Helper()
	proceed := make(chan struct{})
	c, err := epcache.New(epcache.Config[int, *conn]{
		MaxEntries:  10,
		IdleTimeout: time.Minute,
		ErrorTTL:    time.Hour,
		Create: func(_ context.Context, k int) (*conn, error) {
			switch k {
			case 1:
				time.Sleep(3 * time.Millisecond)
			case 2, 5:
				<-proceed
			case 3:
				return nil, errDown
			}
			return &conn{k}, nil
		},
	})
	require.NoError(t, err)
	bg := context.Background()
	s := &states{c: c, start: time.Now()}
	_, err = c.Get(bg, 1)
	require.NoError(t, err)
	lease1, err := c.Acquire(bg, 1)
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(bg)
	creating := []<-chan error{goGet(c, cctx, 2)}
	synctest.Wait()
	creating = append(creating, goGet(c, bg, 2), goGet(c, bg, 2))
	_, err = c.Get(bg, 3)
	require.ErrorIs(t, err, errDown)
	lease4, err := c.Acquire(bg, 4)
	require.NoError(t, err)
	require.True(t, c.Invalidate(4))
	straggling := goGet(c, cctx, 5)
	synctest.Wait()
	require.True(t, c.Offer(5, &conn{5}))
	require.NoError(t, <-straggling)
	require.True(t, c.Invalidate(5))
	time.Sleep(time.Second)
	_, err = c.Get(bg, 6)
	require.NoError(t, err)
	synctest.Wait()
	time.Sleep(30 * time.Second)
	synctest.Wait()
	s.end = func() {
		lease1.Release()
		lease4.Release()
		close(proceed)
		for _, done := range creating {
			require.NoError(t, <-done)
		}
		cancel()
		require.NoError(t, c.Close())
	}
	return s
}

// The page shows each peer in the state the test put it in, with what an
// operator asks of each state, and the cache's totals as Stats has them,
// latency percentiles included; the HTML page shows the same.
func TestPageShowsEachPeerInItsState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStates(t)
		defer s.end()
		h := debugpage.New()
		require.NoError(t, debugpage.Add(h, "endpoints", s.c))

		p := getJSON(t, h, "")
		assert.True(t, time.Now().Equal(p.Time), "%v", p.Time)
		assert.Equal(t, "state", p.Sort)
		assert.Equal(t, "desc", p.Order)
		assert.Equal(t, debugpage.DefaultPageSize, p.Limit)
		require.Len(t, p.Sources, 1)
		src := p.Sources[0]
		assert.Equal(t, "endpoints", src.Name)
		assert.Empty(t, src.Error)
		require.NotNil(t, src.Peers)
		ps := src.Peers
		assert.Equal(t, 6, ps.Total)
		assert.Equal(t, 6, ps.Matched)
		assert.Equal(t, 6, ps.Shown)
		assert.Equal(t, map[string]int{"ready": 2, "creating": 1, "failed": 1, "straggling": 1, "lingering": 1}, ps.ByState)
		assert.Equal(t, 2, ps.Leases, "key 1's and key 4's")
		assert.Equal(t, 3, ps.Waiting)

		// By state, descending: lingering, straggling, failed, creating,
		// then the ready ones, oldest first.
		assert.Equal(t, []string{"4", "5", "3", "2", "1", "6"}, keysOf(ps))
		at := s.start.Add(3 * time.Millisecond) // when everything after key 1's Create happened
		byKey := map[string]peer{}
		for _, it := range ps.Items {
			byKey[it.Key] = it
		}
		ready := byKey["1"]
		assert.Equal(t, "ready", ready.State)
		assert.True(t, at.Equal(ready.Since), "published when its Create returned: %v", ready.Since)
		assert.Equal(t, 31.0, ready.AgeSeconds)
		assert.Equal(t, 1, ready.Leases)
		assert.Zero(t, ready.IdleSeconds, "leased: never idle")
		assert.Positive(t, byKey["6"].IdleSeconds, "unused for two sweeps")
		creating := byKey["2"]
		assert.Equal(t, "creating", creating.State)
		assert.Equal(t, 3, creating.Waiting)
		assert.Equal(t, 31.0, creating.AgeSeconds)
		failed := byKey["3"]
		assert.Equal(t, "failed", failed.State)
		assert.Equal(t, "peer down", failed.Error)
		assert.True(t, at.Add(time.Hour).Equal(failed.Until), "%v", failed.Until)
		assert.Equal(t, (time.Hour - 31*time.Second).Seconds(), failed.ExpiresSeconds)
		assert.Equal(t, "lingering", byKey["4"].State)
		assert.Equal(t, 1, byKey["4"].Leases)
		assert.Equal(t, 31.0, byKey["4"].AgeSeconds, "given up 31 s ago")
		assert.Equal(t, "straggling", byKey["5"].State)

		// The totals are Stats'.
		want := s.c.Stats()
		st := src.Stats
		require.NotNil(t, st)
		assert.Equal(t, stats{
			Creates: want.Creates, CreateErrors: want.CreateErrors, Attempts: want.Attempts, Waits: want.Waits,
			Cancels: want.Cancels, ErrorHits: want.ErrorHits, Releases: want.Releases, ReleasePanics: want.ReleasePanics,
			Offers: want.Offers, Evictions: want.Evictions, IdleRemovals: want.IdleRemovals, RoomWaits: want.RoomWaits,
			Room: want.Room, Live: want.Live, Ready: want.Ready, Lingering: want.Lingering,
			CreateLatency: st.CreateLatency, RoomWait: st.RoomWait,
		}, *st)
		assert.Equal(t, uint64(3), st.Creates, "keys 1, 4 and 6")
		assert.Equal(t, uint64(1), st.CreateErrors, "key 3")
		assert.Equal(t, uint64(1), st.Offers)
		assert.Equal(t, int64(2), st.Ready)
		assert.Equal(t, int64(1), st.Lingering)
		// Values: 3ms (key 1) and twice 0 (keys 4 and 6, created at once
		// in the bubble): the median in the first bucket, the 90th in
		// 2^12 µs's.
		value := st.CreateLatency["value"]
		assert.Equal(t, uint64(3), value.Count)
		assert.InDelta(t, 0.003, value.SumSeconds, 1e-12)
		assert.InDelta(t, 0.001, value.MeanSeconds, 1e-12)
		require.NotNil(t, value.P50Seconds)
		assert.Equal(t, 1e-6, *value.P50Seconds)
		require.NotNil(t, value.P90Seconds)
		assert.Equal(t, 4096e-6, *value.P90Seconds)
		assert.Equal(t, uint64(1), st.CreateLatency["error"].Count)
		assert.Zero(t, st.CreateLatency["offered"].Count, "key 5's Create has not returned")
		assert.Nil(t, st.CreateLatency["offered"].P50Seconds, "nothing counted: no percentile")
		assert.Len(t, st.CreateLatency, int(epcache.NumOutcomes))

		html := getHTML(t, h, "")
		for _, state := range []string{"ready", "creating", "failed", "straggling", "lingering"} {
			assert.Contains(t, html, `<tr class="peer `+state+`">`, "a row of state %s", state)
		}
		assert.Contains(t, html, "peer down (forgotten in 59m29s)")
		assert.Contains(t, html, "showing 1–6 of 6")
		assert.Contains(t, html, "<td>create: value</td><td class=\"num\">3</td><td class=\"num\">1ms</td><td class=\"num\">≤ 1µs</td><td class=\"num\">≤ 4.1ms</td>")
		assert.Contains(t, html, "leases held: 2 · callers waiting: 3")
	})
}

// An HTML page with two caches of different key types, one of them keyed
// by strings a person chose: both are shown, in name order, each key
// escaped; cache= shows one.
func TestPageShowsEveryCacheAndEscapesKeys(t *testing.T) {
	ints, err := epcache.New(epcache.Config[int, int]{Create: func(_ context.Context, k int) (int, error) { return k, nil }})
	require.NoError(t, err)
	defer ints.Close()
	strs, err := epcache.New(epcache.Config[string, int]{Create: func(context.Context, string) (int, error) { return 1, nil }})
	require.NoError(t, err)
	defer strs.Close()
	bg := context.Background()
	_, err = ints.Get(bg, 42)
	require.NoError(t, err)
	_, err = strs.Get(bg, `<script>alert("x")</script>`)
	require.NoError(t, err)

	h := debugpage.New()
	require.NoError(t, debugpage.Add(h, "b ints", ints))
	require.NoError(t, debugpage.Add(h, "a strings", strs))
	p := getJSON(t, h, "")
	require.Len(t, p.Sources, 2)
	assert.Equal(t, "a strings", p.Sources[0].Name)
	assert.Equal(t, []string{`<script>alert("x")</script>`}, keysOf(p.Sources[0].Peers))
	assert.Equal(t, []string{"42"}, keysOf(p.Sources[1].Peers))

	html := getHTML(t, h, "")
	assert.NotContains(t, html, "<script>")
	assert.Contains(t, html, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
	assert.Contains(t, html, `<a href="?cache=b&#43;ints">b ints</a>`)

	p = getJSON(t, h, "?cache=b+ints")
	require.Len(t, p.Sources, 1)
	assert.Equal(t, "b ints", p.Sources[0].Name)
	assert.Contains(t, getHTML(t, h, "?cache=b+ints"), `<a href="?">every source</a>`)
}

// The order of the rows: by state (lingering, straggling, failed,
// creating, ready, or the reverse) or by age (oldest or youngest first),
// ties oldest first; the state and key filters; pages of limit rows from
// offset.
func TestPageSortsFiltersAndPages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		proceed := make(chan struct{})
		c, err := epcache.New(epcache.Config[int, *conn]{
			MaxEntries: 100, // keeps when ready values were published
			ErrorTTL:   time.Hour,
			Create: func(_ context.Context, k int) (*conn, error) {
				switch {
				case k >= 20:
					<-proceed
				case k >= 10:
					return nil, errDown
				}
				return &conn{k}, nil
			},
		})
		require.NoError(t, err)
		bg := context.Background()
		var creating []<-chan error
		// One operation a second, in this order: every peer has an age
		// of its own.
		for _, k := range []int{0, 10, 20, 1, 11, 21, 2, 3} {
			time.Sleep(time.Second)
			switch {
			case k == 3:
				l, err := c.Acquire(bg, k)
				require.NoError(t, err)
				defer l.Release()
				require.True(t, c.Invalidate(k))
			case k >= 20:
				creating = append(creating, goGet(c, bg, k))
				synctest.Wait()
			default:
				_, err := c.Get(bg, k)
				if k >= 10 {
					require.ErrorIs(t, err, errDown)
				}
			}
		}
		defer func() {
			close(proceed)
			for _, done := range creating {
				require.NoError(t, <-done)
			}
			require.NoError(t, c.Close())
		}()
		time.Sleep(time.Second)
		h := debugpage.New()
		require.NoError(t, debugpage.Add(h, "c", c))

		for _, tc := range []struct {
			query string
			keys  []string
		}{
			{"", []string{"3", "10", "11", "20", "21", "0", "1", "2"}},
			{"?sort=state&order=desc", []string{"3", "10", "11", "20", "21", "0", "1", "2"}},
			{"?order=asc", []string{"0", "1", "2", "20", "21", "10", "11", "3"}},
			{"?sort=age", []string{"0", "10", "20", "1", "11", "21", "2", "3"}},
			{"?sort=age&order=asc", []string{"3", "2", "21", "11", "1", "20", "10", "0"}},
			{"?state=ready", []string{"0", "1", "2"}},
			{"?state=failed,creating&sort=age", []string{"10", "20", "11", "21"}},
			{"?key=11", []string{"11"}},
			{"?key=99", []string{}},
			{"?limit=3", []string{"3", "10", "11"}},
			{"?limit=3&offset=3", []string{"20", "21", "0"}},
			{"?limit=3&offset=6", []string{"1", "2"}},
			{"?limit=3&offset=9", []string{}},
			{"?sort=age&limit=2&offset=1", []string{"10", "20"}},
		} {
			p := getJSON(t, h, tc.query)
			ps := p.Sources[0].Peers
			assert.Equal(t, tc.keys, keysOf(ps), tc.query)
			assert.Equal(t, 8, ps.Total, tc.query)
			assert.Equal(t, len(ps.Items), ps.Shown, tc.query)
		}
		p := getJSON(t, h, "?state=failed,creating&limit=3")
		ps := p.Sources[0].Peers
		assert.Equal(t, 4, ps.Matched)
		assert.Equal(t, []string{"failed", "creating"}, p.States)
		ages := getJSON(t, h, "?state=ready").Sources[0].Peers.Items
		assert.Equal(t, []float64{8, 5, 2}, []float64{ages[0].AgeSeconds, ages[1].AgeSeconds, ages[2].AgeSeconds})

		html := getHTML(t, h, "?state=failed,creating&limit=3")
		assert.Contains(t, html, "showing 1–3 of 4 matching (8 peers in all)")
		assert.Contains(t, html, `<a href="?cache=c&amp;limit=3&amp;offset=3&amp;state=failed%2Ccreating">next →</a>`)
		html = getHTML(t, h, "?limit=3&offset=3")
		assert.Contains(t, html, `<a href="?cache=c&amp;limit=3&amp;offset=0">← previous</a>`)
		assert.Contains(t, html, `<a href="?cache=c&amp;limit=3&amp;offset=6">next →</a>`)
		assert.Contains(t, getHTML(t, h, "?key=99"), "no peer matches, of 8")
	})
}

// A cache of many peers: a page shows limit of them and says of how many,
// and no page reaches past MaxDepth.
func TestPageOfManyPeersShowsAPage(t *testing.T) {
	n := 2*debugpage.MaxDepth + 5_000 // past MaxDepth, so that the deepest page is full
	c, err := epcache.New(epcache.Config[int, int]{Create: func(_ context.Context, k int) (int, error) { return k, nil }})
	require.NoError(t, err)
	defer c.Close()
	for k := range n {
		_, err := c.Get(context.Background(), k)
		require.NoError(t, err)
	}
	h := debugpage.New()
	require.NoError(t, debugpage.Add(h, "many", c))

	ps := getJSON(t, h, "").Sources[0].Peers
	assert.Equal(t, n, ps.Total)
	assert.Equal(t, n, ps.Matched)
	assert.Len(t, ps.Items, debugpage.DefaultPageSize)
	assert.Contains(t, getHTML(t, h, ""), fmt.Sprintf("showing 1–100 of %d,000", n/1000))

	ps = getJSON(t, h, fmt.Sprintf("?limit=%d&offset=%d", debugpage.MaxPageSize, debugpage.MaxDepth-debugpage.MaxPageSize)).Sources[0].Peers
	assert.Len(t, ps.Items, debugpage.MaxPageSize)
	w := serve(h, fmt.Sprintf("?limit=%d&offset=%d", debugpage.MaxPageSize, debugpage.MaxDepth-debugpage.MaxPageSize+1))
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Contains(t, w.Body.String(), "reverse the order or filter")
	html := getHTML(t, h, fmt.Sprintf("?limit=%d&offset=%d", debugpage.MaxPageSize, debugpage.MaxDepth-debugpage.MaxPageSize))
	assert.Contains(t, html, "reaches 10,000 peers deep at most")
	assert.NotContains(t, html, "next →")
}

// A bad query gets 400 and a message that names the parameter; an unknown
// cache 404; a POST 405.
func TestBadQueriesAreRefusedWithAReason(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{Create: func(_ context.Context, k int) (int, error) { return k, nil }})
	require.NoError(t, err)
	defer c.Close()
	h := debugpage.New()
	require.NoError(t, debugpage.Add(h, "c", c))
	for _, tc := range []struct{ query, want string }{
		{"?format=xml", "format="},
		{"?state=ready,asleep", `"asleep" is not a state`},
		{"?sort=key", "sort="},
		{"?order=up", "order="},
		{"?limit=0", "limit="},
		{"?limit=1001", "limit="},
		{"?limit=ten", "limit="},
		{"?offset=-1", "offset="},
		{"?refresh=0", "refresh="},
	} {
		w := serve(h, tc.query)
		assert.Equal(t, http.StatusBadRequest, w.Code, tc.query)
		assert.Contains(t, w.Body.String(), tc.want, tc.query)
	}
	w := serve(h, "?cache=nope")
	assert.Equal(t, http.StatusNotFound, w.Code)
	assert.Contains(t, w.Body.String(), `cache="nope"`)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", nil))
	assert.Equal(t, http.StatusMethodNotAllowed, w.Code)
	assert.Equal(t, "GET, HEAD", w.Header().Get("Allow"))
}

// Registration refuses, with an error errors.Is can tell, a nil handler,
// cache or function, an empty or invalid name, a name taken and a cache
// registered twice; a refused registration changes nothing. Remove frees
// the name and the cache. The zero Handler works.
func TestRegistrationRefusesBadInput(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{Create: func(_ context.Context, k int) (int, error) { return k, nil }})
	require.NoError(t, err)
	defer c.Close()
	h := debugpage.New()
	statsOf := func() epcache.Stats { return epcache.Stats{} }
	counters := func() map[string]float64 { return nil }

	assert.ErrorIs(t, debugpage.Add(nil, "c", c), debugpage.ErrNil)
	assert.ErrorIs(t, debugpage.Add[int, int](h, "c", nil), debugpage.ErrNil)
	assert.ErrorIs(t, h.AddStats("s", nil), debugpage.ErrNil)
	assert.ErrorIs(t, h.AddCounters("s", nil), debugpage.ErrNil)
	assert.ErrorIs(t, h.AddSource("s", nil), debugpage.ErrNil)
	assert.ErrorIs(t, debugpage.Add(h, "", c), debugpage.ErrBadName)
	assert.ErrorIs(t, h.AddStats("\xff", statsOf), debugpage.ErrBadName)
	var nilHandler *debugpage.Handler
	assert.ErrorIs(t, nilHandler.AddCounters("x", counters), debugpage.ErrNil)
	assert.False(t, nilHandler.Remove("x"))

	require.NoError(t, debugpage.Add(h, "c", c))
	err = debugpage.Add(h, "c2", c)
	assert.ErrorIs(t, err, debugpage.ErrAlreadyAdded)
	assert.EqualError(t, err, `debugpage: already registered as "c"; not added as "c2"`)
	assert.ErrorIs(t, h.AddStats("c", statsOf), debugpage.ErrNameTaken)
	assert.ErrorIs(t, h.AddCounters("c", counters), debugpage.ErrNameTaken)
	require.NoError(t, h.AddCounters("n", counters))
	assert.ErrorIs(t, h.AddStats("n", statsOf), debugpage.ErrNameTaken)

	p := getJSON(t, h, "")
	assert.Len(t, p.Sources, 2, "the refused registrations added nothing")

	assert.True(t, h.Remove("c"))
	assert.False(t, h.Remove("c"))
	require.NoError(t, debugpage.Add(h, "c2", c), "removed: the cache may come back, under another name")
	require.NoError(t, h.AddStats("c", statsOf))

	var zero debugpage.Handler
	require.NoError(t, debugpage.Add(&zero, "c", c))
	assert.Len(t, getJSON(t, &zero, "").Sources, 1)
	assert.Contains(t, getHTML(t, debugpage.New(), ""), "No cache or counter source is registered.")
}

// panicky is an error whose Error panics: a bug of the caller's that the
// page shows rather than dies of.
type panicky struct{}

func (panicky) Error() string { panic("Error of a broken error") }

// A source whose function panics, or whose failed peer's error panics when
// printed, is shown with the panic as its error; the other sources and the
// page are unharmed.
func TestPanicsInSourcesAreShownNotFatal(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{
		ErrorTTL: time.Hour,
		Create:   func(context.Context, int) (int, error) { return 0, panicky{} },
	})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Get(context.Background(), 1)
	require.Error(t, err)
	h := debugpage.New()
	require.NoError(t, debugpage.Add(h, "broken error", c))
	require.NoError(t, h.AddStats("broken stats", func() epcache.Stats { panic("no stats today") }))
	require.NoError(t, h.AddCounters("broken counters", func() map[string]float64 { panic("no counters today") }))
	require.NoError(t, h.AddCounters("fine", func() map[string]float64 { return map[string]float64{"requests": 1234, "ratio": 0.5} }))

	p := getJSON(t, h, "")
	require.Len(t, p.Sources, 4)
	errs := map[string]string{}
	for _, s := range p.Sources {
		errs[s.Name] = s.Error
	}
	assert.Equal(t, map[string]string{
		"broken counters": "panic: no counters today",
		"broken error":    "panic: Error of a broken error",
		"broken stats":    "panic: no stats today",
		"fine":            "",
	}, errs)
	assert.Equal(t, map[string]float64{"requests": 1234, "ratio": 0.5}, p.Sources[3].Counters)
	html := getHTML(t, h, "")
	assert.Contains(t, html, `<p class="error">panic: no stats today</p>`)
	assert.Contains(t, html, "<dt>requests</dt><dd>1,234</dd>")
	assert.Contains(t, html, "<dt>ratio</dt><dd>0.5</dd>")
}

// gatedKey is a key whose String waits for its gate: a page that filters
// by key formats every key as it walks, so a test can hold the walk in
// the middle of the table.
type gatedKey struct {
	n    int
	gate chan struct{}
}

func (k gatedKey) String() string {
	<-k.gate
	return strconv.Itoa(k.n)
}

// Reading the page blocks neither hits nor creations: while a request's
// walk of the peers is held in the middle, a hit, a new creation, an
// Invalidate and a lease all go through; the page then answers.
func TestReadingThePageBlocksNoHitNorCreation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		c, err := epcache.New(epcache.Config[gatedKey, int]{
			MaxEntries: 100,
			Create:     func(_ context.Context, k gatedKey) (int, error) { return k.n, nil },
		})
		require.NoError(t, err)
		defer c.Close()
		bg := context.Background()
		for n := range 10 {
			_, err := c.Get(bg, gatedKey{n, gate})
			require.NoError(t, err)
		}
		h := debugpage.New()
		require.NoError(t, debugpage.Add(h, "gated", c))
		answered := make(chan page, 1)
		go func() { answered <- getJSON(t, h, "?key=3") }()
		synctest.Wait() // the walk waits on the first key's String

		v, ok := c.Load(gatedKey{5, gate})
		assert.True(t, ok)
		assert.Equal(t, 5, v)
		v, err = c.Get(bg, gatedKey{7, gate})
		require.NoError(t, err)
		assert.Equal(t, 7, v)
		v, err = c.Get(bg, gatedKey{11, gate})
		require.NoError(t, err, "a creation while the page walks")
		assert.Equal(t, 11, v)
		assert.True(t, c.Invalidate(gatedKey{2, gate}))
		l, err := c.Acquire(bg, gatedKey{4, gate})
		require.NoError(t, err)
		l.Release()
		select {
		case <-answered:
			t.Fatal("the page answered while its walk was held")
		default:
		}

		close(gate)
		p := <-answered
		assert.Equal(t, []string{"3"}, keysOf(p.Sources[0].Peers))
	})
}

// Requests, registrations and removals, and a cache's work, all at once:
// under -race, nothing races, and every request answers 200.
func TestPageUnderConcurrentUse(t *testing.T) {
	c, err := epcache.New(epcache.Config[int, int]{
		MaxEntries: 64,
		Create:     func(_ context.Context, k int) (int, error) { return k, nil },
	})
	require.NoError(t, err)
	defer c.Close()
	h := debugpage.New()
	require.NoError(t, debugpage.Add(h, "c", c))
	rounds := 200
	if testing.Short() {
		rounds = 50
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for i := range rounds * 10 {
				k := (i*7 + g) % 100
				l, err := c.Acquire(ctx, k)
				if !assert.NoError(t, err) {
					return
				}
				if i%3 == 0 {
					c.Invalidate(k)
				}
				l.Release()
			}
		})
	}
	wg.Go(func() {
		for i := range rounds {
			name := fmt.Sprintf("counters %d", i%4)
			h.Remove(name)
			assert.NoError(t, h.AddCounters(name, func() map[string]float64 { return map[string]float64{"i": float64(i)} }))
		}
	})
	for i := range rounds {
		q := []string{"?format=json", "", "?sort=age&state=ready,lingering", "?format=json&limit=5&offset=5"}[i%4]
		w := serve(h, q)
		require.Equal(t, http.StatusOK, w.Code, "%s: %s", q, w.Body)
	}
	wg.Wait()
}

// transport is a Source: a transport's totals and counters of its own.
// A pointer, so that registering it twice is refused.
type transport struct{ dialed float64 }

func (tr *transport) CacheStats() epcache.Stats { return epcache.Stats{Creates: 1} }
func (tr *transport) Counters() map[string]float64 {
	return map[string]float64{"Dialed": tr.dialed, "Open": 1}
}

// sourceFunc is a Source of a type == cannot compare.
type sourceFunc func() map[string]float64

func (f sourceFunc) CacheStats() epcache.Stats    { return epcache.Stats{} }
func (f sourceFunc) Counters() map[string]float64 { return f() }

// A Source shows its cache's totals and its counters, with no peers to
// walk; registering one twice is refused, unless its type cannot be
// compared.
func TestSourceShowsItsCountersAndCache(t *testing.T) {
	h := debugpage.New()
	tr := &transport{dialed: 3}
	require.NoError(t, h.AddSource("peer 0", tr))
	require.ErrorIs(t, h.AddSource("peer 0 again", tr), debugpage.ErrAlreadyAdded)
	f := sourceFunc(func() map[string]float64 { return map[string]float64{"calls": 2} })
	require.NoError(t, h.AddSource("f", f))
	require.NoError(t, h.AddSource("f again", f), "an incomparable source cannot be told from another")
	p := getJSON(t, h, "")
	require.Len(t, p.Sources, 3)
	src := p.Sources[2]
	assert.Equal(t, "peer 0", src.Name)
	assert.Nil(t, src.Peers, "a source's cache is out of reach: totals only")
	require.NotNil(t, src.Stats)
	assert.Equal(t, uint64(1), src.Stats.Creates)
	assert.Equal(t, map[string]float64{"Dialed": 3, "Open": 1}, src.Counters)
	assert.Equal(t, map[string]float64{"calls": 2}, p.Sources[0].Counters)
	html := getHTML(t, h, "")
	assert.Contains(t, html, "<dt>Dialed</dt><dd>3</dd>")
}

// A program serving the page links no transport: the page depends on no
// package of transport/ (transport/tcp's Source is Peer.DebugSource, in
// the transport).
func TestDependsOnNoTransport(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	require.NoError(t, err, "go list -deps: %s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/epcache/epcache/epcache", "the list is of this package's dependencies")
	for _, d := range deps {
		assert.False(t, strings.HasPrefix(d, "github.com/epcache/epcache/transport/"), "observe/debugpage depends on %s", d)
	}
}
