package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// child is one process of the mesh: a tcp.Peer with its own endpoint cache,
// finding the others through etcd, run by the parent's requests.
type child struct {
	args    initArgs
	cli     *clientv3.Client
	dir     *etcddir.Directory // the tcp.Peers' addresses
	raw     *etcddir.Directory // the storm's listeners; nil before opRawListen; guarded by mu
	watchAt []atomic.Int64     // per peer: Unix ns of the last new address dir's watch told of
	news    []atomic.Int64     // per peer: the new addresses dir's watch told of
	stop    func()             // ends dir's watch

	peer     atomic.Pointer[tcp.Peer]
	recvDone chan struct{} // closed when the receiver of peer has returned
	baseFDs  int           // open descriptors before the peer was made
	in       inbox

	mu          sync.Mutex // guards raw and rawLn
	rawLn       net.Listener
	rawWG       sync.WaitGroup // the raw accept loop and its connections
	rawAccepted atomic.Int64   // connections the raw listener accepted
	outMu       sync.Mutex
	out         *json.Encoder
	logged      atomic.Bool
}

// canForget reports whether the survivors can forget a restarted peer's
// remembered failure on the watch's word: tcp.Listen watches a directory
// that is a directory.Watcher (etcddir is) and forgets a peer that
// publishes again.
func canForget() bool {
	var d directory.Interface = (*etcddir.Directory)(nil)
	_, ok := d.(directory.Watcher)
	return ok
}

// runChild runs the child's side of the line protocol until in ends (the
// parent closed it, or died), then closes everything it made.
func runChild(in io.Reader, out io.Writer) error {
	c := &child{out: json.NewEncoder(out)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	initialized := false
	for sc.Scan() {
		var req request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			cancel()
			wg.Wait()
			c.shutdown()
			return fmt.Errorf("bad request %q: %w", sc.Text(), err)
		}
		if !initialized {
			// The first request must be init, answered before any other
			// is read.
			data, err := c.init(ctx, req)
			c.reply(req.ID, data, err)
			if err != nil {
				cancel()
				return err
			}
			initialized = true
			continue
		}
		wg.Go(func() {
			data, err := c.handle(ctx, req)
			c.reply(req.ID, data, err)
		})
	}
	cancel()
	wg.Wait()
	c.shutdown()
	return sc.Err()
}

func (c *child) reply(id int, data any, err error) {
	r := reply{ID: id}
	if err != nil {
		r.Err = err.Error()
	} else if data != nil {
		b, merr := json.Marshal(data)
		if merr != nil {
			r.Err = merr.Error()
		}
		r.Data = b
	}
	c.outMu.Lock()
	defer c.outMu.Unlock()
	if err := c.out.Encode(r); err != nil && !c.logged.Swap(true) {
		fmt.Fprintf(os.Stderr, "epmesh child %d: writing to the parent: %v\n", c.args.ID, err)
	}
}

func (c *child) init(ctx context.Context, req request) (any, error) {
	if req.Op != opInit || req.Init == nil {
		return nil, fmt.Errorf("the first request is %q; want %q", req.Op, opInit)
	}
	c.args = *req.Init
	a := c.args
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: a.Endpoints,
		// It also bounds the wait for a lease's first keep-alive.
		DialTimeout: cmp.Or(a.StepTimeout, 5*time.Second),
		Logger:      zap.NewNop(), // a killed peer's lease makes the client complain: not our business
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", a.Endpoints, err)
	}
	c.cli = cli
	c.dir, err = etcddir.Open(ctx, etcddir.Options{
		Client: cli, Prefix: a.Prefix + dirTCP + "/", Size: a.N, Mode: a.mode(), TTL: a.TTL, Timeout: a.StepTimeout, Validate: validateHostPort,
	})
	if err != nil {
		cli.Close()
		return nil, err
	}
	c.watchAt = make([]atomic.Int64, a.N)
	c.news = make([]atomic.Int64, a.N)
	c.stop = c.dir.Watch(c.onWatch)
	return initReply{PID: os.Getpid(), Forget: canForget()}, nil
}

// onWatch runs on the directory's watch goroutine when a peer publishes a
// new address: a peer starting, or one back from the dead.
func (c *child) onWatch(peer int, _ string) {
	c.watchAt[peer].Store(time.Now().UnixNano()) // tcp.Peer's own watch forgets the peer's failure
	c.news[peer].Add(1)
}

// mode is the directory's mode the parent asked for.
func (a initArgs) mode() etcddir.Mode {
	if a.DirMode == "ondemand" {
		return etcddir.OnDemand
	}
	return etcddir.Mirror
}

