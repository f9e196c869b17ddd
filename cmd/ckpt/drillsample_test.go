package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/manifests"
)

// `ckpt drill --sample-bytes N --json` reports a sample: "sample": true,
// the files and bytes it read and verified, the seed, and "verified"; it
// writes nothing to the scratch dir. The same drill over a corrupt object
// fails naming the file.
func TestDrillSampleBytesReportsASampleAndWritesNothing(t *testing.T) {
	url, s := storageDir(t)
	commitManifest(t, s, "j", "t", 1, "the bytes of a.sst")
	scratch := t.TempDir()
	code, stdout, stderr := runCaptured(t, "drill", "--storage", url, "--job", "j", "--task", "t", "--scratch", scratch, "--sample-bytes", "1", "--seed", "9", "--json")
	var res map[string]any
	if code != 0 || json.Unmarshal([]byte(stdout), &res) != nil {
		t.Fatalf("drill --sample-bytes --json: exit %d\n%s%s", code, stdout, stderr)
	}
	n := float64(len("the bytes of a.sst"))
	if res["sample"] != true || res["verified"] != true || res["sample_files"] != 1.0 || res["sample_bytes"] != n || res["sample_seed"] != 9.0 || res["engine_checked"] != false {
		t.Fatalf("drill --sample-bytes --json: %s", stdout)
	}
	if entries, _ := os.ReadDir(scratch); len(entries) != 0 {
		t.Fatalf("a sample drill wrote %v to the scratch dir", entries)
	}
	code, stdout, _ = runCaptured(t, "drill", "--storage", url, "--job", "j", "--task", "t", "--scratch", scratch, "--sample-bytes", "1")
	if code != 0 || !strings.Contains(stdout, "sample drill") || !strings.Contains(stdout, "nothing restored") {
		t.Fatalf("drill --sample-bytes: exit %d %s", code, stdout)
	}

	// Corrupt the object in storage: same size, other bytes.
	sum := sha256.Sum256([]byte("the bytes of a.sst"))
	key := manifests.SharedKey("j", hex.EncodeToString(sum[:]), int64(n))
	p := filepath.Join(strings.TrimPrefix(url, "file://"), filepath.FromSlash(key))
	if err := os.WriteFile(p, []byte("THE BYTES OF A.SST"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCaptured(t, "drill", "--storage", url, "--job", "j", "--task", "t", "--scratch", scratch, "--sample-bytes", "1", "--json")
	if code != 1 || !strings.Contains(stderr, "a.sst") || !strings.Contains(stderr, "corrupt") {
		t.Fatalf("sample drill of a corrupt object: exit %d, want 1 naming a.sst and the corruption\n%s%s", code, stdout, stderr)
	}
}
