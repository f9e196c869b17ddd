package fsutil

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHashFileStreamsAndCounts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	body := strings.Repeat("ckpt", BufSize/2) // two buffers' worth
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(body))
	got, n, err := HashFile(context.Background(), p)
	if err != nil || got != hex.EncodeToString(sum[:]) || n != int64(len(body)) {
		t.Fatalf("HashFile: %s %d %v", got, n, err)
	}
	if got, n, err := HashReader(context.Background(), strings.NewReader(body)); err != nil || got != hex.EncodeToString(sum[:]) || n != int64(len(body)) {
		t.Fatalf("HashReader: %s %d %v", got, n, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := HashFile(ctx, p); err != context.Canceled {
		t.Fatalf("cancelled HashFile: %v", err)
	}
	if _, _, err := HashFile(context.Background(), p+"-missing"); !os.IsNotExist(err) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestSyncFileAndDir(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("x"), 0o644)
	if err := SyncFile(p); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := SyncOpenDir(d); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("fsync of a missing directory succeeded")
	}
}
