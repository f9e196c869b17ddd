package savepoint

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// A savepoint target that is the job's storage, or inside it, reached
// through a symlink (or a job's storage reached through one, holding the
// target) is refused before anything is written: the job's GC would
// otherwise delete the savepoint's objects as unreferenced. Seeding a job
// from a savepoint refuses the same.
func TestASavepointTargetInTheJobThroughASymlinkIsRefused(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	jobDir := filepath.Join(root, "job")
	src, err := file.New(jobDir)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, src, "j", "t0", 1, map[string]string{"000001.sst": sst(1), "CURRENT": "MANIFEST-1\n"}, nil)
	link := filepath.Join(root, "link")
	if err := os.Symlink(jobDir, link); err != nil {
		t.Fatal(err)
	}
	open := func(dir string) storage.Store {
		t.Helper()
		s, err := file.New(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	viaLink := open(link)
	before := snapshot(t, src)
	for name, c := range map[string]struct{ source, target storage.Store }{
		"the job's directory through a symlink":    {src, viaLink},
		"a directory in the job through a symlink": {src, open(filepath.Join(link, "sp"))},
		"the job through a symlink, holding it":    {viaLink, open(filepath.Join(jobDir, "sp2"))},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Create(ctx, Options{Source: c.source, Job: "j", Task: "t0", Target: c.target})
			if err == nil || !strings.Contains(err.Error(), "overlaps") {
				t.Fatalf("savepoint from %s to %s: %v, want it refused as overlapping", c.source, c.target, err)
			}
			if err := CheckApart(storage.LocationOf(c.source), c.target.String()); err == nil {
				t.Fatalf("CheckApart(%s, %s) accepts the target", storage.LocationOf(c.source), c.target)
			}
		})
	}
	if after := snapshot(t, src); after != before {
		t.Fatalf("a refused savepoint changed the job's storage:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// A real savepoint elsewhere cannot seed a job through a symlink to
	// the savepoint itself.
	spDir := filepath.Join(root, "sp")
	sp := open(spDir)
	if _, err := Create(ctx, Options{Source: src, Job: "j", Task: "t0", Target: sp}); err != nil {
		t.Fatal(err)
	}
	spLink := filepath.Join(root, "sp-link")
	if err := os.Symlink(spDir, spLink); err != nil {
		t.Fatal(err)
	}
	if _, err := Seed(ctx, SeedOptions{Savepoint: sp, Target: open(spLink), Job: "j2"}); err == nil || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("seeding a job in the savepoint's own directory through a symlink: %v", err)
	}
}
