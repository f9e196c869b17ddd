package manifests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"

	"github.com/zeebo/blake3"

	"github.com/ckpt-io/ckpt/internal/fsutil"
)

// Every check of a file's bytes against a manifest goes through this file:
// the algorithm is recorded per file, so a job may hold content ids of both
// kinds, and a verifier asks the file which hash to compute (f.NewHasher)
// and whether the result matches (f.Check).
//
// A digest is a hash with its algorithm, as one string:
//
//	<64 hex>      SHA-256 (the only kind format 1 knows)
//	b3-<64 hex>   BLAKE3-256 (format 2's default)
//
// A content id is "<digest>-<size>", so the keys of the two kinds never
// collide: a SHA-256 id starts with 64 hex digits, a BLAKE3 id with "b3-".

// Alg is a content hash algorithm.
type Alg uint8

const (
	// SHA256 is SHA-256: format 1's hash, still read, verified and reused.
	SHA256 Alg = iota + 1
	// BLAKE3 is BLAKE3 with a 256-bit output: format 2's default, several
	// times faster than SHA-256 per core on CPUs with wide vector units.
	BLAKE3
)

// blake3Prefix starts every BLAKE3 digest.
const blake3Prefix = "b3-"

// String is the algorithm's name as errors and manifests spell it.
func (a Alg) String() string {
	switch a {
	case SHA256:
		return "sha256"
	case BLAKE3:
		return "blake3"
	}
	return fmt.Sprintf("alg(%d)", uint8(a))
}

// AlgOf returns the algorithm of a digest (SHA256 for a bare hex digest).
func AlgOf(digest string) Alg {
	if strings.HasPrefix(digest, blake3Prefix) {
		return BLAKE3
	}
	return SHA256
}

// hexOf returns the hex part of a digest.
func hexOf(digest string) string { return strings.TrimPrefix(digest, blake3Prefix) }

// digestOf formats a hex sum of alg as a digest.
func digestOf(alg Alg, hexSum string) string {
	if alg == BLAKE3 {
		return blake3Prefix + hexSum
	}
	return hexSum
}

// ValidDigest reports whether d is a well-formed digest: an algorithm this
// build knows and 64 lower-case hex digits.
func ValidDigest(d string) bool { return validSHA(hexOf(d)) }

// Hasher is a streaming hash of one algorithm; Digest formats its sum.
type Hasher struct {
	hash.Hash
	alg Alg
}

// NewHasher returns a streaming hash of alg. An unknown alg hashes with
// SHA-256 (the digest then names SHA-256, so it matches nothing else).
func NewHasher(alg Alg) *Hasher {
	if alg == BLAKE3 {
		return &Hasher{Hash: blake3.New(), alg: BLAKE3}
	}
	return &Hasher{Hash: sha256.New(), alg: SHA256}
}

// Digest returns the digest of what was written so far.
func (h *Hasher) Digest() string { return digestOf(h.alg, hex.EncodeToString(h.Sum(nil))) }

// SumBytes returns the digest of b under alg.
func SumBytes(alg Alg, b []byte) string {
	if alg == BLAKE3 {
		sum := blake3.Sum256(b)
		return blake3Prefix + hex.EncodeToString(sum[:])
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Digest returns the file's digest: "b3-<hex>" when it carries a BLAKE3
// hash, else its SHA-256 hex.
func (f File) Digest() string {
	if f.BLAKE3 != "" {
		return blake3Prefix + f.BLAKE3
	}
	return f.SHA256
}

// SetDigest records d as the file's hash, in the field of its algorithm.
func (f *File) SetDigest(d string) {
	if AlgOf(d) == BLAKE3 {
		f.BLAKE3, f.SHA256 = hexOf(d), ""
		return
	}
	f.SHA256, f.BLAKE3 = d, ""
}

// Alg is the algorithm of the file's hash.
func (f File) Alg() Alg { return AlgOf(f.Digest()) }

// NewHasher returns a streaming hash of the file's algorithm: what a
// verifier writes the file's bytes to before calling Check.
func (f File) NewHasher() *Hasher { return NewHasher(f.Alg()) }

// Check compares a digest computed from the file's bytes (same algorithm)
// with the manifest's. The error names the algorithm and both sums.
func (f File) Check(got string) error {
	if want := f.Digest(); got != want {
		return fmt.Errorf("%s %s does not match the manifest's %s", f.Alg(), hexOf(got), hexOf(want))
	}
	return nil
}

// HashFile streams the file at path through alg and returns its digest
// and the number of bytes read. ctx is checked between reads.
func HashFile(ctx context.Context, path string, alg Alg) (string, int64, error) {
	fh, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer fh.Close()
	return HashReader(ctx, fh, alg)
}

// HashReader streams r, from where it is to its end, through alg and
// returns the digest and the number of bytes read. ctx is checked between
// reads and its error returned as it is; read errors name the file when r
// is one.
func HashReader(ctx context.Context, r io.Reader, alg Alg) (string, int64, error) {
	h := NewHasher(alg)
	n, err := fsutil.Stream(ctx, r, h)
	if err != nil {
		return "", n, err
	}
	return h.Digest(), n, nil
}
