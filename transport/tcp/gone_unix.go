//go:build linux || darwin || freebsd || netbsd || openbsd

package tcp

import (
	"errors"
	"net"
	"syscall"
)

// peerGone reports, without waiting, whether the other end of nc has
// closed or reset it with nothing left to read: it peeks at the socket
// (MSG_PEEK, MSG_DONTWAIT), which reports a byte, the end of the stream, a
// reset, or nothing to read yet.
func peerGone(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var (
		rerr error
		b    [1]byte
	)
	var n int
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // done, whatever it found: never wait
	}); err != nil {
		return true // closed under us
	}
	switch {
	case errors.Is(rerr, syscall.EAGAIN), errors.Is(rerr, syscall.EWOULDBLOCK), errors.Is(rerr, syscall.EINTR):
		return false // alive, and silent: waiting for its verdict
	case rerr != nil:
		return true // reset
	default:
		return n == 0 // the end of the stream; a byte is a frame sent ahead of the verdict
	}
}

// readable returns how many bytes, up to n, can be read from nc without
// waiting: it peeks at the socket (MSG_PEEK, MSG_DONTWAIT).
func readable(nc net.Conn, n int) int {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	b := make([]byte, n)
	var got int
	// Control, not Read: the connection's deadline may be in the past (the
	// read was cut), which Read would answer without a look.
	if err := rc.Control(func(fd uintptr) {
		if m, _, rerr := syscall.Recvfrom(int(fd), b, syscall.MSG_PEEK|syscall.MSG_DONTWAIT); rerr == nil {
			got = m
		}
	}); err != nil {
		return 0
	}
	return got
}
