package debugpage

import (
	_ "embed"
	"fmt"
	"html/template"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/epcache/epcache/epcache"
)

//go:embed page.html
var pageHTML string

// pageTemplate is the HTML page: no script, every control a link or a GET
// form on the same path.
var pageTemplate = template.Must(template.New("page").Parse(pageHTML))

// view is what the HTML template shows: the JSON page, with its figures
// formatted and its links made.
type view struct {
	Time        string
	Refresh     int
	RefreshURLs []choice
	JSONURL     string
	AllURL      string // the page of every source, when one is selected
	Sources     []sourceView
}

type sourceView struct {
	ID, Name, Error string
	SelfURL         string
	Figures         []figure
	Latency         []latencyRow
	Peers           *peersView
	Counters        []figure
}

type figure struct{ Name, Value, Help string }

type latencyRow struct{ Name, Count, Mean, P50, P90, P99 string }

type peersView struct {
	Cache        string // the source's name, for the form
	Refresh      int
	StateLinks   []choice
	AllStatesURL string
	Leases       string
	Waiting      string
	Showing      string
	More         string // why there is no next page, when peers remain
	StateOptions []choice
	Key          string
	ByAge, Asc   bool
	Limit        int
	SortStateURL string
	SortAgeURL   string
	Arrow        string // on the column sorted by
	Rows         []rowView
	Prev, Next   string
}

type choice struct {
	Name  string
	Count string
	URL   string
	On    bool
}

type rowView struct{ Key, State, Age, Idle, Leases, Waiting, Detail string }

// figureHelp says what each total means, in the order the page shows them.
var figureHelp = []struct{ name, help string }{
	{"creates", "creations that produced a value"},
	{"create errors", "creations whose callers got an error (after retries), panics and timeouts included"},
	{"attempts", "calls of Create, retries included"},
	{"waits", "Gets that waited on a creation another Get started"},
	{"cancels", "waiting Gets that left because their own context ended"},
	{"error hits", "Gets answered with a remembered failure (ErrorTTL) or a timed-out creation still running"},
	{"releases", "values given up and released"},
	{"release panics", "Release calls that panicked"},
	{"offers", "values stored by Offer"},
	{"evictions", "values removed to make room under MaxEntries"},
	{"idle removals", "values removed by IdleTimeout"},
	{"room waits", "creations that found no room under MaxEntries and waited"},
	{"room", "room taken under MaxEntries now: values not yet released plus creations running"},
	{"live", "values created or offered and not yet released"},
	{"ready", "values the cache holds now"},
	{"lingering", "values given up that leases still hold: a lease never released stays here"},
}

func newView(q *query, p *pageJSON) *view {
	v := &view{Time: p.Time.Format(time.RFC3339), Refresh: q.refresh}
	base := q.values()
	base.Del("offset")
	jv := q.values()
	jv.Set("format", "json")
	v.JSONURL = "?" + jv.Encode()
	if q.cache != "" {
		all := q.values()
		all.Del("cache")
		all.Del("offset")
		v.AllURL = "?" + all.Encode()
	}
	for _, s := range []int{0, 2, 10} {
		r := q.values()
		name := "off"
		if s == 0 {
			r.Del("refresh")
		} else {
			r.Set("refresh", strconv.Itoa(s))
			name = strconv.Itoa(s) + "s"
		}
		v.RefreshURLs = append(v.RefreshURLs, choice{Name: name, URL: "?" + r.Encode(), On: s == q.refresh})
	}
	for i, s := range p.Sources {
		sv := sourceView{ID: fmt.Sprintf("source-%d", i), Name: s.Name, Error: s.Error, SelfURL: q.link(s.Name)}
		if st := s.Stats; st != nil {
			values := []int64{int64(st.Creates), int64(st.CreateErrors), int64(st.Attempts), int64(st.Waits),
				int64(st.Cancels), int64(st.ErrorHits), int64(st.Releases), int64(st.ReleasePanics),
				int64(st.Offers), int64(st.Evictions), int64(st.IdleRemovals), int64(st.RoomWaits),
				st.Room, st.Live, st.Ready, st.Lingering}
			for i, f := range figureHelp {
				sv.Figures = append(sv.Figures, figure{Name: f.name, Value: thousands(values[i]), Help: f.help})
			}
			for o := range epcache.NumOutcomes {
				sv.Latency = append(sv.Latency, latencyOf("create: "+o.String(), st.CreateLatency[o.String()]))
			}
			sv.Latency = append(sv.Latency, latencyOf("wait for room", st.RoomWait))
		}
		if s.Peers != nil {
			sv.Peers = peersViewOf(q, s.Name, s.Peers)
		}
		for _, name := range slices.Sorted(maps.Keys(s.Counters)) {
			sv.Counters = append(sv.Counters, figure{Name: name, Value: number(s.Counters[name])})
		}
		v.Sources = append(v.Sources, sv)
	}
	return v
}

func latencyOf(name string, h histJSON) latencyRow {
	r := latencyRow{Name: name, Count: thousands(int64(h.Count)), Mean: "–", P50: "–", P90: "–", P99: "–"}
	if h.Count == 0 {
		return r
	}
	r.Mean = seconds(h.MeanSeconds)
	bound := func(p *float64) string {
		if p == nil {
			return "> " + seconds(epcache.HistogramBound(epcache.HistogramBuckets-2).Seconds())
		}
		return "≤ " + seconds(*p)
	}
	r.P50, r.P90, r.P99 = bound(h.P50Seconds), bound(h.P90Seconds), bound(h.P99Seconds)
	return r
}

