package shard

import (
	"hash/maphash"
	"math/bits"
	"reflect"
	"unsafe"
)

// keyKind selects the built-in hash for a key type. It is decided once, in
// [New], from the key type's underlying kind, so that named types such as
// `type Rank uint32` take the fast path too.
type keyKind uint8

const (
	kindComparable keyKind = iota // maphash.Comparable: structs, pointers, arrays, interfaces, floats…
	kindInteger                   // every integer kind up to 64 bits: seeded multiply-mix
	kindString                    // hashString: wyhash-style up to 64 bytes, hash/maphash.String beyond
	kindCustom                    // the caller's Options.Hash
)

func kindOf[K comparable]() keyKind {
	switch reflect.TypeFor[K]().Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return kindInteger
	case reflect.String:
		return kindString
	default:
		return kindComparable
	}
}

// The two odd constants are wyhash's; any pair of odd, dense 64-bit values
// works. They are XORed with the per-table seed so that the mix itself is
// secret: bucket collisions crafted against one table do not carry over.
const (
	mixA = 0xa0761d6478bd642f
	mixB = 0xe7037ed1a0b428db
	mixC = 0x1d8e4e27c47d124f // the runtime's m5: the length enters the last multiply
)

// seeds holds a table's secret hash state, drawn once per table.
type seeds struct {
	ka, kb uint64       // keys of the integer multiply-mix, the constants folded in
	s0, s1 uint64       // keys of the short-string hash
	mapSd  maphash.Seed // for long strings and kindComparable
}

func newSeeds() seeds {
	s := maphash.MakeSeed()
	// maphash is the runtime's random source; distinct writes give
	// independent 64-bit words without a math/rand dependency.
	word := func(b byte) uint64 { return maphash.Bytes(s, []byte{b}) }
	return seeds{
		ka: (word(1) | 1) ^ mixA, kb: word(2) ^ mixB,
		s0: word(3), s1: word(4),
		mapSd: s,
	}
}

// mix is a seeded 64×64→128 multiply folded to 64 bits (the wyhash "mum").
// Every output bit depends on every input bit, so both the high bits (the
// group) and the low bits (the shard) are usable. It inlines, and costs one
// MUL on amd64 and arm64.
func mix[W ~uint64](x W, s *seeds) uint64 {
	return mum(uint64(x)^s.ka, s.kb)
}

// mum is the 64×64→128 multiply folded to 64 bits. (W: see tagOf.)
func mum[W ~uint64](a, b W) W {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return W(hi ^ lo)
}

// integerBits widens an integer-kinded key to 64 bits. The caller has checked
// with kindOf that K's underlying kind is an integer.
//
// Safety: K's underlying type is an integer of unsafe.Sizeof(k) bytes, so
// reading that many bytes at &k is reading k itself. The size switch is
// constant for each instantiated shape and folds away.
func integerBits[K comparable](k K) uint64 {
	switch unsafe.Sizeof(k) {
	case 8:
		return *(*uint64)(unsafe.Pointer(&k))
	case 4:
		return uint64(*(*uint32)(unsafe.Pointer(&k)))
	case 2:
		return uint64(*(*uint16)(unsafe.Pointer(&k)))
	default:
		return uint64(*(*uint8)(unsafe.Pointer(&k)))
	}
}

// stringOf returns a string-kinded key as a string.
//
// Safety: the caller has checked with kindOf that K's underlying type is
// string, so K and string share one memory layout.
func stringOf[K comparable](k K) string {
	return *(*string)(unsafe.Pointer(&k))
}

// shortString is the longest string hashString hashes itself; longer ones
// go to hash/maphash.String, whose AES rounds win on long inputs.
const shortString = 64

