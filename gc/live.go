package gc

import (
	"hash/maphash"
	"slices"
)

// liveSet is GC's live set: the keys retained manifests name, kept as a
// 64-bit maphash each in a slice that is sorted and rid of duplicates when
// it fills and once every key is in (8 bytes a live key, about half of a
// map's), so that the live set of a job of a million objects is a few MB.
// A false member is an unreferenced object GC keeps: the error is only
// ever on the safe side (never a live object deleted), and with a fresh
// random seed per collection it does not repeat. At a million live keys,
// a given garbage object is kept by mistake with probability about 5e-14.
// Keys are added first, then asked about.
type liveSet struct {
	seed   maphash.Seed
	h      []uint64
	sorted bool // h is sorted, without duplicates
}

func newLiveSet() *liveSet { return &liveSet{seed: maphash.MakeSeed()} }

// liveCompactFrom is the size from which a full live set is compacted
// before it grows: below it, append's growth is cheaper than sorting.
const liveCompactFrom = 1 << 16

// add adds a key held as bytes.
func (l *liveSet) add(key []byte) {
	if len(l.h) == cap(l.h) && len(l.h) >= liveCompactFrom {
		l.compact()
		if len(l.h) > cap(l.h)/2 { // mostly distinct keys: room for as many again
			h := make([]uint64, len(l.h), 2*len(l.h))
			copy(h, l.h)
			l.h = h
		}
	}
	l.h = append(l.h, maphash.Bytes(l.seed, key))
	l.sorted = false
}

// compact sorts the hashes and drops duplicates.
func (l *liveSet) compact() {
	slices.Sort(l.h)
	l.h = slices.Compact(l.h)
	l.sorted = true
}

// has asks for a key held as a string, which hashes as the same bytes do
// (maphash.Bytes and maphash.String agree). The first call after adds
// compacts the set, and gives back the room it no longer needs.
func (l *liveSet) has(key string) bool {
	if !l.sorted {
		l.compact()
		if cap(l.h)-len(l.h) > len(l.h)/4 {
			l.h = slices.Clone(l.h)
		}
	}
	_, ok := slices.BinarySearch(l.h, maphash.String(l.seed, key))
	return ok
}

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
