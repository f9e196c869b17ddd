package uploader

import (
	"strconv"
	"strings"

	"github.com/ckpt-io/ckpt/manifests"
)

// Confirmed is the set of shared objects an upload may reuse, by content:
// the objects named by the task's complete, retained manifests (invariant
// 3; see Request.Confirmed). A content is held as its hash, algorithm and
// size, not as a content id string, so building the set from manifests of
// 100,000 files allocates nothing per file and a lookup hashes 48 bytes.
// A nil *Confirmed holds nothing. It is not safe for concurrent Adds.
type Confirmed struct {
	keys map[contentKey]string
}

// contentKey is a content id (manifests.ContentID) as a comparable value.
type contentKey struct {
	size int64
	alg  manifests.Alg
	sum  [32]byte
}

// NewConfirmed returns an empty set sized for about n objects.
func NewConfirmed(n int) *Confirmed {
	return &Confirmed{keys: make(map[contentKey]string, n)}
}

// Add records the object of f, a file of a complete, retained manifest,
// if f is shared. A later Add of the same content replaces the key (an
// object may live under a fresh key; see AvoidMarked).
func (c *Confirmed) Add(f *manifests.File) {
	if f.Kind != manifests.Shared || f.Key == "" {
		return
	}
	if k, ok := keyOf(f); ok {
		c.keys[k] = f.Key
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
	f := manifests.File{Size: size}
	f.SetDigest(id[:i])
	k, ok := keyOf(&f)
	if ok {
		c.keys[k] = key
	}
	return ok
}

// Key returns the confirmed object holding the content of f (its digest
// and size).
func (c *Confirmed) Key(f *manifests.File) (string, bool) {
	if c == nil || len(c.keys) == 0 {
		return "", false
	}
	k, ok := keyOf(f)
	if !ok {
		return "", false
	}
	key, ok := c.keys[k]
	return key, ok
}

// Len is the number of contents in the set.
func (c *Confirmed) Len() int {
	if c == nil {
		return 0
	}
	return len(c.keys)
}

// keyOf is the content key of f's digest and size; false when the digest
// is not 64 hex digits.
func keyOf(f *manifests.File) (contentKey, bool) {
	k := contentKey{size: f.Size, alg: manifests.SHA256}
	h := f.SHA256
	if f.BLAKE3 != "" {
		k.alg, h = manifests.BLAKE3, f.BLAKE3
	}
	if len(h) != 2*len(k.sum) {
		return contentKey{}, false
	}
	for i := range k.sum {
		hi, ok1 := unhex(h[2*i])
		lo, ok2 := unhex(h[2*i+1])
		if !ok1 || !ok2 {
			return contentKey{}, false
		}
		k.sum[i] = hi<<4 | lo
	}
	return k, true
}

// unhex decodes one lower-case hex digit, the only case a digest has.
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
