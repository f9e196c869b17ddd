package pebble_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/file"
)

// threeTasks checkpoints job-wide checkpoint 1 of three range-partitioned
// stores: t0 holds keys 0-99 in tables, t1 100-199 in tables, t2 200-299
// in its WAL alone (never flushed).
func threeTasks(t *testing.T) (*file.Store, []*modelStore, string) {
	t.Helper()
	base := t.TempDir()
	st, err := file.New(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	local, err := localrecovery.Open(filepath.Join(base, "local"), "job")
	if err != nil {
		t.Fatal(err)
	}
	var stores []*modelStore
	for i := range 3 {
		s := openModelStore(t, filepath.Join(base, fmt.Sprintf("old-%d", i)), fmt.Sprintf("t%d", i))
		t.Cleanup(func() { s.db.Close() })
		for id := 100 * i; id < 100*(i+1); id++ {
			k, v := modelKey(id), fmt.Sprintf("v-%d", id)
			if err := s.db.Set(k, []byte(v), nil); err != nil {
				t.Fatal(err)
			}
			s.m[string(k)] = v
		}
		if i < 2 {
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		stores = append(stores, s)
	}
	checkpointJob(t, st, local, 1, stores)
	return st, stores, base
}

// A rescale that reads some tasks of a job-complete checkpoint fails when
// another task of it holds keys in the range (in its tables or only in its
// WAL), naming it, and writes nothing; with Partial it builds the store
// from the named tasks; a range the other tasks hold nothing of needs no
// Partial.
func TestARescaleFromSomeTasksMissingKeysOfOthersIsRefusedUnlessPartial(t *testing.T) {
	st, stores, base := threeTasks(t)
	ctx := context.Background()
	rescale := func(target string, from []string, lo, hi int, partial bool) (*restore.RescaleResult, error) {
		return restore.Rescale(ctx, restore.RescaleOptions{Store: st, Job: "job", From: from, Start: modelKey(lo), End: modelKey(hi),
			Engine: "pebble", Target: filepath.Join(base, target), Parallelism: 2, Partial: partial})
	}
	for _, c := range []struct {
		name   string
		from   []string
		lo, hi int
		want   string
	}{
		{"a range into t1's tables", []string{"t0"}, 50, 150, "t1 (its table"},
		{"a range into t2's WAL", []string{"t1"}, 150, 250, "t2 (its WAL holds key 00c8)"},
		{"a range into both", []string{"t0"}, 50, 250, "t1 (its table"},
	} {
		t.Run(c.name, func(t *testing.T) {
			target := "refused-" + strings.ReplaceAll(c.name, " ", "-")
			_, err := rescale(target, c.from, c.lo, c.hi, false)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--partial") {
				t.Fatalf("rescale of [%d, %d) from %v: %v, want it refused naming %q and --partial", c.lo, c.hi, c.from, err, c.want)
			}
			if _, err := os.Stat(filepath.Join(base, target)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused rescale left its target: %v", err)
			}
		})
	}
	// Partial: the named task's keys alone.
	res, err := rescale("partial", []string{"t0"}, 50, 250, true)
	if err != nil || !res.Verified {
		t.Fatalf("--partial: %+v, %v", res, err)
	}
	requireStore(t, filepath.Join(base, "partial"), stores[0].m, modelKey(50), modelKey(250))
	// Nothing of t1 or t2 lies in [10, 90): no Partial needed.
	if _, err := rescale("inside", []string{"t0"}, 10, 90, false); err != nil {
		t.Fatalf("a range only t0 holds keys in: %v", err)
	}
	requireStore(t, filepath.Join(base, "inside"), stores[0].m, modelKey(10), modelKey(90))
	// Every task that holds keys named: no Partial needed either.
	union := map[string]string{}
	for _, s := range stores {
		for k, v := range s.m {
			union[k] = v
		}
	}
	if _, err := rescale("all", []string{"t0", "t1", "t2"}, 50, 250, false); err != nil {
		t.Fatalf("every task named: %v", err)
	}
	requireStore(t, filepath.Join(base, "all"), union, modelKey(50), modelKey(250))
}

// A rescale whose checkpoint has a tampered manifest fails naming the
// manifest: its key, task and checkpoint.
func TestARescaleOverATamperedManifestNamesIt(t *testing.T) {
	st, _, base := threeTasks(t)
	ctx := context.Background()
	key := manifests.ManifestKey("job", "t1", 1)
	p := filepath.Join(st.Root(), filepath.FromSlash(key))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x20 // one byte of it: its checksum no longer holds
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]restore.RescaleOptions{
		"the newest checkpoint":     {From: []string{"t0", "t1", "t2"}},
		"checkpoint 1 by number":    {From: []string{"t0", "t1", "t2"}, Checkpoint: 1},
		"another task's rescale":    {From: []string{"t0"}},
		"another task's, --partial": {From: []string{"t0"}, Partial: true},
	} {
		t.Run(name, func(t *testing.T) {
			o.Store, o.Job, o.Engine, o.Target = st, "job", "pebble", filepath.Join(base, "new")
			o.Start, o.End = modelKey(50), modelKey(250)
			_, err := restore.Rescale(ctx, o)
			if err == nil || !strings.Contains(err.Error(), key) {
				t.Fatalf("rescale over tampered %s: %v, want an error naming it", key, err)
			}
			t.Logf("%v", err)
		})
	}
}
