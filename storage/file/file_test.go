package file

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.Store {
		s, err := New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, storagetest.Options{})
}

func TestOpenByURL(t *testing.T) {
	dir := t.TempDir()
	s, err := storage.Open(context.Background(), "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.(*Store).Root() != dir {
		t.Fatalf("root = %s, want %s", s.(*Store).Root(), dir)
	}
	if _, err := storage.Open(context.Background(), "file://relative/dir"); err == nil {
		t.Fatal("a file URL with a host part was accepted")
	}
	if _, err := storage.Open(context.Background(), "ftp://x/y"); err == nil {
		t.Fatal("an unknown scheme was accepted")
	}
}

// A file URL naming a directory that does not exist is refused, with a hint,
// and nothing is created: a typo must not become an empty store.
func TestOpenByURLRefusesAMissingRoot(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "typo")
	_, err := storage.Open(context.Background(), "file://"+missing)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("does not exist")) {
		t.Fatalf("Open of a missing root = %v, want a does-not-exist error", err)
	}
	if _, statErr := os.Stat(missing); !os.IsNotExist(statErr) {
		t.Fatalf("Open created the missing root (stat: %v)", statErr)
	}
	notDir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notDir, nil, 0o644)
	if _, err := storage.Open(context.Background(), "file://"+notDir); err == nil {
		t.Fatal("a file URL naming a regular file was accepted")
	}
}

func TestCrashLeftoversAreInvisibleAndCleaned(t *testing.T) {
	dir := t.TempDir()
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Put(ctx, "a/b", bytes.NewReader([]byte("ok")), 2); err != nil {
		t.Fatal(err)
	}
	// A write that a crash interrupted leaves a temporary file behind.
	tmp := filepath.Join(dir, "a", ".c"+tmpMarker+"123")
	if err := os.WriteFile(tmp, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(tmp, old, old)
	var listed []string
	s.List(ctx, "", func(o storage.ObjectInfo) error { listed = append(listed, o.Key); return nil })
	if len(listed) != 1 || listed[0] != "a/b" {
		t.Fatalf("list shows %v, want only a/b", listed)
	}
	n, _, err := s.CleanIncomplete(ctx, "other/", time.Now().Add(-time.Hour))
	if err != nil || n != 0 {
		t.Fatalf("clean of another prefix removed %d files (%v)", n, err)
	}
	n, b, err := s.CleanIncomplete(ctx, "a/", time.Now().Add(-time.Hour))
	if err != nil || n != 1 || b != 7 {
		t.Fatalf("clean = %d files %d bytes %v, want 1 file 7 bytes", n, b, err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatal("temporary file still there")
	}
}

// BenchmarkPutGet measures the file backend's throughput with 64 MiB
// objects (each Put is fsynced).
func BenchmarkPutGet(b *testing.B) {
	s, err := New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	storagetest.BenchmarkPutGet(b, s, 64<<20)
}