func validateHostPort(addr string) error {
	_, _, err := net.SplitHostPort(addr)
	return err
}

func (c *child) handle(ctx context.Context, req request) (any, error) {
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	if req.SendTimeout == 0 {
		req.SendTimeout = 5 * time.Second
	}
	switch req.Op {
	case opListen:
		return c.listen()
	case opSync:
		return nil, c.sync(ctx, req)
	case opRawListen:
		return c.rawListen(ctx)
	case opFDs:
		return settleReply{FDs: openFDs(), Accepted: c.rawAccepted.Load()}, nil
	case opSettle:
		// The connections dialed to this process first: a dialer may have
		// closed its end before this one accepted it, and the accept is
		// still to come.
		deadline := time.Now().Add(req.Timeout)
		for c.rawAccepted.Load() < req.Accepted && time.Now().Before(deadline) {
			if err := pause(ctx, 2*time.Millisecond); err != nil {
				return nil, err
			}
		}
		return c.settle(ctx, req.FDs, time.Until(deadline)), nil
	case opStorm:
		return c.storm(ctx, req)
	}
	p := c.peer.Load()
	if p == nil {
		return nil, fmt.Errorf("%s before %s", req.Op, opListen)
	}
	switch req.Op {
	case opSend:
		return c.send(ctx, p, req), nil
	case opAwait:
		return c.await(ctx, req), nil
	case opStats:
		socks, ok := ownSockets()
		return statsReply{Stats: p.Stats(), Dir: c.dir.Counters(), Sockets: socks, SocketsOK: ok, FDs: openFDs()}, nil
	case opHammer:
		return c.hammer(ctx, p, req), nil
	case opWithdrawn:
		return c.withdrawn(ctx, req), nil
	case opProbe:
		return c.probe(ctx, p, req), nil
	case opClose:
		return c.close(ctx, p, req.Timeout)
	}
	return nil, fmt.Errorf("unknown operation %q", req.Op)
}

func (c *child) listen() (any, error) {
	if c.peer.Load() != nil {
		return nil, errors.New("listen twice")
	}
	c.baseFDs = openFDs()
	p, err := tcp.Listen(tcp.Config{
		ID: c.args.ID, Directory: c.dir, ErrorTTL: c.args.ErrorTTL,
		CreateTimeout: c.args.StepTimeout, HandshakeTimeout: c.args.StepTimeout,
	})
	if err != nil {
		return nil, err
	}
	c.recvDone = make(chan struct{})
	c.peer.Store(p)
	go c.receive(p)
	return listenReply{Addr: p.Addr(), FDs: c.baseFDs, At: time.Now().UnixNano()}, nil
}

// receive takes every message the peer receives into the inbox, until the
// peer is closed.
func (c *child) receive(p *tcp.Peer) {
	defer close(c.recvDone)
	for {
		m, err := p.Recv(context.Background())
		if err != nil {
			return
		}
		c.in.add(m)
	}
}

// sync waits until every other peer's address is visible in the
// directory named by req.Dir: in OnDemand mode, fetched (every process of
// the mesh uses every other).
func (c *child) sync(ctx context.Context, req request) error {
	d := c.dir
	if req.Dir == dirRaw {
		d = c.rawDir()
	}
	if d == nil {
		return fmt.Errorf("sync of %q before it was opened", req.Dir)
	}
	ctx, cancel := context.WithTimeout(ctx, req.Timeout)
	defer cancel()
	for i := range c.args.N {
		if i == c.args.ID {
			continue
		}
		if _, err := d.Resolve(ctx, i); err != nil {
			return fmt.Errorf("peer %d not visible within %v: %w", i, req.Timeout, err)
		}
	}
	return nil
}

func (c *child) send(ctx context.Context, p *tcp.Peer, req request) sendReply {
	start := time.Now()
	to, g := req.To, max(req.G, 1)
	first := make([]atomic.Int64, len(to)) // since start, of the first Send to each that succeeded; 0: none yet
	var (
		sent, errs atomic.Int64
		firstErr   atomic.Pointer[string]
		wg         sync.WaitGroup
	)
	for gi := range g {
		wg.Go(func() {
			off := gi * len(to) / g // goroutines start at different peers
			for k := gi; k < req.M; k += g {
				for j := range to {
					idx := (off + k + j) % len(to)
					sctx, cancel := context.WithTimeout(ctx, req.SendTimeout)
					err := p.Send(sctx, to[idx], payload(req.Phase, c.args.ID, k))
					cancel()
					if err != nil {
						errs.Add(1)
						msg := fmt.Sprintf("to %d: %v", to[idx], err)
						firstErr.CompareAndSwap(nil, &msg)
						continue
					}
					sent.Add(1)
					lowerTo(&first[idx], int64(max(time.Since(start), 1)))
				}
			}
		})
	}
	wg.Wait()
	r := sendReply{Sent: sent.Load(), Errors: errs.Load(), Elapsed: time.Since(start)}
	if e := firstErr.Load(); e != nil {
		r.FirstErr = *e
	}
	for i := range first {
		f := first[i].Load()
		if f == 0 {
			r.Complete = -1
			break
		}
		r.Complete = max(r.Complete, time.Duration(f))
	}
	return r
}

