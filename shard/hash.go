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
	kindString                    // hash/maphash.String with the table's seed
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
)

// seeds holds a table's secret hash state, drawn once per table.
type seeds struct {
	a, b  uint64       // keys of the multiply-mix
	mapSd maphash.Seed // for kindComparable
}

func newSeeds() seeds {
	s := maphash.MakeSeed()
	// maphash is the runtime's random source; two distinct writes give two
	// independent 64-bit words without a math/rand dependency.
	return seeds{a: maphash.Bytes(s, []byte{1}) | 1, b: maphash.Bytes(s, []byte{2}), mapSd: s}
}

// mix is a seeded 64×64→128 multiply folded to 64 bits (the wyhash "mum").
// Every output bit depends on every input bit, so both the high bits (the
// shard) and the low bits (the cell) are usable. It inlines, and costs one
// MUL on amd64 and arm64.
func mix(x uint64, s *seeds) uint64 {
	return mixAB(x, s.a, s.b)
}

func mixAB(x, a, b uint64) uint64 {
	hi, lo := bits.Mul64(x^a^mixA, b^mixB)
	return hi ^ lo
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

// hashString is hash/maphash.String: the runtime's AES-based hash where the
// CPU has AES instructions (wyhash elsewhere), keyed by the table's seed.
//
// Not xxhash, although the project named it for strings, for two measured
// reasons. XXH64 takes no secret cheaply: the one-shot Sum64String is
// unseeded, and folding a seed in afterwards leaves every full 64-bit
// collision intact, which for XXH64 can be computed directly (each 8-byte
// lane is an invertible step, so the last lane of a key can be solved for
// any target state); the seeded Digest costs 21 ns a key against 5 ns here.
// And on the hit path xxhash cost 1.7 ns more a Get than maphash.String
// (1,024 peer names, Go 1.26, this project's 2-core machine). epcache's
// flood tests build such XXH64 collisions and show what they do to a table.
func hashString(s string, sd *seeds) uint64 {
	return maphash.String(sd.mapSd, s)
}

// sameString reports whether two string-kinded keys are the same string: the
// same bytes at the same address. Keys usually are (a peer's name comes from
// one table), and this inline check spares the hit path the call to compare
// the bytes; different strings still compare equal through ==.
func sameString[K comparable](a, b K) bool {
	sa, sb := stringOf(a), stringOf(b)
	return len(sa) == len(sb) && unsafe.StringData(sa) == unsafe.StringData(sb)
}
