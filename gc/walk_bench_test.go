package gc

import (
	"fmt"
	"testing"

	"github.com/ckpt-io/ckpt/manifests"
)

// largeManifest is a format 2 manifest of n shared files, as ckpt writes
// them (sorted names, BLAKE3 ids).
func largeManifest(b *testing.B, n int) []byte {
	b.Helper()
	m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: 1}
	for i := range n {
		name := fmt.Sprintf("%07d.sst", i)
		f := manifests.File{Name: name, Kind: manifests.Shared, Size: int64(4096 + i)}
		f.SetDigest(manifests.SumBytes(manifests.BLAKE3, []byte(name)))
		f.Key = manifests.SharedKey(m.Job, f.Digest(), f.Size)
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	enc, err := m.Encode(0)
	if err != nil {
		b.Fatal(err)
	}
	return enc
}

// BenchmarkReadKeys compares what GC, list and verify paid to read the
// keys of a manifest of 100,000 files (Decode) with what they pay now
// (Walk): time and bytes allocated per manifest.
func BenchmarkReadKeys(b *testing.B) {
	enc := largeManifest(b, 100000)
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m, err := manifests.Decode(enc)
			if err != nil {
				b.Fatal(err)
			}
			live := newLiveSet()
			for _, f := range m.Files {
				live.add([]byte(f.Key))
			}
		}
	})
	b.Run("walk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			live := newLiveSet()
			if _, _, err := manifests.Walk(enc, func(f *manifests.FileView) error { live.add(f.Key); return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
