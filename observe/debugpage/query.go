package debugpage

import (
	"cmp"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/epcache/epcache/epcache"
)

// Page sizes: how many peers of one cache a page shows, and how deep into
// an order a page may reach. A page keeps offset+limit peers per cache
// while it walks (a bounded heap), not every peer: MaxDepth bounds what a
// request for a cache of a million peers holds at once.
const (
	DefaultPageSize = 100    // peers per cache when the query gives no limit
	MaxPageSize     = 1000   // the largest limit
	MaxDepth        = 10_000 // the largest offset+limit
)

// numStates is the number of peer states, PeerReady to PeerLingering.
const numStates = int(epcache.PeerLingering) + 1

// query is what a request asks for, checked.
type query struct {
	json    bool
	cache   string
	states  [numStates]bool // the states shown; all when none was named
	named   []string        // the states named, as given
	key     string
	byAge   bool // sort=age; otherwise by state
	asc     bool // order=asc; otherwise desc
	offset  int
	limit   int
	refresh int
}

// parseQuery checks a request's query; its error names the parameter.
func parseQuery(v url.Values) (*query, error) {
	q := &query{limit: DefaultPageSize, cache: v.Get("cache"), key: v.Get("key")}
	switch f := v.Get("format"); f {
	case "", "html":
	case "json":
		q.json = true
	default:
		return nil, fmt.Errorf("debugpage: format=%q: want html or json", f)
	}
	if s := v.Get("state"); s != "" {
		for name := range strings.SplitSeq(s, ",") {
			st, ok := parseState(strings.TrimSpace(name))
			if !ok {
				return nil, fmt.Errorf("debugpage: state=%q: %q is not a state; want some of %s", s, name, stateNames())
			}
			q.states[st] = true
			q.named = append(q.named, st.String())
		}
	} else {
		for i := range q.states {
			q.states[i] = true
		}
	}
	switch s := v.Get("sort"); s {
	case "", "state":
	case "age":
		q.byAge = true
	default:
		return nil, fmt.Errorf("debugpage: sort=%q: want state or age", s)
	}
	switch o := v.Get("order"); o {
	case "", "desc":
	case "asc":
		q.asc = true
	default:
		return nil, fmt.Errorf("debugpage: order=%q: want desc or asc", o)
	}
	var err error
	if q.limit, err = intParam(v, "limit", DefaultPageSize, 1, MaxPageSize); err != nil {
		return nil, err
	}
	if q.offset, err = intParam(v, "offset", 0, 0, MaxDepth-1); err != nil {
		return nil, err
	}
	if q.offset+q.limit > MaxDepth {
		return nil, fmt.Errorf("debugpage: offset=%d with limit=%d reaches past the %d peers a page may reach; reverse the order or filter by state or key", q.offset, q.limit, MaxDepth)
	}
	if q.refresh, err = intParam(v, "refresh", 0, 1, 3600); err != nil {
		return nil, err
	}
	return q, nil
}

// intParam returns the integer parameter name, def if absent.
func intParam(v url.Values, name string, def, lo, hi int) (int, error) {
	s := v.Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("debugpage: %s=%q: want an integer from %d to %d", name, s, lo, hi)
	}
	return n, nil
}

func parseState(name string) (epcache.PeerState, bool) {
	for st := range epcache.PeerState(numStates) {
		if st.String() == name {
			return st, true
		}
	}
	return 0, false
}

func stateNames() string {
	names := make([]string, numStates)
	for i := range names {
		names[i] = epcache.PeerState(i).String()
	}
	return strings.Join(names, ", ")
}

// compare orders two peers as the page shows them: negative if a comes
// first. By state, desc puts the later states (lingering … creating)
// before ready; by age, desc puts the oldest first. Ties go oldest first.
// A zero since (a ready value's, without MaxEntries) counts as age 0.
func (q *query) compare(as epcache.PeerState, asince time.Time, bs epcache.PeerState, bsince time.Time) int {
	byState := cmp.Compare(as, bs)
	oldest := compareSince(asince, bsince)
	if q.byAge {
		if q.asc {
			oldest = -oldest
		}
		return cmp.Or(oldest, byState)
	}
	if !q.asc {
		byState = -byState
	}
	return cmp.Or(byState, oldest)
}

// compareSince is negative if a began before b; a zero time is the latest.
func compareSince(a, b time.Time) int {
	switch {
	case a.IsZero() && b.IsZero():
		return 0
	case a.IsZero():
		return 1
	case b.IsZero():
		return -1
	}
	return a.Compare(b)
}

// values returns the query's parameters, those left at their defaults out:
// the base of the page's links.
func (q *query) values() url.Values {
	v := url.Values{}
	if q.cache != "" {
		v.Set("cache", q.cache)
	}
	if len(q.named) > 0 {
		v.Set("state", strings.Join(q.named, ","))
	}
	if q.key != "" {
		v.Set("key", q.key)
	}
	if q.byAge {
		v.Set("sort", "age")
	}
	if q.asc {
		v.Set("order", "asc")
	}
	if q.limit != DefaultPageSize {
		v.Set("limit", strconv.Itoa(q.limit))
	}
	if q.offset != 0 {
		v.Set("offset", strconv.Itoa(q.offset))
	}
	if q.refresh != 0 {
		v.Set("refresh", strconv.Itoa(q.refresh))
	}
	return v
}

// link returns a link to this page with the query changed by set: a
// parameter set to "" is removed. Every link of a source's section names
// the source, and starts at the first page unless set says otherwise.
func (q *query) link(cache string, set ...string) string {
	v := q.values()
	v.Set("cache", cache)
	v.Del("offset")
	for i := 0; i+1 < len(set); i += 2 {
		if set[i+1] == "" {
			v.Del(set[i])
		} else {
			v.Set(set[i], set[i+1])
		}
	}
	return "?" + v.Encode()
}
