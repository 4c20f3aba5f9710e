package shard

// LockShardOf locks the shard that holds key and returns its unlock: tests use
// it to show that readers never take that lock.
func (t *Table[K, V]) LockShardOf(key K) (unlock func()) {
	sh := t.shardOf(t.Hash(key))
	sh.mu.Lock()
	return sh.mu.Unlock
}

// Cells returns the number of slots of key's shard's current array.
func (t *Table[K, V]) Cells(key K) int {
	return int(t.shardOf(t.Hash(key)).cells.Load().capacity())
}

// RebuildsOnInsert reports whether inserting a new key into key's shard
// would rebuild the shard's array.
func (t *Table[K, V]) RebuildsOnInsert(key K) bool {
	sh := t.shardOf(t.Hash(key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return uint64(sh.used+1)*maxLoadDen > sh.cells.Load().capacity()*maxLoadNum
}
