//go:build ucx

package ucx_test

import (
	"context"
	"fmt"
	"time"

	"github.com/epcache/epcache/transport/directory"
	"github.com/epcache/epcache/transport/ucx"
)

// Two peers of one process: each publishes its worker's address, and the
// first Send from one to the other creates the endpoint (once, however
// many goroutines send at the same time).
func Example() {
	c, err := ucx.NewContext(ucx.Options{Config: map[string]string{"TLS": "self,tcp"}})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	dir, _ := directory.New(directory.Options{Size: 2})
	var peers [2]*ucx.Peer
	for i := range peers {
		// A minute to connect: a busy machine wires up late, and a dead
		// peer fails at once.
		if peers[i], err = ucx.Start(ucx.Config{ID: i, Directory: dir, Context: c, CreateTimeout: time.Minute}); err != nil {
			panic(err)
		}
		defer peers[i].Close()
	}

	ctx := context.Background()
	if err := peers[0].Send(ctx, 1, []byte("hello")); err != nil {
		panic(err)
	}
	msg, err := peers[1].Recv(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("peer 1 got %q from peer %d\n", msg.Payload, msg.From)
	fmt.Println("endpoints created by peer 0:", peers[0].Stats().Endpoints.Created)
	// Output:
	// peer 1 got "hello" from peer 0
	// endpoints created by peer 0: 1
}
