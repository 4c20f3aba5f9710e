// Package meshtest holds the test helpers the transports share: an inbox that
// counts the messages a peer receives by sender, and payloads that name
// their sender so that a message delivered under the wrong name is caught.
package meshtest

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Inbox counts the messages one peer receives, by sender.
type Inbox struct {
	Total atomic.Int64
	From  []atomic.Int64
	Bad   atomic.Int64  // messages whose payload names another sender than the one delivered
	Done  chan struct{} // closed when the peer has closed and the receiver stopped
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
// that it got exactly that many and none under a wrong name.
func WaitTotal(t *testing.T, in *Inbox, want int64, who string) {
	t.Helper()
	if !assert.Eventually(t, func() bool { return in.Total.Load() >= want }, 20*time.Second, time.Millisecond) {
		t.Errorf("%s received %d messages; want %d", who, in.Total.Load(), want)
	}
	assert.Equal(t, want, in.Total.Load(), "%s: messages received", who)
	assert.Zero(t, in.Bad.Load(), "%s: messages with a wrong sender", who)
}
