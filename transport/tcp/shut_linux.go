//go:build linux

package tcp

import (
	"encoding/binary"
	"net"
	"syscall"
)

// tcpEstablished is Linux's TCP_ESTABLISHED, the first byte of struct
// tcp_info (tcpi_state).
const tcpEstablished = 1

// remoteShut reports, without waiting and whatever unread data is ahead of
// it, whether the other end of nc has closed its sending side (its FIN has
// arrived: CLOSE_WAIT) or reset the connection: whether a frame written now
// might reach a socket that nobody reads any more. It asks the kernel for
// the connection's state (getsockopt TCP_INFO, of which the kernel copies as
// much as fits in an int: tcpi_state is its first byte). Anything but
// ESTABLISHED counts as shut, an error too: this end never closes its own
// side while a Send may write.
func remoteShut(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var (
		v    int
		gerr error
	)
	if err := rc.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_INFO)
	}); err != nil || gerr != nil {
		return true
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(v))
	return b[0] != tcpEstablished
}
