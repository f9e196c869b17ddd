package restore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// sampleEnv commits checkpoint 1 of task t of job "job", 24 files of
// 10 KB to 60 KB, to a file:// store under dir, and returns the store and
// the manifest.
func sampleEnv(t *testing.T) (storage.Store, string, *manifests.Manifest) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "store")
	fs, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(base, "snap")
	os.MkdirAll(snap, 0o755)
	rng := rand.NewChaCha8([32]byte{7})
	for i := range 24 {
		b := make([]byte, 10_000+i*2_000)
		rng.Read(b)
		os.WriteFile(filepath.Join(snap, fmt.Sprintf("%06d.sst", i+1)), b, 0o644)
	}
	ctx := context.Background()
	ls, err := localrecovery.Open(filepath.Join(base, "local"), "job")
	if err != nil {
		t.Fatal(err)
	}
	sn, err := ls.Take("t", 1, snap, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		t.Fatal(err)
	}
	res, err := uploader.Upload(ctx, uploader.Request{Store: fs, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: 1, Created: time.Now(), Files: res.Files}
	for _, f := range res.Files {
		m.FullSize += f.Size
	}
	enc, _ := m.Encode(res.BytesWritten)
	if err := manifests.Commit(ctx, fs, m, enc); err != nil {
		t.Fatal(err)
	}
	return fs, dir, m
}

// A sample drill reads its files from storage and checks each against the
// manifest: an object corrupted in storage (same size, one byte flipped)
// that the sample covers fails the drill, naming the file and the seed;
// the same sample of the intact store passes. It writes nothing to the
// scratch dir.
func TestASampleDrillFailsOnACorruptObjectNamingItAndWritesNothing(t *testing.T) {
	st, dir, m := sampleEnv(t)
	scratch := t.TempDir()
	const seed = 42
	drill := func() (*restore.DrillResult, error) {
		return restore.Drill(context.Background(), restore.DrillOptions{Store: st, Job: "job", Task: "t", ScratchDir: scratch,
			SampleBytes: 100_000, SampleSeed: seed})
	}
	res, err := drill()
	if err != nil || !res.Verified || !res.Sample || res.SampleSeed != seed || res.SampleFiles == 0 || res.SampleFiles >= len(m.Files) ||
		res.Checkpoint != 1 || res.Files != len(m.Files) || res.Bytes != m.FullSize || res.EngineChecked {
		t.Fatalf("sample drill of an intact store: %+v %v", res, err)
	}
	if entries, _ := os.ReadDir(scratch); len(entries) != 0 {
		t.Fatalf("a sample drill wrote %v to the scratch dir", entries)
	}
	if res.SampleBytes < 100_000 || res.SampleBytes >= 100_000+60_000 {
		t.Fatalf("sample drill read %d B for a budget of 100000 B of files of at most 60000 B", res.SampleBytes)
	}
	// Corrupt one object the sample reads.
	victim := restore.PickSample(m.Files, 100_000, seed)[1]
	p := filepath.Join(dir, filepath.FromSlash(victim.Key))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = drill()
	if err == nil || !strings.Contains(err.Error(), victim.Name) || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), fmt.Sprint(seed)) {
		t.Fatalf("sample drill over a corrupt object of %s: %v, want an error naming the file, the corruption and the seed", victim.Name, err)
	}
	if entries, _ := os.ReadDir(scratch); len(entries) != 0 {
		t.Fatalf("a failed sample drill wrote %v to the scratch dir", entries)
	}
}

// A sample covers at most its budget plus one file, holds only files of
// the checkpoint, each once, and the same seed draws the same sample.
func TestASampleCoversAtMostItsBudgetPlusOneFile(t *testing.T) {
	_, _, m := sampleEnv(t)
	var largest int64
	for _, f := range m.Files {
		largest = max(largest, f.Size)
	}
	rapid.Check(t, func(rt *rapid.T) {
		budget := rapid.Int64Range(1, m.FullSize+largest).Draw(rt, "budget")
		seed := rapid.Uint64().Draw(rt, "seed")
		s := restore.PickSample(m.Files, budget, seed)
		var total, last int64
		seen := map[string]bool{}
		for _, f := range s {
			if seen[f.Name] {
				rt.Fatalf("%s sampled twice", f.Name)
			}
			seen[f.Name] = true
			total += f.Size
			last = f.Size
		}
		if len(s) == 0 || total-last >= budget {
			rt.Fatalf("sample of %d files, %d B, for a budget of %d B: more than one file beyond it", len(s), total, budget)
		}
		if total < budget && len(s) != len(m.Files) {
			rt.Fatalf("sample of %d B stops short of its budget %d B with files left", total, budget)
		}
		again := restore.PickSample(m.Files, budget, seed)
		if fmt.Sprint(again) != fmt.Sprint(s) {
			rt.Fatalf("seed %d drew two samples", seed)
		}
	})
}
