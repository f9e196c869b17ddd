package file

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckpt-io/ckpt/storage"
)

// A root that vanishes after the store was opened is an outage: every
// operation fails with ErrRootGone (an error worth retrying), nothing
// re-creates the root, and the store works again once the root is back.
func TestAVanishedRootIsAnOutageNeverANewStore(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "storage")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("manifest")
	if err := s.Put(ctx, "job/tasks/a/chk/1/manifest", bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	away := root + ".away"
	if err := os.Rename(root, away); err != nil {
		t.Fatal(err)
	}
	isGone := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, ErrRootGone) {
			t.Fatalf("%s with the root gone: %v, want ErrRootGone", op, err)
		}
		var tmp interface{ Temporary() bool }
		if !errors.As(err, &tmp) || !tmp.Temporary() {
			t.Fatalf("%s: %v is not marked temporary: callers would treat an outage as a permanent failure", op, err)
		}
		if _, err := os.Stat(root); !os.IsNotExist(err) {
			t.Fatalf("%s re-created the vanished root (stat: %v)", op, err)
		}
	}
	isGone("Put", s.Put(ctx, "job/shared/ab/x", bytes.NewReader(body), int64(len(body))))
	isGone("Create", s.Create(ctx, "job/tasks/a/chk/2/manifest", bytes.NewReader(body), int64(len(body))))
	_, err = s.Get(ctx, "job/tasks/a/chk/1/manifest")
	isGone("Get", err)
	_, err = s.Stat(ctx, "job/tasks/a/chk/1/manifest")
	isGone("Stat", err)
	isGone("List", s.List(ctx, "job/tasks/", func(storage.ObjectInfo) error { return nil }))

	// Back in place: the store serves again, its objects intact.
	if err := os.Rename(away, root); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(ctx, "job/tasks/a/chk/1/manifest")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, body) {
		t.Fatalf("object after the root came back = %q", got)
	}
	if err := s.Create(ctx, "job/tasks/a/chk/2/manifest", bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatalf("Create once the root is back: %v", err)
	}
	// A missing object of a present root is still ErrNotFound.
	if _, err := s.Stat(ctx, "job/tasks/a/chk/3/manifest"); !errors.Is(err, storage.ErrNotFound) || errors.Is(err, ErrRootGone) {
		t.Fatalf("Stat of a missing key: %v, want ErrNotFound", err)
	}
}
