package manifests

import "hash/maphash"

// keySet is a set of object keys kept as 128-bit hashes of the keys (two
// 64-bit maphash values with independent seeds), 16 bytes a key instead of
// the key itself: GC's live set for a job of millions of objects fits in
// tens of MB. Two keys that share both hashes are one member: a key that
// is not a member can then test as one. For GC that errs on the safe side
// (an unreferenced object is kept, never a live one deleted), and at 128
// bits it does not happen in practice.
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

func (k *keySet) add(key string) { k.m[k.hash(key)] = struct{}{} }

// addBytes is add of a key held as bytes (the same member as the string).
func (k *keySet) addBytes(key []byte) {
	k.m[[2]uint64{maphash.Bytes(k.seeds[0], key), maphash.Bytes(k.seeds[1], key)}] = struct{}{}
}

func (k *keySet) has(key string) bool { _, ok := k.m[k.hash(key)]; return ok }
