// Package fsutil holds the small file helpers the data paths share:
// durability (fsync of a file or a directory), streaming SHA-256 of a file
// or a reader, and the pool of 1 MiB buffers that hashing and copying read
// through. It depends on the standard library only, so that storage
// backends and the upload and restore paths can all import it.
package fsutil

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// BufSize is the size of a pooled buffer: large reads keep syscalls cheap.
const BufSize = 1 << 20

// bufs holds the 1 MiB buffers of hashing and copying workers: one per
// file would be a gigabyte of garbage per gigabyte read.
var bufs = sync.Pool{New: func() any { b := make([]byte, BufSize); return &b }}

// GetBuf takes a BufSize buffer from the pool; give it back with PutBuf.
func GetBuf() *[]byte { return bufs.Get().(*[]byte) }

// PutBuf returns a buffer taken with GetBuf to the pool.
func PutBuf(b *[]byte) { bufs.Put(b) }

// HashFile streams the file at path through SHA-256 and returns the hex
// digest and the number of bytes read. ctx is checked between reads. Read
// errors are wrapped as "hash <path>: ..."; an open error is returned as
// it is.
func HashFile(ctx context.Context, path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	return HashReader(ctx, f)
}

// HashReader streams r through SHA-256, from where it is to its end, and
// returns the hex digest and the number of bytes read: HashFile for a file
// the caller opened itself. ctx and read errors as in Stream.
func HashReader(ctx context.Context, r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := Stream(ctx, r, h)
	if err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Stream copies r, from where it is to its end, into h (a hash: its
// writes do not fail) through a pooled buffer and returns the number of
// bytes read. ctx is checked between reads, and its error returned as it
// is. Read errors are wrapped as "hash <name>: ..." (the name of an
// *os.File).
func Stream(ctx context.Context, r io.Reader, h io.Writer) (int64, error) {
	bp := GetBuf()
	defer PutBuf(bp)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, err := r.Read(*bp)
		h.Write((*bp)[:k])
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			if f, ok := r.(interface{ Name() string }); ok {
				return n, fmt.Errorf("hash %s: %w", f.Name(), err)
			}
			return n, fmt.Errorf("hash: %w", err)
		}
	}
}

// SyncFile fsyncs the file at p.
func SyncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// SyncDir fsyncs the directory dir, so that the entries created, renamed
// or removed in it are durable. A filesystem that cannot sync directories
// (EINVAL) is not an error.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return SyncOpenDir(d)
}

// SyncOpenDir is SyncDir for a directory the caller has open, for code
// that works through directory handles rather than paths.
func SyncOpenDir(d *os.File) error {
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}