// lowerTo lowers v to n if v is 0 or larger.
func lowerTo(v *atomic.Int64, n int64) {
	for {
		o := v.Load()
		if (o != 0 && o <= n) || v.CompareAndSwap(o, n) {
			return
		}
	}
}

func (c *child) await(ctx context.Context, req request) awaitReply {
	deadline := time.Now().Add(req.Timeout)
	for {
		r := c.in.progress(req.Phase, req.To, req.M)
		if r.Complete || time.Now().After(deadline) || pause(ctx, 2*time.Millisecond) != nil {
			return r
		}
	}
}

// hammer sends to req.Peer, which the parent kills meanwhile, from req.G
// goroutines, until it has what it came for: a failed Send, a Send
// answered by the remembered failure (ErrorTTL), and req.Dur of sending
// since the first failure. It ends on none of these by itself, however
// late the kill or slow the machine; req.Timeout only detects a hang.
func (c *child) hammer(ctx context.Context, p *tcp.Peer, req request) hammerReply {
	before := p.Stats()
	news := c.news[req.Peer].Load()
	start := time.Now()
	deadline := start.Add(req.Timeout)
	var (
		mu        sync.Mutex
		r         = hammerReply{Kinds: map[string]int64{}}
		firstFail time.Time // guarded by mu; zero: no failure yet
		wg        sync.WaitGroup
	)
	done := func() bool {
		mu.Lock()
		f := firstFail
		mu.Unlock()
		return !f.IsZero() && time.Since(f) >= req.Dur && p.Stats().Cache.ErrorHits > before.Cache.ErrorHits
	}
	for range max(req.G, 1) {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) && !done() {
				sctx, cancel := context.WithTimeout(ctx, req.SendTimeout)
				t0 := time.Now()
				err := p.Send(sctx, req.Peer, payload(phaseHammer, c.args.ID, 0))
				d := time.Since(t0)
				cancel()
				mu.Lock()
				r.Sends++
				if err == nil {
					r.OK++
				} else {
					r.Failed++
					if errors.Is(err, context.DeadlineExceeded) {
						r.Hung++
					}
					if r.FirstFailure == 0 {
						r.FirstFailure = t0.Add(d).UnixNano()
						firstFail = t0.Add(d)
					}
					r.MaxFailed = max(r.MaxFailed, d)
					r.LastErr = err.Error()
					r.Kinds[errKind(err)]++
				}
				mu.Unlock()
				// A dead peer's remembered failure answers in microseconds:
				// a pause keeps the senders from spinning the CPUs that the
				// other processes need.
				_ = pause(ctx, time.Millisecond)
			}
		})
	}
	wg.Wait()
	r.Elapsed = time.Since(start)
	after := p.Stats()
	r.DialAttempts = after.DialAttempts - before.DialAttempts
	r.ErrorHits = after.Cache.ErrorHits - before.Cache.ErrorHits
	// Watch and its stop wait for a notification under way, so that news
	// which made tcp.Peer forget the failure (its watch and onWatch are
	// told in turn) is counted.
	c.dir.Watch(func(int, string) {})()
	r.News = c.news[req.Peer].Load() - news
	return r
}

// errKind classifies a failed Send, for the table.
func errKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, directory.ErrNotPublished):
		return "not published"
	case errors.Is(err, tcp.ErrHandshake):
		// A dying process's listener still completes connects until the
		// kernel has closed it: the hello then goes unanswered.
		return "handshake cut"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		return "connection broken"
	}
	return "other"
}

func (c *child) withdrawn(ctx context.Context, req request) withdrawnReply {
	deadline := time.Now().Add(req.Timeout)
	for {
		_, err := c.dir.Lookup(req.Peer)
		var np *directory.NotPublishedError
		if errors.As(err, &np) && np.Withdrawn {
			return withdrawnReply{Seen: true, At: time.Now().UnixNano(), Err: err.Error()}
		}
		if time.Now().After(deadline) || pause(ctx, 2*time.Millisecond) != nil {
			r := withdrawnReply{Err: "still published"}
			if err != nil {
				r.Err = err.Error()
			}
			return r
		}
	}
}

