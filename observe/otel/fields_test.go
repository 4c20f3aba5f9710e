package epotel

import (
	"reflect"
	"testing"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/tcp"
	"github.com/stretchr/testify/assert"
)

// Every number of epcache.Stats and tcp.Stats has an instrument: a field
// added to either fails this test until it has one.
func TestEveryFieldHasAnInstrument(t *testing.T) {
	cache := map[string]bool{"CreateLatency": true, "RoomWait": true} // epcache.create.outcomes and .time, epcache.room.wait.time
	for _, s := range append(cacheCounters[:len(cacheCounters):len(cacheCounters)], cacheUpDowns...) {
		cache[s.field] = true
	}
	for f := range reflect.TypeFor[epcache.Stats]().Fields() {
		assert.True(t, cache[f.Name], "epcache.Stats.%s has no instrument", f.Name)
	}
	transport := map[string]bool{"Cache": true}
	for _, s := range append(append(tcpCounters[:len(tcpCounters):len(tcpCounters)], tcpUpDowns...), tcpGauges...) {
		transport[s.field] = true
	}
	for f := range reflect.TypeFor[tcp.Stats]().Fields() {
		assert.True(t, transport[f.Name], "tcp.Stats.%s has no instrument", f.Name)
	}
}
