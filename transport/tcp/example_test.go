package tcp_test

import (
	"context"
	"fmt"
	"time"

	"github.com/epcache/epcache/epcache"
	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/tcp"
)

func Example() {
	// A job of two peers; addresses become visible 50ms after publication.
	dir, err := directory.New(directory.Options{Size: 2, Delay: 50 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := tcp.Config{
		Directory: dir,
		MaxFrame:  64 << 10,
		// Wait for an address not published yet for up to a minute (the
		// in-process directory waits in Resolve; with another, Retry
		// retries "not published yet" with backoff); remember any other
		// failure for a second. A handshake may take
		// as long: a busy machine answers late, and a dead peer refuses at
		// once.
		Retry:            epcache.Backoff(time.Millisecond, 50*time.Millisecond, 0, tcp.Retryable),
		CreateTimeout:    time.Minute,
		HandshakeTimeout: time.Minute,
		ErrorTTL:         time.Second,
	}
	cfg.ID = 0
	a, err := tcp.Listen(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	cfg.ID = 1
	b, err := tcp.Listen(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx := context.Background()
	// Peer 1's address is not visible yet: Send waits for it (the
	// in-process directory is a directory.Resolver).
	if err := a.Send(ctx, 1, []byte("ping")); err != nil {
		fmt.Println(err)
		return
	}
	msg, _ := b.Recv(ctx)
	fmt.Printf("peer 1 got %q from peer %d\n", msg.Payload, msg.From)

	// Peer 1 answers over the connection peer 0 dialed: no second one.
	if err := b.Send(ctx, 0, []byte("pong")); err != nil {
		fmt.Println(err)
		return
	}
	msg, _ = a.Recv(ctx)
	fmt.Printf("peer 0 got %q from peer %d\n", msg.Payload, msg.From)
	fmt.Println("connections dialed:", a.Stats().Dialed+b.Stats().Dialed)
	// Output:
	// peer 1 got "ping" from peer 0
	// peer 0 got "pong" from peer 1
	// connections dialed: 1
}