func (c *child) probe(ctx context.Context, p *tcp.Peer, req request) probeReply {
	r := probeReply{Forget: canForget()}
	deadline := time.Now().Add(req.Timeout)
	for {
		sctx, cancel := context.WithTimeout(ctx, req.SendTimeout)
		err := p.Send(sctx, req.Peer, payload(req.Phase, c.args.ID, 0))
		cancel()
		r.Attempts++
		if err == nil {
			r.OK, r.At = true, time.Now().UnixNano()
			break
		}
		r.LastErr = err.Error()
		if time.Now().After(deadline) || pause(ctx, 5*time.Millisecond) != nil {
			break
		}
	}
	r.WatchAt = c.watchAt[req.Peer].Load()
	return r
}

// close closes the peer and waits, up to timeout, for the descriptors it
// held to be given back.
func (c *child) close(ctx context.Context, p *tcp.Peer, timeout time.Duration) (any, error) {
	err := p.Close()
	<-c.recvDone
	r := closeReply{Stats: p.Stats()}
	r.FDs = c.settle(ctx, c.baseFDs, timeout).FDs
	return r, err
}

// settle waits, up to timeout, until the process has fds descriptors open
// (the other ends of connections close on their own time), and returns the
// count.
func (c *child) settle(ctx context.Context, fds int, timeout time.Duration) settleReply {
	deadline := time.Now().Add(timeout)
	for {
		n := openFDs()
		if n == fds || time.Now().After(deadline) || pause(ctx, 5*time.Millisecond) != nil {
			return settleReply{FDs: n, Accepted: c.rawAccepted.Load()}
		}
	}
}

// shutdown closes what the child made, once the parent has hung up.
func (c *child) shutdown() {
	if p := c.peer.Load(); p != nil {
		_ = p.Close()
		<-c.recvDone
	}
	c.mu.Lock()
	if c.rawLn != nil {
		c.rawLn.Close()
	}
	c.mu.Unlock()
	c.rawWG.Wait()
	if c.stop != nil {
		c.stop()
	}
	for _, d := range []*etcddir.Directory{c.dir, c.rawDir()} {
		if d != nil {
			d.Close()
		}
	}
	if c.cli != nil {
		c.cli.Close()
	}
}

// pause waits d, or returns ctx.Err() if ctx ends first.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Messages carry their round, their sender and their number, so that the
// receiver can count each pair's messages and tell a duplicate.
const (
	payloadSize = 12
	// phaseHammer tags the messages of opHammer: counted, not checked.
	phaseHammer = 1 << 30
)

func payload(phase, from, seq int) []byte {
	var b [payloadSize]byte
	binary.BigEndian.PutUint32(b[0:], uint32(phase))
	binary.BigEndian.PutUint32(b[4:], uint32(from))
	binary.BigEndian.PutUint32(b[8:], uint32(seq))
	return b[:]
}

// inbox counts the messages a child received, by round and sender.
type inbox struct {
	mu     sync.Mutex
	phases map[int]*phaseIn
	bad    int // messages whose payload did not parse, or named another sender
}

type phaseIn struct {
	from map[int]int         // messages by sender
	seen map[[2]int]struct{} // (sender, number)
	dups int
}

func (b *inbox) add(m tcp.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(m.Payload) != payloadSize || int(binary.BigEndian.Uint32(m.Payload[4:])) != m.From {
		b.bad++
		return
	}
	phase := int(binary.BigEndian.Uint32(m.Payload))
	seq := int(binary.BigEndian.Uint32(m.Payload[8:]))
	if b.phases == nil {
		b.phases = map[int]*phaseIn{}
	}
	ph := b.phases[phase]
	if ph == nil {
		ph = &phaseIn{from: map[int]int{}, seen: map[[2]int]struct{}{}}
		b.phases[phase] = ph
	}
	ph.from[m.From]++
	if phase == phaseHammer {
		return
	}
	k := [2]int{m.From, seq}
	if _, dup := ph.seen[k]; dup {
		ph.dups++
	}
	ph.seen[k] = struct{}{}
}

// progress reports what has arrived of phase from the peers of from, and
// whether each has sent at least m (duplicates are counted apart, and
// fail the run).
func (b *inbox) progress(phase int, from []int, m int) awaitReply {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := awaitReply{Received: map[int]int{}, Complete: true}
	ph := b.phases[phase]
	for _, f := range from {
		n := 0
		if ph != nil {
			n = ph.from[f]
		}
		r.Received[f] = n
		if n < m {
			r.Complete = false
		}
	}
	if ph != nil {
		r.Duplicates = ph.dups
	}
	r.Duplicates += b.bad
	return r
}