func peersViewOf(q *query, name string, p *peersJSON) *peersView {
	pv := &peersView{
		Cache:        name,
		Refresh:      q.refresh,
		AllStatesURL: q.link(name, "state", ""),
		Leases:       thousands(int64(p.Leases)),
		Waiting:      thousands(int64(p.Waiting)),
		Key:          q.key,
		ByAge:        q.byAge,
		Asc:          q.asc,
		Limit:        q.limit,
	}
	for st := range epcache.PeerState(numStates) {
		s := st.String()
		on := len(q.named) > 0 && q.states[st]
		pv.StateLinks = append(pv.StateLinks, choice{Name: s, Count: thousands(int64(p.ByState[s])), URL: q.link(name, "state", s), On: on})
		pv.StateOptions = append(pv.StateOptions, choice{Name: s, On: on && len(q.named) == 1})
	}
	// A column's link sorts by it, descending first; again, ascending.
	toggle := func(byAge bool) string {
		order := "desc"
		if q.byAge == byAge && !q.asc {
			order = "asc"
		}
		sort := "state"
		if byAge {
			sort = "age"
		}
		return q.link(name, "sort", sort, "order", order)
	}
	pv.SortStateURL, pv.SortAgeURL = toggle(false), toggle(true)
	pv.Arrow = "↓"
	if q.asc {
		pv.Arrow = "↑"
	}
	switch {
	case p.Matched == 0 && p.Total == 0:
		pv.Showing = "no peers"
	case p.Matched == 0:
		pv.Showing = fmt.Sprintf("no peer matches, of %s", thousands(int64(p.Total)))
	case p.Shown == 0:
		pv.Showing = fmt.Sprintf("none shown past %s of %s matching", thousands(int64(p.Offset)), thousands(int64(p.Matched)))
	default:
		pv.Showing = fmt.Sprintf("showing %s–%s of %s", thousands(int64(p.Offset+1)), thousands(int64(p.Offset+p.Shown)), thousands(int64(p.Matched)))
		if p.Matched != p.Total {
			pv.Showing += fmt.Sprintf(" matching (%s peers in all)", thousands(int64(p.Total)))
		}
	}
	if p.Offset > 0 {
		pv.Prev = q.link(name, "offset", strconv.Itoa(max(p.Offset-q.limit, 0)))
	}
	if next := p.Offset + q.limit; next < p.Matched {
		if next+q.limit <= MaxDepth {
			pv.Next = q.link(name, "offset", strconv.Itoa(next))
		} else {
			pv.More = fmt.Sprintf("a page reaches %s peers deep at most: reverse the order or filter to see the rest", thousands(MaxDepth))
		}
	}
	for _, r := range p.Items {
		rv := rowView{Key: r.Key, State: r.State, Age: "–", Idle: "–", Leases: "–", Waiting: "–"}
		if !r.Since.IsZero() {
			rv.Age = seconds(r.AgeSeconds)
		}
		if r.IdleSeconds > 0 {
			rv.Idle = seconds(r.IdleSeconds)
		}
		switch r.State {
		case "ready", "lingering":
			rv.Leases = strconv.Itoa(r.Leases)
		case "creating":
			rv.Waiting = strconv.Itoa(r.Waiting)
		}
		switch {
		case r.Error != "" && !r.Until.IsZero():
			rv.Detail = fmt.Sprintf("%s (forgotten in %s)", r.Error, seconds(max(r.ExpiresSeconds, 0)))
		case r.Error != "":
			rv.Detail = r.Error + " (its Create still runs)"
		case r.State == "straggling":
			rv.Detail = "answered by an Offer; its Create still runs"
		case r.State == "lingering":
			rv.Detail = "given up; released when its last lease ends"
		}
		pv.Rows = append(pv.Rows, rv)
	}
	return pv
}

// seconds formats a duration in seconds for a person: three significant
// digits, in µs, ms or s, and as hours, minutes and seconds past a minute.
func seconds(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 1e-3:
		return digits3(s*1e6) + "µs"
	case s < 1:
		return digits3(s*1e3) + "ms"
	case s < 60:
		return digits3(s) + "s"
	case s < math.MaxInt64/1e9:
		return time.Duration(s * 1e9).Round(time.Second).String()
	}
	return strconv.FormatFloat(s, 'g', 3, 64) + "s"
}

// digits3 formats x (0 < x < 1000) with about three significant digits,
// trailing zeros dropped: 4.1, 12.5, 512.
func digits3(x float64) string {
	decimals := 2
	switch {
	case x >= 100:
		decimals = 0
	case x >= 10:
		decimals = 1
	}
	s := strconv.FormatFloat(x, 'f', decimals, 64)
	if decimals > 0 {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// thousands formats n with commas between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var b []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, c)
	}
	if neg {
		return "-" + string(b)
	}
	return string(b)
}

// number formats a counter: an integer with commas, or a float.
func number(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return thousands(int64(f))
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
