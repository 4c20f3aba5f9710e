package epcache

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"sync/atomic"
	"time"
)

// Outcome is how a creation ended, as Stats.CreateLatency counts it.
type Outcome int

const (
	OutcomeValue   Outcome = iota // Create returned a value, which was published
	OutcomeError                  // Create failed (after its retries), or Close ended it
	OutcomePanic                  // Create or Retry panicked, or Create called runtime.Goexit
	OutcomeTimeout                // CreateTimeout answered the callers before Create returned
	OutcomeOffered                // an Offer answered the callers before Create returned
	NumOutcomes                   // the number of outcomes
)

var outcomeNames = [NumOutcomes]string{"value", "error", "panic", "timeout", "offered"}

// String returns the outcome's name: value, error, panic, timeout, offered.
func (o Outcome) String() string {
	if o >= 0 && o < NumOutcomes {
		return outcomeNames[o]
	}
	return "invalid"
}

// HistogramBuckets is the number of buckets of a [Histogram]: upper bounds
// of 1µs, 2µs, 4µs … 2^26µs (about 67 s), then one without a bound. The
// range covers a local endpoint's creation (microseconds) to a dial that
// waits out a TCP timeout (seconds to a minute).
const HistogramBuckets = 28

// HistogramBound returns the upper bound of bucket i of a [Histogram]:
// 2^i microseconds, and the largest duration for the last bucket.
func HistogramBound(i int) time.Duration {
	if i >= HistogramBuckets-1 {
		return math.MaxInt64
	}
	return time.Microsecond << i
}

// Histogram is a distribution of durations in fixed exponential buckets:
// Counts[i] counts the durations no longer than HistogramBound(i) and
// longer than HistogramBound(i-1). It is what Stats reports; the cache
// records into it without a lock, one atomic add per bucket and one for
// Sum, when a creation or a wait for room ends, never on a hit.
type Histogram struct {
	Counts [HistogramBuckets]uint64
	Sum    time.Duration
}

// Count returns the number of durations counted.
func (h *Histogram) Count() uint64 {
	var n uint64
	for _, c := range h.Counts {
		n += c
	}
	return n
}

// Quantile returns the upper bound of the bucket that holds the q-th
// quantile (0 ≤ q ≤ 1) of the durations counted, or 0 if none was: an
// estimate within a factor of two.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.Count()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	var seen uint64
	for i, c := range h.Counts {
		if seen += c; seen >= max(rank, 1) {
			return HistogramBound(i)
		}
	}
	return HistogramBound(HistogramBuckets - 1)
}

// String returns the count, the sum and each bucket that counted
// something, by its upper bound: "n=15 sum=823µs [≤32µs:5 ≤64µs:6
// ≤128µs:4]", or "n=0". So a Stats printed with %v or %+v is read without
// a table of bounds.
func (h Histogram) String() string {
	n := h.Count()
	if n == 0 {
		return "n=0"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "n=%d sum=%v [", n, h.Sum)
	sep := ""
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		if i == HistogramBuckets-1 {
			fmt.Fprintf(&b, "%s>%v:%d", sep, HistogramBound(i-1), c)
		} else {
			fmt.Fprintf(&b, "%s≤%v:%d", sep, HistogramBound(i), c)
		}
		sep = " "
	}
	b.WriteString("]")
	return b.String()
}

// Latencies are histograms by how a creation ended: Latencies[OutcomeValue]
// is the creations that made a value, and so on.
type Latencies [NumOutcomes]Histogram

// String returns each outcome's histogram that counted something, by the
// outcome's name: "value: n=15 sum=… [...]; error: n=2 …", or "none".
func (l Latencies) String() string {
	var parts []string
	for o, h := range l {
		if h.Count() > 0 {
			parts = append(parts, Outcome(o).String()+": "+h.String())
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// histogram is the cache's side of a Histogram: atomic counters.
type histogram struct {
	counts [HistogramBuckets]atomic.Uint64
	sum    atomic.Int64
}

// bucketOf returns the bucket of a duration d: the first whose bound is no
// shorter than d.
func bucketOf(d time.Duration) int {
	us := (uint64(max(d, 0)) + uint64(time.Microsecond) - 1) / uint64(time.Microsecond) // rounded up
	if us <= 1 {
		return 0
	}
	return min(bits.Len64(us-1), HistogramBuckets-1)
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(d)].Add(1)
	h.sum.Add(int64(d))
}

func (h *histogram) snapshot() (s Histogram) {
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
	}
	s.Sum = time.Duration(h.sum.Load())
	return s
}

// latencies are a cache's histograms. Creations and waits for room are
// slow paths (a Create is a dial), so one set serves every creation: its
// lines move between cores only as often as creations end.
type latencies struct {
	create [NumOutcomes]histogram
	room   histogram
}
