package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// proc is a child process as the parent sees it: a pipe to write requests
// to, and a reader that hands each reply to the call waiting for it.
type proc struct {
	id  int
	pid int
	cmd *exec.Cmd
	in  io.WriteCloser

	wmu sync.Mutex // serialises requests on in
	enc *json.Encoder

	mu      sync.Mutex
	next    int
	pending map[int]chan reply

	exited  chan struct{} // closed once the process has exited and been waited for
	exitErr error         // set before exited is closed
}

// spawn starts the binary self as child a.ID and initialises it.
func spawn(ctx context.Context, self string, stderr io.Writer, a initArgs) (*proc, initReply, error) {
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, initReply{}, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, initReply{}, err
	}
	if err := cmd.Start(); err != nil {
		return nil, initReply{}, fmt.Errorf("starting child %d (%s): %w", a.ID, self, err)
	}
	p := &proc{
		id: a.ID, pid: cmd.Process.Pid, cmd: cmd, in: in, enc: json.NewEncoder(in),
		pending: map[int]chan reply{}, exited: make(chan struct{}),
	}
	go p.read(out)
	var ir initReply
	if err := p.call(ctx, request{Op: opInit, Init: &a}, &ir); err != nil {
		p.kill()
		return nil, initReply{}, err
	}
	return p, ir, nil
}

// read routes the child's replies until its stdout ends, then waits for
// the process.
func (p *proc) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue // not ours: nothing else should write there, but a stray print must not stop the run
		}
		p.mu.Lock()
		ch := p.pending[r.ID]
		delete(p.pending, r.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	_, _ = io.Copy(io.Discard, out)
	p.exitErr = p.cmd.Wait()
	close(p.exited)
}

// call sends req to the child and decodes its reply into out (if not nil).
func (p *proc) call(ctx context.Context, req request, out any) error {
	ch := make(chan reply, 1)
	p.mu.Lock()
	p.next++
	req.ID = p.next
	p.pending[req.ID] = ch
	p.mu.Unlock()
	forget := func() {
		p.mu.Lock()
		delete(p.pending, req.ID)
		p.mu.Unlock()
	}
	p.wmu.Lock()
	err := p.enc.Encode(req)
	p.wmu.Unlock()
	if err != nil {
		forget()
		return fmt.Errorf("child %d: %s: %w", p.id, req.Op, p.exitOr(err))
	}
	var r reply
	select {
	case r = <-ch:
	case <-p.exited:
		select {
		case r = <-ch:
		default:
			return fmt.Errorf("child %d (pid %d) exited during %s: %v", p.id, p.pid, req.Op, p.exitErr)
		}
	case <-ctx.Done():
		forget()
		return fmt.Errorf("child %d: %s: %w", p.id, req.Op, ctx.Err())
	}
	if r.Err != "" {
		return fmt.Errorf("child %d: %s: %s", p.id, req.Op, r.Err)
	}
	if out != nil && len(r.Data) > 0 {
		if err := json.Unmarshal(r.Data, out); err != nil {
			return fmt.Errorf("child %d: %s: reply: %w", p.id, req.Op, err)
		}
	}
	return nil
}

// exitOr returns the process's exit error if it has exited, and err
// otherwise.
func (p *proc) exitOr(err error) error {
	select {
	case <-p.exited:
		return fmt.Errorf("exited: %v", p.exitErr)
	default:
		return err
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// stop closes the child's stdin, which makes it close what it holds and
// exit, and kills it if it has not within timeout.
func (p *proc) stop(timeout time.Duration) error {
	p.wmu.Lock()
	p.in.Close()
	p.wmu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		return p.exitErr
	case <-t.C:
		p.kill()
		return fmt.Errorf("child %d (pid %d) did not exit within %v of its stdin closing; killed", p.id, p.pid, timeout)
	}
}

// callAll sends each process of procs the request req(p) at once, and
// returns their replies in the order of procs.
func callAll[T any](ctx context.Context, procs []*proc, req func(p *proc) request) ([]T, error) {
	out := make([]T, len(procs))
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() { errs[i] = p.call(ctx, req(p), &out[i]) })
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// procSet is the N processes of one run, sharing a key prefix in etcd.
type procSet struct {
	env    *env
	prefix string
	n      int
	procs  []*proc // by id
	forget bool    // the children can make tcp.Peer forget a remembered failure
	mode   string  // the children's etcddir mode
}

// env is what every run of the command shares: the binary to start as a
// child, the etcd endpoints, and the options.
type env struct {
	o         options
	self      string
	endpoints []string
	stderr    io.Writer
	// dirMode is the etcddir mode of the runs: set by measure before each
	// run (runs are one after the other); "" is mirror.
	dirMode string
	mu      sync.Mutex
	runs    int
}

// start starts n children for a run of scenario, each with its own
// prefix-unique id, and initialises them, all at once. The process victim
// (-1: none), which the run will kill, has leases of o.ttl; the others of
// o.liveTTL.
func (e *env) start(ctx context.Context, scenario string, n, victim int) (*procSet, error) {
	e.mu.Lock()
	e.runs++
	prefix := fmt.Sprintf("%s%s-%d-n%d-%s/", e.o.prefix, scenario, e.runs, n, cmp.Or(e.dirMode, "mirror"))
	e.mu.Unlock()
	s := &procSet{env: e, prefix: prefix, n: n, procs: make([]*proc, n), mode: cmp.Or(e.dirMode, "mirror")}
	errs := make([]error, n)
	forget := make([]bool, n)
	var wg sync.WaitGroup
	for id := range n {
		wg.Go(func() {
			a := s.args(id)
			if id == victim {
				a.TTL = e.o.ttl
			}
			p, ir, err := spawn(ctx, e.self, e.stderr, a)
			s.procs[id], forget[id], errs[id] = p, ir.Forget, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		s.close()
		return nil, err
	}
	s.forget = forget[0]
	return s, nil
}

// args are the arguments of process id, a process the run does not kill.
func (s *procSet) args(id int) initArgs {
	o := s.env.o
	ttl := o.liveTTL
	if ttl == 0 {
		ttl = o.ttl
	}
	return initArgs{Endpoints: s.env.endpoints, Prefix: s.prefix, ID: id, N: s.n, TTL: ttl, ErrorTTL: o.errorTTL, StepTimeout: o.stepTimeout, DirMode: s.mode}
}

// respawn starts a new process for id, in place of one that died; the run
// does not kill it.
func (s *procSet) respawn(ctx context.Context, id int) (*proc, error) {
	p, _, err := spawn(ctx, s.env.self, s.env.stderr, s.args(id))
	if err != nil {
		return nil, err
	}
	s.procs[id] = p
	return p, nil
}

// close stops every child that is still running.
func (s *procSet) close() error {
	var wg sync.WaitGroup
	errs := make([]error, len(s.procs))
	for i, p := range s.procs {
		if p == nil {
			continue
		}
		select {
		case <-p.exited:
			continue // killed on purpose, or already stopped
		default:
		}
		wg.Go(func() { errs[i] = p.stop(s.env.o.timeout) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// others returns 0 to n-1 without id.
func others(n, id int) []int {
	out := make([]int, 0, n-1)
	for i := range n {
		if i != id {
			out = append(out, i)
		}
	}
	return out
}

// without returns ids without id.
func without(ids []int, id int) []int {
	out := make([]int, 0, len(ids))
	for _, i := range ids {
		if i != id {
			out = append(out, i)
		}
	}
	return out
}

func pick(procs []*proc, ids []int) []*proc {
	out := make([]*proc, len(ids))
	for k, i := range ids {
		out[k] = procs[i]
	}
	return out
}
