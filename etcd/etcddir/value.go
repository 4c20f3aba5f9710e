package etcddir

import (
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// lifeTag begins a value that names its life: "epcache-life=<revision>
// <address>" (see the package doc). Publish writes the bare address, whose
// life is the key's ModRevision; a republication after a lost lease keeps
// the life of the Publish it repeats, which its own ModRevision no longer
// says, so it writes the tag.
const lifeTag = "epcache-life="

// tagged returns the value that republishes addr for the life born at
// revision life.
func tagged(addr string, life int64) string {
	return lifeTag + strconv.FormatInt(life, 10) + " " + addr
}

// decode returns the address kv's value holds and the life it belongs to.
// A value that begins with the tag but does not go on as one is an error,
// with the key's ModRevision as its life: garbage written over a key is a
// life of its own, newer than every life before it.
func decode(kv *mvccpb.KeyValue) (addr string, life int64, err error) {
	v := string(kv.Value)
	rest, isTagged := strings.CutPrefix(v, lifeTag)
	if !isTagged {
		return v, kv.ModRevision, nil
	}
	num, addr, ok := strings.Cut(rest, " ")
	life, perr := strconv.ParseInt(num, 10, 64)
	if !ok || perr != nil || life <= 0 || life > kv.ModRevision || strconv.FormatInt(life, 10) != num {
		return "", kv.ModRevision, fmt.Errorf("the value %q begins with %q but not with a revision up to %d and a space", v, lifeTag, kv.ModRevision)
	}
	return addr, life, nil
}
