package etcddir

import (
	"fmt"
	"strconv"
	"strings"
)

// keyFormat names the key format in the key itself (see "Keys" in the
// package doc): a reader that finds another version under the prefix says
// so, rather than taking the key for garbage or for a peer.
const keyFormat = "v2"

// peerDigits is the width of a peer number in a key: directory.MaxSize,
// 2^31-1, has ten digits.
const peerDigits = 10

// Key returns the key under which peer publishes its address in the job
// of prefix: prefix + "v2/" + peer in ten digits, zero-padded, so that the
// order of keys is the order of peers and a range of peers is a range of
// keys. For operators and tests; a [Directory] computes it itself.
func Key(prefix string, peer int) string {
	return prefix + keyFormat + "/" + pad(peer)
}

// FenceKey returns the key of the job's fence (see [Directory.Fence]):
// prefix + "v2/fence", outside the range of the peers' keys.
func FenceKey(prefix string) string { return prefix + keyFormat + "/fence" }

func pad(peer int) string {
	s := strconv.Itoa(peer)
	if len(s) >= peerDigits {
		return s
	}
	return strings.Repeat("0", peerDigits-len(s)) + s
}

func (d *Directory) key(peer int) string { return Key(d.opts.Prefix, peer) }

// peerRange returns the keys of peers lo to hi-1: [start, end).
func (d *Directory) peerRange(lo, hi int) (start, end string) {
	return d.key(lo), d.key(hi)
}

// oldRange returns the range that holds every key of the old format
// (prefix + a peer in decimal, unpadded): the keys that begin with a digit.
func (d *Directory) oldRange() (start, end string) {
	return d.opts.Prefix + "0", d.opts.Prefix + ":" // ':' follows '9'
}

// oldKey returns the key under which an etcddir of the old format (before
// format v2) published peer.
func (d *Directory) oldKey(peer int) string { return d.opts.Prefix + strconv.Itoa(peer) }

// keyKind classifies a key under the prefix.
type keyKind int

const (
	kindPeer    keyKind = iota // a peer's key of this format, in range
	kindFence                  // the job's fence
	kindOld                    // a peer's key of the old format, in range
	kindGarbled                // anything else: why says what is wrong
)

// parseKey classifies key, which a read or a watch of the prefix returned.
func (d *Directory) parseKey(key []byte) (peer int, kind keyKind, why string) {
	rest, ok := strings.CutPrefix(string(key), d.opts.Prefix)
	if !ok {
		return 0, kindGarbled, "not under the prefix"
	}
	if tail, ok := strings.CutPrefix(rest, keyFormat+"/"); ok {
		if tail == "fence" {
			return 0, kindFence, ""
		}
		if len(tail) != peerDigits || !allDigits(tail) {
			return 0, kindGarbled, fmt.Sprintf("a key of format %s ends in a peer of %d digits, zero-padded", keyFormat, peerDigits)
		}
		n, err := strconv.Atoi(tail)
		if err != nil || n >= d.opts.Size {
			return 0, kindGarbled, fmt.Sprintf("peer %s is out of range (peers are 0 to %d)", tail, d.opts.Size-1)
		}
		return n, kindPeer, ""
	}
	if allDigits(rest) && rest != "" {
		n, err := strconv.Atoi(rest)
		if err != nil || n >= d.opts.Size || strconv.Itoa(n) != rest {
			return 0, kindGarbled, fmt.Sprintf("a key of the old format names peer %q, not one of 0 to %d", rest, d.opts.Size-1)
		}
		return n, kindOld, ""
	}
	if v, _, ok := strings.Cut(rest, "/"); ok && len(v) > 1 && v[0] == 'v' && allDigits(v[1:]) {
		return 0, kindGarbled, fmt.Sprintf("key format %s, which this etcddir (format %s) cannot read: every process of a job must use the same key format", v, keyFormat)
	}
	return 0, kindGarbled, "not a key of etcddir"
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// oldFormatError is the answer for a peer that published under the old
// key format: a process of the job runs an etcddir from before format v2.
func (d *Directory) oldFormatError(peer int) error {
	return fmt.Errorf("etcddir: peer %d published under the old key format (key %q, etcddir before key format %s); this process reads format %s (key %q): every process of a job must use the same key format",
		peer, d.oldKey(peer), keyFormat, keyFormat, d.key(peer))
}
