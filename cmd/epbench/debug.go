package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/observe/debugpage"
)

// debugPath is where -debug serves the debug page; / redirects there.
const debugPath = "/debug/epcache/"

// debugServer serves -debug's page: every epcache cache a run builds
// (through bench.Watch), from its creation to its Close, named after the
// run's spec and numbered (a mesh run builds one cache per peer).
type debugServer struct {
	page   *debugpage.Handler
	srv    *http.Server
	served chan error // Serve's return

	mu   sync.Mutex
	spec string // the spec running
	n    int    // the caches it has built so far
}

// startDebug listens on addr, serves the page, sets bench.Watch, and says
// where the page is on stderr. close undoes it all.
func startDebug(addr string, stderr io.Writer) (*debugServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-debug %s: %w", addr, err)
	}
	d := &debugServer{page: debugpage.New(), served: make(chan error, 1)}
	mux := http.NewServeMux()
	mux.Handle(debugPath, d.page)
	mux.Handle("/{$}", http.RedirectHandler(debugPath, http.StatusFound))
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { d.served <- d.srv.Serve(ln) }()
	bench.Watch = d.watch
	fmt.Fprintf(stderr, "epbench: debug page at http://%s%s\n", ln.Addr(), debugPath)
	return d, nil
}

// begin names the caches that follow after s.
func (d *debugServer) begin(s bench.Spec) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.spec, d.n = s.Name(), 0
}

// watch is bench.Watch: it adds the cache to the page until its Close.
func (d *debugServer) watch(c any) (unwatch func()) {
	d.mu.Lock()
	d.n++
	name := d.spec + "/cache=" + strconv.Itoa(d.n)
	d.mu.Unlock()
	var err error
	switch c := c.(type) {
	case *epcache.Cache[uint64, *bench.Endpoint]:
		err = debugpage.Add(d.page, name, c)
	case *epcache.Cache[string, *bench.Endpoint]:
		err = debugpage.Add(d.page, name, c)
	default:
		err = fmt.Errorf("a cache of type %T", c) // a key type bench does not use
	}
	if err != nil {
		return nil // the page shows what it can; the run goes on
	}
	return func() { d.page.Remove(name) }
}

// close stops the server and bench.Watch.
func (d *debugServer) close() error {
	if d == nil {
		return nil
	}
	bench.Watch = nil
	err := d.srv.Close()
	if serr := <-d.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
