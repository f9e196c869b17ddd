package uploader

import (
	"strconv"
	"strings"

	"github.com/ckpt-io/ckpt/manifests"
)

// Confirmed is the set of shared objects an upload may reuse, by content:
// the objects named by the task's complete, retained manifests (invariant
// 3; see Request.Confirmed). It indexes the files of those manifests by
// size and the first 64 bits of their hash, and a lookup compares the
// whole digest: building the set from manifests of 100,000 files
// allocates nothing per file, and its index fits in caches a content id
// string map does not. Two contents that share size and 64 bits of hash
// (a chance of 2^-64) cost a reuse, never a wrong one: the second is not
// found and is uploaded again. A nil *Confirmed holds nothing. It is not
// safe for concurrent Adds.
type Confirmed struct {
	files map[contentKey]*manifests.File
}

// contentKey is what Confirmed indexes a content by.
type contentKey struct {
	size   int64
	prefix uint64
}

// NewConfirmed returns an empty set sized for about n objects.
func NewConfirmed(n int) *Confirmed {
	return &Confirmed{files: make(map[contentKey]*manifests.File, n)}
}

// Add records the object of *f, a file of a complete, retained manifest,
// if f is shared; Confirmed keeps f, which must not change. A later Add of
// the same content replaces the object (it may live under a fresh key;
// see AvoidMarked).
func (c *Confirmed) Add(f *manifests.File) {
	if f.Kind != manifests.Shared || f.Key == "" {
		return
	}
	if k, ok := keyOf(f); ok {
		c.files[k] = f
	}
}

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
	f := &manifests.File{Kind: manifests.Shared, Size: size, Key: key}
	f.SetDigest(id[:i])
	if !manifests.ValidDigest(f.Digest()) {
		return false
	}
	c.Add(f)
	return true
}

// Key returns the confirmed object holding the content of f (its digest
// and size).
func (c *Confirmed) Key(f *manifests.File) (string, bool) {
	if c == nil || len(c.files) == 0 {
		return "", false
	}
	k, ok := keyOf(f)
	if !ok {
		return "", false
	}
	g, ok := c.files[k]
	if !ok || g.SHA256 != f.SHA256 || g.BLAKE3 != f.BLAKE3 {
		return "", false
	}
	return g.Key, true
}

// Len is the number of contents in the set.
func (c *Confirmed) Len() int {
	if c == nil {
		return 0
	}
	return len(c.files)
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
