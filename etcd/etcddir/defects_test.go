package etcddir_test

import (
	"fmt"
	"testing"

	"github.com/epcache/epcache/etcd/etcddir"
)

// Prefetch reads every page at the revision it is given: with one key a
// page, a life published after the fence and a peer withdrawn after it
// are not in what it reads.
func TestPrefetchReadsEveryPageAtItsRevision(t *testing.T) {
	s := server(t)
	tc := client(t, s.URL())
	prefix := "/test/" + t.Name() + "/"
	pub := open(t, client(t, s.URL()), onDemand)
	for p := range 4 {
		if err := pub.Publish(p, fmt.Sprintf("127.0.0.1:%d", 7000+p)); err != nil {
			t.Fatal(err)
		}
	}
	fence := modRevision(t, tc, etcddir.Key(prefix, 3))
	later := open(t, client(t, s.URL()), onDemand)
	if err := later.Publish(2, "127.0.0.1:7102"); err != nil {
		t.Fatal(err)
	}
	if !pub.Unpublish(3) {
		t.Fatal("Unpublish(3) withdrew nothing")
	}
	d := open(t, client(t, s.URL()), func(o *etcddir.Options) { o.Mode, o.PageSize = etcddir.OnDemand, 1 })
	before := d.Counters()
	if err := d.Prefetch(request(t), fence); err != nil {
		t.Fatal(err)
	}
	if pages := d.Counters().Ranges - before.Ranges; pages != 4 {
		t.Errorf("Prefetch of 4 keys, 1 a page: %d range requests; want 4", pages)
	}
	for p := range 4 {
		if got, err := d.Lookup(p); err != nil || got != fmt.Sprintf("127.0.0.1:%d", 7000+p) {
			t.Errorf("Lookup(%d) after Prefetch at the fence's revision %d = %q, %v; want the address it had then", p, fence, got, err)
		}
	}
}
