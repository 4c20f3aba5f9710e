package directory_test

import (
	"errors"
	"fmt"

	"github.com/epcache/epcache/transport/directory"
)

func Example() {
	dir, err := directory.New(directory.Options{Size: 2})
	if err != nil {
		fmt.Println(err)
		return
	}

	// Before peer 1 publishes, a lookup says "not yet": retry later.
	_, err = dir.Lookup(1)
	fmt.Println(errors.Is(err, directory.ErrNotPublished), err)

	_ = dir.Publish(1, "127.0.0.1:5000")
	addr, err := dir.Lookup(1)
	fmt.Println(addr, err)

	// Peer 1 dies; the resource manager withdraws its address.
	dir.Unpublish(1)
	_, err = dir.Lookup(1)
	var np *directory.NotPublishedError
	fmt.Println(errors.As(err, &np) && np.Withdrawn)

	// It restarts elsewhere and publishes again.
	_ = dir.Publish(1, "127.0.0.1:6000")
	addr, _ = dir.Lookup(1)
	fmt.Println(addr)

	// A peer outside the job never will.
	_, err = dir.Lookup(7)
	fmt.Println(errors.Is(err, directory.ErrUnknownPeer), err)
	// Output:
	// true directory: peer 1 has not published an address yet
	// 127.0.0.1:5000 <nil>
	// true
	// 127.0.0.1:6000
	// true directory: unknown peer 7 (peers are 0 to 1)
}
