package epprom

import (
	"reflect"
	"testing"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
)

// Every number of epcache.Stats and tcp.Stats is exported: a field added
// to either fails this test until it has a metric.
func TestEveryFieldHasAMetric(t *testing.T) {
	exported := func(names ...[]string) map[string]bool {
		m := map[string]bool{}
		for _, ns := range names {
			for _, n := range ns {
				m[n] = true
			}
		}
		return m
	}
	fieldsOf := func(figs ...any) []string {
		var names []string
		for _, f := range figs {
			v := reflect.ValueOf(f)
			for i := range v.Len() {
				names = append(names, v.Index(i).FieldByName("field").String())
			}
		}
		return names
	}
	cache := exported(fieldsOf(cacheCounters, cacheGauges), []string{"CreateLatency", "RoomWait"})
	for f := range reflect.TypeFor[epcache.Stats]().Fields() {
		assert.True(t, cache[f.Name], "epcache.Stats.%s has no metric", f.Name)
	}
	transport := exported(fieldsOf(tcpCounters, tcpGauges), []string{"Cache"})
	for f := range reflect.TypeFor[tcp.Stats]().Fields() {
		assert.True(t, transport[f.Name], "tcp.Stats.%s has no metric", f.Name)
	}
}
