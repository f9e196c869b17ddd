package manifests

import "hash/maphash"

// keySet is a set of keys kept as 128-bit hashes of the keys (two 64-bit
// maphash values with independent seeds), 16 bytes a key instead of the
// key itself. Two keys that share both hashes are one member: a key that
// is not a member can then test as one, which at 128 bits does not happen
// in practice. The verifier uses it for the objects it has read, where a
// false member would skip a read.
type keySet struct {
	seeds [2]maphash.Seed
	m     map[[2]uint64]struct{}
}

func newKeySet() *keySet {
	return &keySet{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, m: map[[2]uint64]struct{}{}}
}

func (k *keySet) hash(key string) [2]uint64 {
	return [2]uint64{maphash.String(k.seeds[0], key), maphash.String(k.seeds[1], key)}
}

func (k *keySet) add(key string)      { k.m[k.hash(key)] = struct{}{} }
func (k *keySet) has(key string) bool { _, ok := k.m[k.hash(key)]; return ok }
