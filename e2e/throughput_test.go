package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// mbps is bytes per millisecond in MB/s (10^6 bytes).
func mbps(bytes, ms int64) float64 {
	if ms <= 0 {
		ms = 1
	}
	return float64(bytes) / 1e6 / (float64(ms) / 1000)
}

func TestThroughputOfA256MiBCheckpointAndItsRestoreOnEveryBackend(t *testing.T) {
	big, _, _ := bigSST(t)
	const files = 128 // of 2 MiB: 256 MiB
	forEachBackend(t, func(t *testing.T, b *backend) {
		root, localDir := t.TempDir(), t.TempDir()
		socket := filepath.Join(shortDir(t), "ckpt.sock")
		const job, task = "tput", "tput-0"
		startAgent(t, "A", b.agentConfig(socket, job, localDir, []string{root}))
		snap := filepath.Join(root, "snap-1")
		if err := os.MkdirAll(snap, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range files {
			name := fmt.Sprintf("%06d.sst", 1000+i)
			if err := os.Link(filepath.Join(big, name), filepath.Join(snap, name)); err != nil {
				t.Fatal(err)
			}
		}
		writeFile(t, filepath.Join(snap, "CURRENT"), []byte("MANIFEST-000001\n"))
		writeFile(t, filepath.Join(snap, "MANIFEST-000001"), randomBytes(64<<10, 3))

		ev := trigger(t, socket, task, 1, snap)
		target, rr, res := b.restoreFromStorage(t, job, task)
		t.Logf("%s: checkpoint of %d B (%d files) in %d ms: %.0f MB/s up; restore from storage of %d B in %d ms (process %v): %.0f MB/s down",
			b.name, ev.CheckpointSize, ev.FilesUploaded, ev.DurationMS, mbps(ev.CheckpointSize, ev.DurationMS),
			rr.Bytes, rr.DurationMS, res.Elapsed, mbps(rr.Bytes, rr.DurationMS))
		if ev.FullSize != 256<<20+int64(len("MANIFEST-000001\n"))+64<<10 || rr.Bytes != ev.FullSize {
			t.Errorf("full_size %d, restored %d", ev.FullSize, rr.Bytes)
		}
		requireSameFiles(t, snap, target)
	})
}