// The storm: a connection storm across processes through one of bench's
// comparators, over raw connections (a dial and an 8-byte hello, as
// epbench's tcpstorm), with the modelled delay of -rtt before each dial.

func (c *child) rawListen(ctx context.Context) (any, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rawLn != nil {
		return nil, errors.New("rawlisten twice")
	}
	if c.raw == nil {
		d, err := etcddir.Open(ctx, etcddir.Options{
			Client: c.cli, Prefix: c.args.Prefix + dirRaw + "/", Size: c.args.N, Mode: c.args.mode(), TTL: c.args.TTL, Timeout: c.args.StepTimeout, Validate: validateHostPort,
		})
		if err != nil {
			return nil, err
		}
		c.raw = d
	}
	fds := openFDs()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c.rawLn = ln
	c.rawWG.Go(func() { c.rawAccept(ln) })
	if err := c.raw.Publish(c.args.ID, ln.Addr().String()); err != nil {
		return nil, err
	}
	return listenReply{Addr: ln.Addr().String(), FDs: fds, At: time.Now().UnixNano()}, nil
}

func (c *child) rawDir() *etcddir.Directory {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.raw
}

// rawAccept accepts the storm's connections: each says (from, to) in 8
// bytes, then is read until the dialer closes it.
func (c *child) rawAccept(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return // closed
		}
		c.rawAccepted.Add(1)
		c.rawWG.Go(func() {
			defer conn.Close()
			var hello [8]byte
			if _, err := io.ReadFull(conn, hello[:]); err != nil || int(binary.BigEndian.Uint32(hello[4:])) != c.args.ID {
				return
			}
			_, _ = io.Copy(io.Discard, conn)
		})
	}
}

func (c *child) storm(ctx context.Context, req request) (any, error) {
	raw := c.rawDir()
	if raw == nil {
		return nil, fmt.Errorf("%s before %s", opStorm, opRawListen)
	}
	n, me := c.args.N, c.args.ID
	ledger := bench.NewLedger(n, bench.MustCost("none"), 0)
	var dialer net.Dialer
	dialedTo := make([]atomic.Int64, n)
	cache, err := bench.New(req.Impl, bench.Env[int]{
		Create: func(ctx context.Context, to int) (*bench.Endpoint, error) {
			return ledger.Make(ctx, to, func(ctx context.Context) (io.Closer, error) {
				// One round trip, the connect, as tcpstorm models it: the
				// hello is not answered.
				if err := pause(ctx, req.RTT); err != nil {
					return nil, err
				}
				addr, err := raw.Lookup(to)
				if err != nil {
					return nil, err
				}
				conn, err := dialer.DialContext(ctx, "tcp", addr)
				if err != nil {
					return nil, err
				}
				dialedTo[to].Add(1)
				var hello [8]byte
				binary.BigEndian.PutUint32(hello[:4], uint32(me))
				binary.BigEndian.PutUint32(hello[4:], uint32(to))
				if _, err := conn.Write(hello[:]); err != nil {
					conn.Close()
					return nil, err
				}
				return conn, nil
			})
		},
		Release: func(_ int, ep *bench.Endpoint) { ledger.Release(ep) },
		Index:   func(k int) int { return k },
		Peers:   n,
	})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, req.Timeout)
	defer cancel()
	g := max(req.G, 1)
	var (
		errs     atomic.Int64
		firstErr atomic.Pointer[string]
		wg       sync.WaitGroup
	)
	start := time.Now()
	for gi := range g {
		wg.Go(func() {
			first := gi * n / g // goroutines start at different peers, as in tcpstorm
			for j := range n {
				to := (first + j) % n
				if to == me {
					continue
				}
				ep, err := cache.Get(sctx, to)
				if err == nil && ep.Peer != to {
					err = fmt.Errorf("endpoint of peer %d for peer %d", ep.Peer, to)
				}
				if err != nil {
					errs.Add(1)
					msg := fmt.Sprintf("to %d: %v", to, err)
					firstErr.CompareAndSwap(nil, &msg)
				}
			}
		})
	}
	wg.Wait()
	r := stormReply{Elapsed: time.Since(start), Errors: errs.Load()}
	if e := firstErr.Load(); e != nil {
		r.FirstErr = *e
	}
	err = cache.Close()
	r.Counts = ledger.Counts()
	for i := range dialedTo {
		r.DialedTo = append(r.DialedTo, dialedTo[i].Load())
	}
	return r, err
}
