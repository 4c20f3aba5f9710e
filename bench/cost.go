package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Cost is a model of what creating one endpoint costs.
type Cost struct {
	kind   string // "none", "sleep", "spin", "lognormal"
	d      time.Duration
	median time.Duration
	sigma  float64
}

// ParseCost reads a cost model: "none"; "sleep:D" (time.Sleep, ctx-aware);
// "spin:D" (a busy loop: microsecond costs that a sleep cannot model, at the
// price of a core); "lognormal:MEDIAN:SIGMA" (sleeps drawn from a log-normal
// distribution: lognormal:500us:1.5 has a sub-millisecond median, a p99 near
// 16 ms and a p999 near 50 ms, the heavy tail of endpoint creation reported
// in UCX #1009). D and MEDIAN are Go durations.
func ParseCost(s string) (Cost, error) {
	kind, arg, _ := strings.Cut(s, ":")
	switch kind {
	case "none":
		if arg != "" {
			return Cost{}, fmt.Errorf("bench: cost %q: none takes no argument", s)
		}
		return Cost{kind: kind}, nil
	case "sleep", "spin":
		d, err := time.ParseDuration(arg)
		if err != nil || d <= 0 {
			return Cost{}, fmt.Errorf("bench: cost %q: want %s:DURATION with a positive Go duration, such as %s:1ms", s, kind, kind)
		}
		return Cost{kind: kind, d: d}, nil
	case "lognormal":
		m, sg, ok := strings.Cut(arg, ":")
		median, err1 := time.ParseDuration(m)
		sigma, err2 := strconv.ParseFloat(sg, 64)
		if !ok || err1 != nil || err2 != nil || median <= 0 || sigma <= 0 || math.IsInf(sigma, 0) {
			return Cost{}, fmt.Errorf("bench: cost %q: want lognormal:MEDIAN:SIGMA, such as lognormal:500us:1.5", s)
		}
		return Cost{kind: kind, median: median, sigma: sigma}, nil
	}
	return Cost{}, fmt.Errorf("bench: cost %q: want none, sleep:D, spin:D or lognormal:MEDIAN:SIGMA", s)
}

// MustCost is ParseCost for constants; it panics on a bad model.
func MustCost(s string) Cost {
	c, err := ParseCost(s)
	if err != nil {
		panic(err)
	}
	return c
}

func (c Cost) String() string {
	switch c.kind {
	case "sleep", "spin":
		return c.kind + ":" + c.d.String()
	case "lognormal":
		return "lognormal:" + c.median.String() + ":" + strconv.FormatFloat(c.sigma, 'g', -1, 64)
	}
	return "none"
}

// Pay spends one creation's cost. A sleep ends early, with ctx's error, if
// ctx ends; a spin does not look at ctx.
func (c Cost) Pay(ctx context.Context) error {
	var d time.Duration
	switch c.kind {
	case "none", "":
		return nil
	case "spin":
		for start := time.Now(); time.Since(start) < c.d; {
		}
		return nil
	case "sleep":
		d = c.d
	case "lognormal":
		d = time.Duration(float64(c.median) * math.Exp(c.sigma*rand.NormFloat64()))
	}
	return delay(ctx, d)
}
