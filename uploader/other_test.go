package uploader_test

import (
	"context"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/uploader"
)

// A task with no checkpoint of its own may reuse the objects that the
// job's other tasks' retained manifests reference, never its own (it has
// none to speak of), nor those of a retired manifest.
func TestOtherTasksConfirmedNamesOnlyOtherTasksRetainedObjects(t *testing.T) {
	ctx := context.Background()
	sn, st := snapshot(t, map[string]string{"000001.sst": "kept", "000002.sst": "retired"})
	res, err := uploader.Upload(ctx, uploader.Request{Store: st, Job: "job", Task: "a", Checkpoint: 1, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(n uint64, files ...manifests.File) {
		m := &manifests.Manifest{Job: "job", Task: "a", Checkpoint: n, Created: time.Now(), Files: files}
		for _, f := range files {
			m.FullSize += f.Size
		}
		enc, _ := m.Encode(0)
		if err := manifests.Commit(ctx, st, m, enc); err != nil {
			t.Fatal(err)
		}
	}
	commit(1, res.Files[1]) // 000002 only, then retired
	commit(2, res.Files[0]) // 000001
	if err := manifests.Retire(ctx, st, "job", "a", 1); err != nil {
		t.Fatal(err)
	}
	sizes := map[int64]bool{}
	for _, f := range res.Files {
		sizes[f.Size] = true
	}
	got, err := uploader.OtherTasksConfirmed(ctx, st, "job", "b", sizes)
	if err != nil {
		t.Fatal(err)
	}
	kept, retired := res.Files[0], res.Files[1]
	if got[kept.ContentID()] != kept.Key || len(got) != 1 {
		t.Fatalf("task b may reuse %v, want only %s (a's retained checkpoint 2), not %s (retired)", got, kept.Key, retired.Key)
	}
	none, err := uploader.OtherTasksConfirmed(ctx, st, "job", "b", map[int64]bool{kept.Size + 1: true})
	if err != nil || len(none) != 0 {
		t.Fatalf("task b of files of other sizes may reuse %v (%v), want nothing", none, err)
	}
	own, err := uploader.OtherTasksConfirmed(ctx, st, "job", "a", sizes)
	if err != nil || len(own) != 0 {
		t.Fatalf("task a's own objects came back as another task's: %v, %v", own, err)
	}
}
