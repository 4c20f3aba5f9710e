package main

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// socket is one TCP connection end a process holds: its own address and
// the other end's. Two processes hold the two ends of one connection when
// one's Local is the other's Remote and the other way round: that is how
// the parent counts the connections of each pair from what the kernel says,
// not from what the transport's counters say.
type socket struct {
	Local  string `json:"local"`
	Remote string `json:"remote"`
}

// ownSockets lists the connected TCP sockets of this process (listeners
// left out), from /proc: the socket inodes of /proc/self/fd, looked up in
// /proc/self/net/tcp and tcp6. ok is false where /proc is not there.
func ownSockets() (socks []socket, ok bool) {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, false
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err != nil {
			continue // closed meanwhile, or the directory's own descriptor
		}
		if ino, found := strings.CutPrefix(link, "socket:["); found {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	found := false
	seen := map[socket]bool{}
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		s, err := readTCPTable(table, inodes)
		if err == nil {
			found = true
		}
		for _, k := range s {
			// The kernel reads the table out in chunks, and a socket
			// may come twice (or be missed) while other sockets come
			// and go meanwhile: each connection counts once, and the
			// caller reads again until the counts hold.
			if !seen[k] {
				seen[k] = true
				socks = append(socks, k)
			}
		}
	}
	return socks, found
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// readTCPTable reads one /proc/net/tcp table and returns its sockets whose
// inode is in inodes, listeners left out. Its lines are
//
//	sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
func readTCPTable(path string, inodes map[string]bool) ([]socket, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var socks []socket
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] == tcpListen || !inodes[fields[9]] {
			continue
		}
		local, err1 := parseProcAddr(fields[1])
		remote, err2 := parseProcAddr(fields[2])
		if err1 != nil || err2 != nil {
			continue
		}
		socks = append(socks, socket{Local: local, Remote: remote})
	}
	return socks, sc.Err()
}

// parseProcAddr decodes an address of /proc/net/tcp: the IP in hex as the
// kernel stores it (4-byte words in host order, little-endian here), a
// colon and the port in hex, such as 0100007F:1F90 for 127.0.0.1:8080.
func parseProcAddr(s string) (string, error) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	if !ok {
		return "", fmt.Errorf("no port in %q", s)
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return "", err
	}
	b, err := hex.DecodeString(ipHex)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return "", fmt.Errorf("bad address %q", s)
	}
	for w := 0; w < len(b); w += 4 { // each 32-bit word is little-endian
		b[w], b[w+1], b[w+2], b[w+3] = b[w+3], b[w+2], b[w+1], b[w]
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)).String(), nil
}

// pairCount is what the sockets of a set of processes say about their
// pairs.
type pairCount struct {
	Min, Max int // connections per pair, over every pair
	// Stray counts connection ends that touch a peer's listening address
	// (dialed to it, or accepted on it) but whose other end no process of
	// the set holds: a connection half closed, or leaked.
	Stray int
	// Bad lists the first pairs whose count is not one.
	Bad []string
}

// countPairs matches the sockets of processes ids (socks[i] is process i's)
// end to end and counts the connections between each pair of ids;
// listeners are the peers' listening addresses, past lives' included.
func countPairs(ids []int, socks map[int][]socket, listeners []string) pairCount {
	owner := map[socket]int{}
	for _, i := range ids {
		for _, s := range socks[i] {
			owner[s] = i
		}
	}
	isListener := map[string]bool{}
	for _, a := range listeners {
		isListener[a] = true
	}
	conns := map[[2]int]int{}
	ends := map[[2]int][]string{}
	stray := 0
	for _, i := range ids {
		for _, s := range socks[i] {
			j, ok := owner[socket{Local: s.Remote, Remote: s.Local}]
			switch {
			case ok && i < j:
				conns[[2]int{i, j}]++
				ends[[2]int{i, j}] = append(ends[[2]int{i, j}], s.Local+"-"+s.Remote)
			case !ok && (isListener[s.Remote] || isListener[s.Local]):
				stray++
			}
		}
	}
	pc := pairCount{Min: -1, Stray: stray}
	for a, i := range ids {
		for _, j := range ids[a+1:] {
			n := conns[[2]int{min(i, j), max(i, j)}]
			if pc.Min < 0 || n < pc.Min {
				pc.Min = n
			}
			pc.Max = max(pc.Max, n)
			if n != 1 && len(pc.Bad) < 5 {
				pc.Bad = append(pc.Bad, fmt.Sprintf("%d-%d: %d %v", i, j, n, ends[[2]int{min(i, j), max(i, j)}]))
			}
		}
	}
	return pc
}

// openFDs counts this process's open file descriptors, or returns -1 where
// /proc/self/fd does not exist.
func openFDs() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(entries) - 1 // the directory being read is one of them
}
