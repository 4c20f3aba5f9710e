//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package tcp

import "net"

// peerGone cannot peek at a socket here: it reports the dialer present,
// and a connection it abandoned after its hello is found out by its reader
// instead (see readHello).
func peerGone(net.Conn) bool { return false }

// readable cannot peek at a socket here: it reports nothing to read, and a
// reply that arrived as its dial was cut short is not read.
func readable(net.Conn, int) int { return 0 }
