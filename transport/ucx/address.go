//go:build ucx

package ucx

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// A worker address, as Worker.Address returns it and Connect takes it, is
// the UCX address (ucp_worker_get_address) behind an 8-byte header:
//
//	"epU" 1 | length uint32, big-endian | UCX address (length bytes)
//
// UCX unpacks an address by trusting the lengths written inside it: a
// truncated or garbage blob makes ucp_ep_create read past its end, or
// crash. So Connect checks the header (magic, version, exact length) and
// then the registry: the addresses that the open contexts of this process
// issued. Only a blob found there reaches UCX. The directory is in-process,
// so every legitimate address is in the registry; a blob copied from
// another process is refused, not guessed at.
const (
	addrMagic  = "epU\x01"
	addrHeader = len(addrMagic) + 4
)

// registry holds, as keys, the framed addresses of the workers of every
// open Context of this process. A context's addresses stay until its
// Close, its closed workers' included: connecting to a dead worker is a
// failure UCX reports, not one to guess at.
var registry sync.Map // string -> *Context

// frame puts the header in front of a UCX address.
func frame(ucxAddr []byte) string {
	b := make([]byte, addrHeader+len(ucxAddr))
	copy(b, addrMagic)
	binary.BigEndian.PutUint32(b[len(addrMagic):], uint32(len(ucxAddr)))
	copy(b[addrHeader:], ucxAddr)
	return string(b)
}

// checkAddress returns the UCX address inside a framed one, or an
// *AddressError, or an error wrapping ErrUnknownAddress.
func checkAddress(addr string) (string, error) {
	bad := func(format string, args ...any) error {
		return &AddressError{Len: len(addr), Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case len(addr) < addrHeader:
		return "", bad("shorter than the %d-byte header", addrHeader)
	case addr[:len(addrMagic)] != addrMagic:
		return "", bad("no %q header", addrMagic[:3])
	}
	n := int(binary.BigEndian.Uint32([]byte(addr[len(addrMagic):addrHeader])))
	switch {
	case n == 0:
		return "", bad("empty UCX address")
	case len(addr)-addrHeader < n:
		return "", bad("truncated: the header announces %d bytes of UCX address, %d follow", n, len(addr)-addrHeader)
	case len(addr)-addrHeader > n:
		return "", bad("%d bytes after the %d-byte UCX address", len(addr)-addrHeader-n, n)
	}
	if _, ok := registry.Load(addr); !ok {
		return "", fmt.Errorf("%w (%d bytes): no open context of this process issued it", ErrUnknownAddress, len(addr))
	}
	return addr[addrHeader:], nil
}
