package uploader

import (
	"strconv"
	"strings"

	"github.com/ckpt-io/ckpt/manifests"
)

// Confirmed is the set of shared objects an upload may reuse, by content:
// the objects named by the task's complete, retained manifests (invariant
// 3; see Request.Confirmed). It holds the manifests' file tables as they
// are, so making one costs nothing per file; an upload indexes only the
// files of the sizes it looks up (a content id includes the size), by
// size and the first 64 bits of the hash, and compares the whole digest
// on a hit. Two contents that share size and 64 bits of hash (a chance of
// 2^-64) cost a reuse, never a wrong one: the one not indexed is uploaded
// again. A nil *Confirmed holds nothing. Adds must precede its use.
type Confirmed struct {
	sources [][]manifests.File
	added   []manifests.File // by Add and AddID, after sources
}

// contentKey is what Confirmed indexes a content by.
type contentKey struct {
	size   int64
	prefix uint64
}

// NewConfirmed returns an empty set.
func NewConfirmed() *Confirmed { return &Confirmed{} }

// AddFiles records the shared objects of files, the file table of a
// complete, retained manifest, which must not change afterwards. Of two
// files of the same content, the one added later wins (its object may
// live under a fresh key; see AvoidMarked).
func (c *Confirmed) AddFiles(files []manifests.File) { c.sources = append(c.sources, files) }

// Add records the object of f, a file of a complete, retained manifest,
// if f is shared. Objects added so are looked at after those of AddFiles.
func (c *Confirmed) Add(f *manifests.File) { c.added = append(c.added, *f) }

// AddID records key as the object of the content id (manifests.ContentID
// of a digest and a size); false, recording nothing, when id is malformed.
func (c *Confirmed) AddID(id, key string) bool {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return false
	}
	size, err := strconv.ParseInt(id[i+1:], 10, 64)
	if err != nil {
		return false
	}
	f := manifests.File{Kind: manifests.Shared, Size: size, Key: key}
	f.SetDigest(id[:i])
	if !manifests.ValidDigest(f.Digest()) {
		return false
	}
	c.Add(&f)
	return true
}

// Key returns the confirmed object holding the content of f (its digest
// and size). It indexes the set for f's size at each call: an upload uses
// an index of its own (see index).
func (c *Confirmed) Key(f *manifests.File) (string, bool) {
	return lookup(c.index(map[int64]bool{f.Size: true}), f)
}

// index returns the set's objects of the given sizes (all when sizes is
// nil) by contentKey. Its cost is a look at the size of each file of the
// set, and an entry for each file of one of those sizes.
func (c *Confirmed) index(sizes map[int64]bool) map[contentKey]*manifests.File {
	if c == nil {
		return nil
	}
	idx := map[contentKey]*manifests.File{}
	add := func(files []manifests.File) {
		for i := range files {
			f := &files[i]
			if f.Kind != manifests.Shared || f.Key == "" || (sizes != nil && !sizes[f.Size]) {
				continue
			}
			if k, ok := keyOf(f); ok {
				idx[k] = f
			}
		}
	}
	for _, files := range c.sources {
		add(files)
	}
	add(c.added)
	return idx
}

// lookup returns the key of the object of idx holding f's content.
func lookup(idx map[contentKey]*manifests.File, f *manifests.File) (string, bool) {
	if len(idx) == 0 {
		return "", false
	}
	k, ok := keyOf(f)
	if !ok {
		return "", false
	}
	g, ok := idx[k]
	if !ok || g.SHA256 != f.SHA256 || g.BLAKE3 != f.BLAKE3 {
		return "", false
	}
	return g.Key, true
}

// keyOf is the index key of f's digest and size; false when the digest
// does not start with 16 lower-case hex digits (Key compares the rest).
// The algorithm is mixed into the prefix, so the contents of the two
// kinds stay apart in the index too.
func keyOf(f *manifests.File) (contentKey, bool) {
	h, mix := f.SHA256, uint64(0)
	if f.BLAKE3 != "" {
		h, mix = f.BLAKE3, blake3Mix
	}
	if len(h) < 16 {
		return contentKey{}, false
	}
	k := contentKey{size: f.Size}
	for i := range 16 {
		v := unhex[h[i]]
		if v > 15 {
			return contentKey{}, false
		}
		k.prefix = k.prefix<<4 | uint64(v)
	}
	k.prefix ^= mix
	return k, true
}

// blake3Mix is XORed into the index key of a BLAKE3 digest.
const blake3Mix = 0x9e3779b97f4a7c15

// unhex maps a lower-case hex digit, the only case a digest has, to its
// value, anything else to 0xff.
var unhex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789abcdef" {
		t[c] = byte(i)
	}
	return t
}()
