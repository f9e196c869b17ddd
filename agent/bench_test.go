package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/storage/file"
)

// BenchmarkIncremental is a checkpoint that adds 10 files to a state of n
// unchanged files, handed off as client/pebble hands off a Pebble
// checkpoint, on file:// storage, end to end (request to completed) and
// with the agent's background work after it (the removal of the previous
// local copy) waited for. What an unchanged file costs is the slope
// between the sizes; ckpt-bench --only scale measures the same on S3.
func BenchmarkIncremental(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) { benchIncremental(b, n) })
	}
}

func benchIncremental(b *testing.B, n int) {
	base := b.TempDir()
	root, pool := filepath.Join(base, "apps"), filepath.Join(base, "apps", "pool")
	if err := os.MkdirAll(pool, 0o755); err != nil {
		b.Fatal(err)
	}
	st, err := file.New(filepath.Join(base, "store"))
	if err != nil {
		b.Fatal(err)
	}
	a, err := New(Config{Socket: filepath.Join(base, "ckpt.sock"), Store: st, Job: "job", LocalDir: filepath.Join(root, "local"),
		AllowRoots: []string{root}, GCGrace: time.Hour, GCInterval: -1, ShutdownGrace: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	<-a.Ready()
	c, err := client.Dial(ctx, filepath.Join(base, "ckpt.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()

	var names []string
	add := func(k int) {
		for range k {
			name := fmt.Sprintf("%07d.sst", len(names)+1)
			if err := os.WriteFile(filepath.Join(pool, name), []byte(name+" of the bench state"), 0o644); err != nil {
				b.Fatal(err)
			}
			names = append(names, name)
		}
	}
	seq := 0
	snapshot := func() string {
		seq++
		dir := filepath.Join(root, fmt.Sprintf("snap-%d", seq))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for _, name := range names {
			if err := os.Link(filepath.Join(pool, name), filepath.Join(dir, name)); err != nil {
				b.Fatal(err)
			}
		}
		for name, data := range map[string]string{"CURRENT": "MANIFEST-000001\n", "MANIFEST-000001": "a pebble manifest"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		return dir
	}
	checkpoint := func(k uint64, dir string) {
		p, err := c.Send(ctx, client.Request{Task: "t", Checkpoint: k, Dir: dir, Engine: "pebble", Handoff: true})
		if err == nil {
			_, err = p.Wait(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		a.local.Wait()
	}
	add(n)
	checkpoint(1, snapshot())
	k := uint64(1)
	// CKPT_BENCH_CPUPROFILE=PREFIX writes a CPU profile of each timed
	// checkpoint to PREFIX.N (go tool pprof merges them), leaving out the
	// first upload and the making of the snapshots.
	prof := os.Getenv("CKPT_BENCH_CPUPROFILE")
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		add(10)
		dir := snapshot()
		k++
		if prof != "" {
			f, err := os.Create(fmt.Sprintf("%s.%d", prof, k))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			pprof.StartCPUProfile(f)
		}
		b.StartTimer()
		checkpoint(k, dir)
		if prof != "" {
			pprof.StopCPUProfile()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/file")
}
