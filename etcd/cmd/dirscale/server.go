package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/epcache/epcache/etcd/etcdtest"
)

// serverEnv, set to "1", makes the binary the etcd server of a run: it
// starts an embedded etcd, prints its client URL on stdout, and stops it
// when stdin ends. In a process of its own, etcd's CPU time is its own,
// apart from the clients'.
const serverEnv = "DIRSCALE_ETCD"

func runServer(in io.Reader, out io.Writer) error {
	s, err := etcdtest.Start("")
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := fmt.Fprintln(out, s.URL()); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, in)
	return err
}

// server is a running etcd process.
type server struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	url string
	pid int
}

// startServer starts the binary self as an etcd server.
func startServer(ctx context.Context, self string) (*server, error) {
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), serverEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting etcd (%s): %w", self, err)
	}
	s := &server{cmd: cmd, in: in, pid: cmd.Process.Pid}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case l, ok := <-line:
		if !ok || !strings.HasPrefix(l, "http://") {
			s.stop()
			return nil, fmt.Errorf("etcd (pid %d) did not start: %q", s.pid, l)
		}
		s.url = l
		return s, nil
	case <-ctx.Done():
		s.stop()
		return nil, ctx.Err()
	}
}

// stop ends the server, and kills it if it has not exited within a
// minute of its stdin closing.
func (s *server) stop() {
	s.in.Close()
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = s.cmd.Process.Kill()
		<-done
	}
}
