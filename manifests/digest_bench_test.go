package manifests

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckpt-io/ckpt/internal/fsutil"
)

// The controls of docs/performance.md ("Content hash, format 2"): the raw
// speed of each algorithm in memory, on one core and on every core
// (go test -bench Hash -cpu 1,2), and the page-cache read that bounds any
// hash of a local file.

var benchBuf = func() []byte {
	b := make([]byte, 16<<20)
	for i := range b {
		b[i] = byte(i*7 + i>>11)
	}
	return b
}()

func benchmarkSum(b *testing.B, alg Alg) {
	b.SetBytes(int64(len(benchBuf)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h := NewHasher(alg)
			h.Write(benchBuf)
			h.Digest()
		}
	})
}

func BenchmarkHashMemorySHA256(b *testing.B) { benchmarkSum(b, SHA256) }
func BenchmarkHashMemoryBLAKE3(b *testing.B) { benchmarkSum(b, BLAKE3) }

// cachedFile writes a 64 MiB file and reads it once, so that it is in the
// page cache.
func cachedFile(b *testing.B) string {
	p := filepath.Join(b.TempDir(), "000001.sst")
	big := make([]byte, 0, 64<<20)
	for len(big) < 64<<20 {
		big = append(big, benchBuf...)
	}
	if err := os.WriteFile(p, big, 0o644); err != nil {
		b.Fatal(err)
	}
	readAll(b, p)
	return p
}

func readAll(b *testing.B, p string) {
	f, err := os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	bp := fsutil.GetBuf()
	defer fsutil.PutBuf(bp)
	if _, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, *bp); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkHashFileReadOnly is the control: reading a cached file with the
// buffer every hash of a file uses, hashing nothing.
func BenchmarkHashFileReadOnly(b *testing.B) {
	p := cachedFile(b)
	b.SetBytes(64 << 20)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			readAll(b, p)
		}
	})
}

func benchmarkHashFile(b *testing.B, alg Alg) {
	p := cachedFile(b)
	b.SetBytes(64 << 20)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := HashFile(context.Background(), p, alg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkHashFileSHA256(b *testing.B) { benchmarkHashFile(b, SHA256) }
func BenchmarkHashFileBLAKE3(b *testing.B) { benchmarkHashFile(b, BLAKE3) }
