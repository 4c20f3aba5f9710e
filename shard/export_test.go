package shard

// LockShardOf locks the shard that holds key and returns its unlock: tests use
// it to show that readers never take that lock.
func (t *Table[K, V]) LockShardOf(key K) (unlock func()) {
	sh := t.shardOf(t.Hash(key))
	sh.mu.Lock()
	return sh.mu.Unlock
}

// Cells returns the length of key's shard's current array.
func (t *Table[K, V]) Cells(key K) int {
	return t.shardOf(t.Hash(key)).cells.Load().len()
}
