package uploader_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/uploader"
)

// big is a shared file above the size read whole (4 MiB): hashed in one
// pass, sent in another.
func big(fill byte) string { return strings.Repeat(string([]byte{fill}), 5<<20) }

// rewrite changes the bytes of path in place, keeping its size, and sets
// its mtime back: a writer that hides its write from the size and mtime
// checks.
func rewrite(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("written after it was hashed"), 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}

// objects returns every object in st by key.
func objects(t *testing.T, st storage.Store) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := st.List(context.Background(), "", func(o storage.ObjectInfo) error {
		r, err := st.Get(context.Background(), o.Key)
		if err != nil {
			return err
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		out[o.Key] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestALargeFileWrittenBetweenItsHashAndItsUploadIsNotStored: a shared
// file over 4 MiB is written between the pass that hashes it and the pass
// that sends it, its mtime set back. The upload fails, and no object holds
// bytes other than those its key names, for either hash algorithm, and
// also when an object of the hashed content was stored before (it is not
// replaced by the new bytes).
func TestALargeFileWrittenBetweenItsHashAndItsUploadIsNotStored(t *testing.T) {
	for _, alg := range []manifests.Alg{manifests.BLAKE3, manifests.SHA256} {
		for _, stored := range []bool{false, true} {
			name := map[manifests.Alg]string{manifests.BLAKE3: "blake3", manifests.SHA256: "sha256"}[alg]
			if stored {
				name += "/over an object of the hashed content"
			}
			t.Run(name, func(t *testing.T) {
				content := big('a')
				sn, st := snapshot(t, map[string]string{"000001.sst": content, "CURRENT": "MANIFEST-1"})
				key := manifests.SharedKey("job", manifests.SumBytes(alg, []byte(content)), int64(len(content)))
				if stored {
					// Another task's object of this content, not confirmed to
					// this one: it is uploaded again, and must stay intact.
					if err := st.Put(context.Background(), key, strings.NewReader(content), int64(len(content))); err != nil {
						t.Fatal(err)
					}
				}
				hooked := 0
				defer uploader.SetAfterHash(func(name string) {
					if name == "000001.sst" {
						hooked++
						rewrite(t, sn.Path(name))
					}
				})()
				_, err := uploader.Upload(context.Background(), uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn, Alg: alg})
				if hooked != 1 {
					t.Fatalf("the file was not hashed in a pass of its own (%d hooks)", hooked)
				}
				if err == nil || !strings.Contains(err.Error(), "immutable") {
					t.Fatalf("upload of a file written between its hash and its upload: %v", err)
				}
				for k, b := range objects(t, st) {
					if !strings.Contains(k, "/shared/") {
						continue
					}
					want := manifests.SharedKey("job", manifests.SumBytes(alg, b), int64(len(b)))
					if k != want {
						t.Errorf("object %s holds bytes whose key is %s", k, want)
					}
				}
				if b := objects(t, st)[key]; stored && !bytes.Equal(b, []byte(content)) {
					t.Error("the stored object of the hashed content was replaced")
				}
			})
		}
	}
}

// TestAKnownHashIsCheckedAgainstTheBytesSent: a shared file whose hash
// comes from the inode index (not read again) but whose bytes changed
// with its mtime set back is not stored under the known hash's key.
func TestAKnownHashIsCheckedAgainstTheBytesSent(t *testing.T) {
	content := big('k')
	sn, st := snapshot(t, map[string]string{"000001.sst": content})
	d := manifests.SumBytes(manifests.BLAKE3, []byte(content))
	rewrite(t, sn.Path("000001.sst"))
	hashes := map[localrecovery.Identity]string{sn.Files[0].ID(): d}
	_, err := uploader.Upload(context.Background(), uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn, Hashes: hashes})
	if err == nil || !strings.Contains(err.Error(), "immutable") {
		t.Fatalf("upload of a file that is not its known hash: %v", err)
	}
	if len(objects(t, st)) != 0 {
		t.Fatalf("objects stored: %v", len(objects(t, st)))
	}
}

// TestAFirstCheckpointReusesNoObjectOfTheSameSizeAndOtherContent: a task's
// first checkpoint, offered another task's objects by content id, reuses
// one only for a file whose own hash is its key's: a file of the same
// size and other bytes is uploaded under its own hash.
func TestAFirstCheckpointReusesNoObjectOfTheSameSizeAndOtherContent(t *testing.T) {
	for _, size := range []int{1000, 5 << 20} { // read whole, and in two passes
		other, mine := strings.Repeat("o", size), strings.Repeat("m", size)
		sn, st := snapshot(t, map[string]string{"000001.sst": mine, "000002.sst": other})
		d := manifests.SumBytes(manifests.BLAKE3, []byte(other))
		otherKey := manifests.SharedKey("job", d, int64(size))
		if err := st.Put(context.Background(), otherKey, strings.NewReader(other), int64(size)); err != nil {
			t.Fatal(err)
		}
		confirmed := uploader.NewConfirmed()
		if !confirmed.AddID(manifests.ContentID(d, int64(size)), otherKey) {
			t.Fatal("content id refused")
		}
		res, err := uploader.Upload(context.Background(), uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn, Confirmed: confirmed})
		if err != nil {
			t.Fatal(err)
		}
		f1, f2 := res.Files[0], res.Files[1]
		if f1.Key == otherKey || !f1.Uploaded || f1.Digest() != manifests.SumBytes(manifests.BLAKE3, []byte(mine)) {
			t.Fatalf("size %d: a file of another content took the other task's object: %+v", size, f1)
		}
		if f2.Key != otherKey || f2.Uploaded {
			t.Fatalf("size %d: the file of the other task's content did not reuse its object: %+v", size, f2)
		}
		for k, b := range objects(t, st) {
			if strings.Contains(k, "/shared/") && k != manifests.SharedKey("job", manifests.SumBytes(manifests.BLAKE3, b), int64(len(b))) {
				t.Errorf("object %s does not hold the bytes its key names", k)
			}
		}
	}
}
