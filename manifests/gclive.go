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

// liveSet is GC's live set: the keys retained manifests name, kept as a
// 64-bit maphash each (about 10 to 20 bytes a key in the map), so that the
// live set of a job of millions of objects is a few MB. A false member is
// an unreferenced object GC keeps: the error is only ever on the safe side
// (never a live object deleted), and with a fresh random seed per
// collection it does not repeat. At a million live keys, a given garbage
// object is kept by mistake with probability about 5e-14.
type liveSet struct {
	seed maphash.Seed
	m    map[uint64]struct{}
}

func newLiveSet() *liveSet { return &liveSet{seed: maphash.MakeSeed(), m: map[uint64]struct{}{}} }

// add adds a key held as bytes; has asks for one held as a string, which
// hashes the same (maphash.Bytes and maphash.String agree).
func (l *liveSet) add(key []byte)      { l.m[maphash.Bytes(l.seed, key)] = struct{}{} }
func (l *liveSet) has(key string) bool { _, ok := l.m[maphash.String(l.seed, key)]; return ok }

// markSeeds hash the candidates of GC's marks, the same in every mark a
// process reads, so that the sets of many marks can be joined.
var markSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

// markedSet holds the candidates of marks as 128-bit hashes of their keys
// (16 bytes a key, not the key). A key that is not a member could test as
// one only if it shared both 64-bit hashes with a member, which at 128
// bits does not happen in practice: a writer would then store its object
// under a fresh key (harmless), or GC delete an unreferenced object a mark
// did not name (its live set is checked first).
type markedSet map[[2]uint64]struct{}

func markHash(key string) [2]uint64 {
	return [2]uint64{maphash.String(markSeeds[0], key), maphash.String(markSeeds[1], key)}
}

func (s markedSet) add(key string) { s[markHash(key)] = struct{}{} }
func (s markedSet) has(key string) bool {
	if len(s) == 0 {
		return false // nothing marked: no hash to compute
	}
	_, ok := s[markHash(key)]
	return ok
}

// join adds the members of o to s.
func (s markedSet) join(o markedSet) {
	for h := range o {
		s[h] = struct{}{}
	}
}
