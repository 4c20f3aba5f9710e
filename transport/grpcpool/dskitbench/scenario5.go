package dskitbench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// DeadMember is scenario 5: callers keep calling an address that refuses
// connections (a member that died) for d, each call bounded by 100 ms, and
// the TCP connect attempts it receives per second are counted, with and
// without ErrorTTL (epcache), and for dskit keeping its client (gRPC's own
// reconnect backoff) or removing it on every Unavailable.
func DeadMember(callers int, d time.Duration) (*Table, error) {
	t := newTable("5", fmt.Sprintf("dead member: connect attempts per second to an address that refuses, %d callers for %v", callers, d),
		"calls/s", "connects/s", "pool dials/s", "first error")
	for _, v := range []struct {
		name string
		o    Options
	}{
		{"epcache, no ErrorTTL", Options{}},
		{"epcache, ErrorTTL 250ms", Options{ErrorTTL: 250 * time.Millisecond}},
		{"epcache, ErrorTTL 1s", Options{ErrorTTL: time.Second}},
		{"dskit, client kept", Options{OnConnError: ReportNothing}},
		{"dskit, RemoveClientFor on Unavailable", Options{OnConnError: ReportByAddr}},
	} {
		addr, err := DeadAddr()
		if err != nil {
			return nil, err
		}
		dl := NewDialer()
		o := v.o
		o.Dialer, o.DialTimeout = dl, 5*time.Second
		var p Pool
		var dials func() uint64
		if v.name[:5] == "dskit" {
			dp, err := NewDskit(o)
			if err != nil {
				return nil, err
			}
			p, dials = dp, func() uint64 { return uint64(dp.Factories.Load()) }
		} else {
			ep, err := NewEpcache(o)
			if err != nil {
				return nil, err
			}
			p, dials = ep, func() uint64 { return ep.Stats().Dials }
		}
		var calls atomic.Int64
		var first atomic.Pointer[string]
		start := time.Now()
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				for time.Since(start) < d {
					ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					err := p.Do(ctx, addr, Check())
					cancel()
					calls.Add(1)
					if err != nil {
						s := err.Error()
						first.CompareAndSwap(nil, &s)
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		if err := p.Close(); err != nil {
			return nil, err
		}
		fe := ""
		if f := first.Load(); f != nil {
			fe = *f
			if len(fe) > 90 {
				fe = fe[:90] + "…"
			}
		}
		cps, aps, dps := float64(calls.Load())/el, float64(dl.Attempts.Load())/el, float64(dials())/el
		t.row(v.name, map[string]float64{"calls_per_s": cps, "connects_per_s": aps, "dials_per_s": dps},
			fmt.Sprintf("%.0f", cps), fmt.Sprintf("%.1f", aps), fmt.Sprintf("%.1f", dps), fe)
	}
	t.note("connects: TCP connect attempts at the dialer; pool dials: grpcpool's Dial calls, dskit's factory calls (a dskit client reconnects by itself, with gRPC's backoff: 1s, ×1.6, jitter)")
	return t, nil
}
