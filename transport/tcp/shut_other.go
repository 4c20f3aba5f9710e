//go:build !linux

package tcp

import "net"

// remoteShut cannot ask the kernel for the connection's state here: it
// reports the other end present, and a Send finds out that the other end
// closed its side from the connection's reader (conn.ended) instead, which
// leaves the window that Send's documentation describes.
func remoteShut(net.Conn) bool { return false }
