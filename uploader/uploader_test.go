package uploader_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// counting counts the objects written through it and can run a hook
// during each write.
type counting struct {
	storage.Store
	puts   atomic.Int64
	during func(key string)
}

func (c *counting) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	c.puts.Add(1)
	if c.during != nil {
		c.during(key)
	}
	return c.Store.Put(ctx, key, body, size)
}

func snapshot(t *testing.T, files map[string]string) (*localrecovery.Snapshot, *file.Store) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "snap")
	os.MkdirAll(dir, 0o755)
	for name, body := range files {
		os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)
	}
	local, _ := localrecovery.Open(filepath.Join(base, "local"), "job")
	sn, err := local.Take("t", 1, dir, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		t.Fatal(err)
	}
	st, _ := file.New(filepath.Join(base, "store"))
	return sn, st
}

func TestIdenticalFilesAreUploadedOnce(t *testing.T) {
	same := strings.Repeat("x", 100_000)
	sn, st := snapshot(t, map[string]string{"000001.sst": same, "000002.sst": same, "000003.sst": "other", "CURRENT": "c"})
	c := &counting{Store: st}
	res, err := uploader.Upload(context.Background(), uploader.Request{Store: c, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	if c.puts.Load() != 2 || res.FilesUploaded != 3 || res.FilesReused != 1 || res.BytesWritten != 100_005 {
		t.Fatalf("puts %d, result %+v", c.puts.Load(), res)
	}
	if res.Files[0].Key != res.Files[1].Key || res.Files[0].Kind != manifests.Shared {
		t.Fatal("identical files do not share one object")
	}
}

func TestConfirmedObjectsAreReusedAndOthersUploaded(t *testing.T) {
	sn, st := snapshot(t, map[string]string{"000001.sst": "old", "000002.sst": "new"})
	first, err := uploader.Upload(context.Background(), uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	// Only 000001's object is confirmed (a retained manifest names it);
	// 000002's object exists in storage but is not confirmed: upload again.
	confirmed := uploader.NewConfirmed()
	confirmed.Add(&first.Files[0])
	c := &counting{Store: st}
	res, err := uploader.Upload(context.Background(), uploader.Request{Store: c, Job: "job", Task: "t", Checkpoint: 2, Snapshot: sn, Confirmed: confirmed})
	if err != nil {
		t.Fatal(err)
	}
	if res.FilesReused != 1 || res.FilesUploaded != 1 || c.puts.Load() != 1 || res.Files[1].Uploaded != true {
		t.Fatalf("reuse of confirmed only: %+v, %d puts", res, c.puts.Load())
	}
}

func TestAFileWrittenDuringItsUploadFailsTheUpload(t *testing.T) {
	sn, st := snapshot(t, map[string]string{"000001.sst": strings.Repeat("a", 1000)})
	c := &counting{Store: st, during: func(string) {
		f, _ := os.OpenFile(sn.Path("000001.sst"), os.O_WRONLY, 0)
		f.WriteAt([]byte("b"), 10)
		f.Close()
		later := time.Now().Add(time.Second)
		os.Chtimes(sn.Path("000001.sst"), later, later)
	}}
	_, err := uploader.Upload(context.Background(), uploader.Request{Store: c, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
	if err == nil || !strings.Contains(err.Error(), "immutable") {
		t.Fatalf("upload of a file written meanwhile: %v", err)
	}
}

func TestKnownInodesAreNotHashedAgain(t *testing.T) {
	sn, st := snapshot(t, map[string]string{"000001.sst": strings.Repeat("a", 5000), "000002.sst": strings.Repeat("b", 7000)})
	first, err := uploader.Upload(context.Background(), uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	hashes := map[localrecovery.Identity]string{sn.Files[0].ID(): first.Files[0].Digest()}
	res, err := uploader.Upload(context.Background(), uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 2, Snapshot: sn, Hashes: hashes})
	if err != nil {
		t.Fatal(err)
	}
	if res.HashesReused != 1 || res.BytesHashed != 7000 || res.Files[0].Digest() != first.Files[0].Digest() {
		t.Fatalf("hash index unused: %+v", res)
	}
}

func TestClassifyDecidesSharedOrPrivate(t *testing.T) {
	sn, st := snapshot(t, map[string]string{"000001.sst": "table", "data.bin": "immutable"})
	classify := func(name string) manifests.Kind {
		if name == "data.bin" {
			return manifests.Shared
		}
		return manifests.Private
	}
	res, err := uploader.Upload(context.Background(), uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn, Classify: classify})
	if err != nil {
		t.Fatal(err)
	}
	if res.Files[0].Name != "000001.sst" || res.Files[0].Kind != manifests.Private || res.Files[0].Inline == nil {
		t.Fatalf("000001.sst, private by Classify: %+v", res.Files[0])
	}
	if res.Files[1].Kind != manifests.Shared || !strings.HasPrefix(res.Files[1].Key, manifests.SharedPrefix("job")) {
		t.Fatalf("data.bin, shared by Classify: %+v", res.Files[1])
	}
}
