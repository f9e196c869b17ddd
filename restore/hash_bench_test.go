package restore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// BenchmarkVerifiedRestore restores 16 random 16 MiB SSTs, checkpointed in
// each manifest format, from the local copy (every byte hashed, no
// identity shortcut) and from file:// storage (every byte copied and
// hashed): go test -run '^$' -bench VerifiedRestore ./restore/. The
// formats differ only in the hash of their files (SHA-256, BLAKE3).
func BenchmarkVerifiedRestore(b *testing.B) {
	const files, size = 16, 16 << 20
	base := b.TempDir()
	snap := filepath.Join(base, "snap")
	os.MkdirAll(snap, 0o755)
	buf := make([]byte, size)
	for i := range files {
		rand.Read(buf)
		os.WriteFile(filepath.Join(snap, fmt.Sprintf("%06d.sst", i+1)), buf, 0o644)
	}
	os.WriteFile(filepath.Join(snap, "CURRENT"), []byte("MANIFEST-000001\n"), 0o644)
	for _, format := range []int{manifests.Format1, manifests.Format2} {
		dir := filepath.Join(base, fmt.Sprint("f", format))
		os.MkdirAll(filepath.Join(dir, "store"), 0o755)
		store, err := file.New(filepath.Join(dir, "store"))
		if err != nil {
			b.Fatal(err)
		}
		local, err := localrecovery.Open(filepath.Join(base, "local"+fmt.Sprint(format)), "job")
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		sn, err := local.Take("t", 1, snap, false)
		if err == nil {
			err = sn.Inspect()
		}
		if err != nil {
			b.Fatal(err)
		}
		alg := manifests.BLAKE3
		if format == manifests.Format1 {
			alg = manifests.SHA256
		}
		res, err := uploader.Upload(ctx, uploader.Request{Store: store, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn, Alg: alg})
		if err != nil {
			b.Fatal(err)
		}
		m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: 1, Created: time.Now(), Files: res.Files, Format: format}
		for _, f := range res.Files {
			m.FullSize += f.Size
		}
		enc, _ := m.Encode(res.BytesWritten)
		if err := manifests.Commit(ctx, store, m, enc); err != nil {
			b.Fatal(err)
		}
		if _, err := local.Complete("t", 1, m, enc); err != nil {
			b.Fatal(err)
		}
		for _, source := range []string{"local", "remote"} {
			b.Run(fmt.Sprintf("format=%d/%s", format, source), func(b *testing.B) {
				b.SetBytes(m.FullSize)
				i := 0
				for b.Loop() {
					i++
					o := restore.Options{Store: store, Job: "job", Task: "t", Target: filepath.Join(dir, fmt.Sprint("target", i))}
					if source == "local" {
						o.LocalDir = filepath.Join(base, "local"+fmt.Sprint(format))
					}
					r, err := restore.Run(ctx, o)
					if err != nil {
						b.Fatal(err)
					}
					r.Wait()
					if (source == "local") != (r.BytesLocal == m.FullSize) {
						b.Fatalf("restored %d bytes locally of %d", r.BytesLocal, m.FullSize)
					}
					b.StopTimer()
					os.RemoveAll(o.Target)
					b.StartTimer()
				}
			})
		}
	}
}
