// Package meshtest holds the test helpers the transports share: an inbox that
// counts the messages a peer receives by sender, payloads that name their
// sender so that a message delivered under the wrong name is caught, a
// directory that records what the transports report unreachable, and the
// two durations that keep the transports' tests independent of the
// machine's speed.
package meshtest

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/stretchr/testify/assert"
)

// Hang bounds a wait that only detects a hang: a test may wait this long for
// something that must happen, however slow or busy the machine, and fails
// only if it never does.
const Hang = 2 * time.Minute

// Patience is the value the tests give a timeout of the transport that they
// do not test (a handshake's, a connection's): longer than any test runs, so
// that no step fails for being slow. A step that hangs is caught by Hang, or
// by go test's -timeout.
const Patience = time.Hour

// Final is a Payload's b that marks a message of a final round: Inbox counts
// those in Finals too, so that a test can wait for a round that must arrive
// in full after rounds whose messages may be lost (with a broken
// connection) or late.
const Final = 1 << 30

// Inbox counts the messages one peer receives, by sender.
type Inbox struct {
	Total  atomic.Int64
	From   []atomic.Int64
	Finals atomic.Int64  // messages whose payload's b is Final
	Bad    atomic.Int64  // messages whose payload names another sender than the one delivered
	Done   chan struct{} // closed when the peer has closed and the receiver stopped
}

// Receive starts a goroutine that calls recv until it fails with closed (the
// peer's "closed" error; any other error panics the test binary), counting
// each message by sender among n peers. A payload that starts with 4 bytes
// names its sender, which must be from.
func Receive(recv func(context.Context) (from int, payload []byte, err error), closed error, n int) *Inbox {
	in := &Inbox{From: make([]atomic.Int64, n), Done: make(chan struct{})}
	go func() {
		defer close(in.Done)
		for {
			from, p, err := recv(context.Background())
			if err != nil {
				if !errors.Is(err, closed) {
					panic(err)
				}
				return
			}
			if len(p) >= 4 && int(binary.BigEndian.Uint32(p)) != from {
				in.Bad.Add(1)
			}
			if len(p) >= 12 && binary.BigEndian.Uint32(p[8:]) == Final {
				in.Finals.Add(1)
			}
			in.From[from].Add(1)
			in.Total.Add(1)
		}
	}()
	return in
}

// Payload is a message naming its sender, and two numbers of the caller's.
func Payload(from, a, b int) []byte {
	var p [12]byte
	binary.BigEndian.PutUint32(p[0:], uint32(from))
	binary.BigEndian.PutUint32(p[4:], uint32(a))
	binary.BigEndian.PutUint32(p[8:], uint32(b))
	return p[:]
}

// WaitTotal waits until in has received want messages in all, then asserts
// that it got exactly that many and none under a wrong name. The messages
// must have been sent (their Sends returned): the wait only detects a loss.
func WaitTotal(t *testing.T, in *Inbox, want int64, who string) {
	t.Helper()
	waitCount(t, &in.Total, want, who, "messages received")
	assert.Zero(t, in.Bad.Load(), "%s: messages with a wrong sender", who)
}

// WaitFinals is WaitTotal for the messages of a final round (see Final).
func WaitFinals(t *testing.T, in *Inbox, want int64, who string) {
	t.Helper()
	waitCount(t, &in.Finals, want, who, "messages of the final round received")
	assert.Zero(t, in.Bad.Load(), "%s: messages with a wrong sender", who)
}

func waitCount(t *testing.T, n *atomic.Int64, want int64, who, what string) {
	t.Helper()
	if !Eventually(t, func() bool { return n.Load() >= want }) {
		t.Errorf("%s: %d %s after %v; want %d", who, n.Load(), what, Hang, want)
	}
	assert.Equal(t, want, n.Load(), "%s: %s", who, what)
}

// Eventually polls cond every millisecond until it holds, for at most Hang,
// and reports whether it held; msgAndArgs describe the failure, as for
// assert.Eventually.
func Eventually(t *testing.T, cond func() bool, msgAndArgs ...any) bool {
	t.Helper()
	return assert.Eventually(t, cond, Hang, time.Millisecond, msgAndArgs...)
}

// Reporting is a directory.Resolver over the in-process directory that
// records the addresses reported unreachable, and calls OnUnreachable, if
// set, for each.
type Reporting struct {
	*directory.Directory
	mu            sync.Mutex
	reports       []string
	OnUnreachable func(peer int, addr string)
}

// Unreachable records addr and calls OnUnreachable.
func (r *Reporting) Unreachable(peer int, addr string) {
	r.mu.Lock()
	r.reports = append(r.reports, addr)
	r.mu.Unlock()
	if r.OnUnreachable != nil {
		r.OnUnreachable(peer, addr)
	}
}

// Reported returns the addresses reported so far, in order.
func (r *Reporting) Reported() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reports...)
}
