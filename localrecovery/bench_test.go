package localrecovery

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkTake measures the sync phase's own cost: taking a snapshot of n
// files into the local store, by hard links or by handing the directory off.
func BenchmarkTake(b *testing.B) {
	for _, bc := range []struct {
		n       int
		handoff bool
	}{{1000, false}, {10000, false}, {1000, true}, {10000, true}} {
		n := bc.n
		b.Run(fmt.Sprintf("files=%d/handoff=%v", n, bc.handoff), func(b *testing.B) {
			base := b.TempDir()
			snap := filepath.Join(base, "snap")
			os.MkdirAll(snap, 0o755)
			for i := range n {
				os.WriteFile(filepath.Join(snap, fmt.Sprintf("%06d.sst", i)), []byte("x"), 0o644)
			}
			s, _ := Open(filepath.Join(base, "local"), "job")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sn, err := s.Take("t", uint64(i+1), snap, bc.handoff)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if sn.HandedOff { // give the directory back for the next round
					os.Rename(sn.Dir, snap)
				}
				s.Discard("t", uint64(i+1))
				b.StartTimer()
			}
		})
	}
}

// BenchmarkInspect is the async phase's first step on a handed-off
// snapshot: one lstat of every file.
func BenchmarkInspect(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			base := b.TempDir()
			snap := filepath.Join(base, "snap")
			os.MkdirAll(snap, 0o755)
			for i := range n {
				os.WriteFile(filepath.Join(snap, fmt.Sprintf("%06d.sst", i)), []byte("x"), 0o644)
			}
			s, _ := Open(filepath.Join(base, "local"), "job")
			sn, err := s.Take("t", 1, snap, true)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := sn.Inspect(); err != nil || len(sn.Files) != n {
					b.Fatal(err, len(sn.Files))
				}
			}
		})
	}
}
