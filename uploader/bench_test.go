package uploader_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// BenchmarkUploadLarge uploads a snapshot of new shared files larger than
// the size read whole (4 MiB), so each is identified by a streaming hash
// and then sent, to file:// storage: the path of a compaction's output.
// It reports the throughput in the snapshot's bytes.
func BenchmarkUploadLarge(b *testing.B) {
	const files, size = 4, 64 << 20
	base := b.TempDir()
	dir := filepath.Join(base, "snap")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, size)
	for i := range files {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.sst", i+1)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	local, err := localrecovery.Open(filepath.Join(base, "local"), "job")
	if err != nil {
		b.Fatal(err)
	}
	sn, err := local.Take("t", 1, dir, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(files * size)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		st, err := file.New(filepath.Join(base, fmt.Sprintf("store-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := uploader.Upload(context.Background(), uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn, Concurrency: 2}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(filepath.Join(base, fmt.Sprintf("store-%d", i)))
		b.StartTimer()
	}
}