// hashString hashes a string-kinded key with the table's secrets. Strings of
// up to 64 bytes, the peer names and addresses endpoint caches are keyed by,
// are hashed here with the construction of the Go runtime's own map hash
// where the CPU has no AES instructions (wyhash: 16-byte lanes folded by
// 64×64→128 multiplies, keyed by secrets drawn per table); longer ones by
// hash/maphash.String with the table's seed.
//
// Why not maphash.String for all: on peer names of 16 to 19 bytes it takes
// about 5 ns a key against this one's 2.3, half of a whole string hit
// (BenchmarkHit, keys=string). Why not xxhash: XXH64 takes no secret
// cheaply. The one-shot Sum64String is unseeded, and folding a seed
// in afterwards leaves every full 64-bit collision intact, which for XXH64
// can be computed directly (each 8-byte lane is an invertible step, so the
// last lane of a key can be solved for any target state); the seeded Digest
// costs 21 ns a key. epcache's flood tests build such XXH64 collisions and
// show what they do to a table. Here the secrets enter every lane before
// its multiply, so that without them no lane can be solved for.
func hashString(s string, sd *seeds) uint64 {
	n := uint64(len(s))
	if n > shortString {
		return maphash.String(sd.mapSd, s)
	}
	// Safety: every read below lies within the n bytes at p: 1-byte reads at
	// 0, n/2 and n-1 for n < 4; 4-byte reads at 0 and n-4 for 4 ≤ n < 8;
	// 8-byte reads at 0 and n-8 for 8 ≤ n ≤ 16; and for n > 16, 8-byte
	// reads at p+0 and p+8 while more than 16 bytes remain past p, then at
	// the last 16 bytes.
	p := unsafe.Pointer(unsafe.StringData(s))
	seed := sd.s0
	var a, b uint64
	switch {
	case n == 0:
		return mum(seed, sd.s1)
	case n < 4:
		a = uint64(*(*byte)(p)) | uint64(*(*byte)(unsafe.Add(p, n>>1)))<<8 | uint64(*(*byte)(unsafe.Add(p, n-1)))<<16
	case n < 8:
		a = r4(p)
		b = r4(unsafe.Add(p, n-4))
	case n <= 16: // Table.Get has its own copy of this case and the next, to 32 bytes
		a = r8[uint64](p)
		b = r8[uint64](unsafe.Add(p, n-8))
	default:
		l := n
		for ; l > 16; l -= 16 {
			seed = mum(r8[uint64](p)^sd.s1, r8[uint64](unsafe.Add(p, 8))^seed)
			p = unsafe.Add(p, 16)
		}
		a = r8[uint64](unsafe.Add(p, l-16))
		b = r8[uint64](unsafe.Add(p, l-8))
	}
	return mum(mixC^n, mum(a^sd.s1, b^seed))
}

// r8 and r4 read 8 and 4 little-endian bytes at p, aligned or not. The
// compiler turns each into one load where the CPU allows unaligned loads
// (amd64, arm64, 386), and into byte loads where it does not, as the
// runtime's readUnaligned64 is.
//
// r8 is generic (W: see tagOf) because Get calls it; r4 is not, since only
// hashString, compiled here, does.
func r8[W ~uint64](p unsafe.Pointer) W {
	q := (*[8]byte)(p)
	return W(q[0]) | W(q[1])<<8 | W(q[2])<<16 | W(q[3])<<24 |
		W(q[4])<<32 | W(q[5])<<40 | W(q[6])<<48 | W(q[7])<<56
}

func r4(p unsafe.Pointer) uint64 {
	q := (*[4]byte)(p)
	return uint64(q[0]) | uint64(q[1])<<8 | uint64(q[2])<<16 | uint64(q[3])<<24
}

// sameString reports whether two string-kinded keys are the same string: the
// same bytes at the same address. Keys usually are (a peer's name comes from
// one table), and this inline check spares the hit path the call to compare
// the bytes; different strings still compare equal through ==.
func sameString[K comparable](a, b K) bool {
	sa, sb := stringOf(a), stringOf(b)
	return len(sa) == len(sb) && unsafe.StringData(sa) == unsafe.StringData(sb)
}
