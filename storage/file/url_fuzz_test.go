package file

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckpt-io/ckpt/storage"
)

// FuzzOpenURL: storage.Open of any text never panics; a file:// URL opens
// only an existing directory, and opening creates nothing.
func FuzzOpenURL(f *testing.F) {
	for _, s := range []string{"file:///", "file:///tmp", "file://host/x", "file://", "file:///%00", "file:relative", "nope://x", "file:///a/../b", "::"} {
		f.Add(s)
	}
	root := f.TempDir()
	f.Fuzz(func(t *testing.T, raw string) {
		// Keep every path this run could touch inside root.
		u := "file://" + filepath.Join(root, raw)
		before, _ := os.ReadDir(root)
		s, err := storage.Open(context.Background(), u)
		if err == nil {
			fi, statErr := os.Stat(s.(*Store).Root())
			if statErr != nil || !fi.IsDir() {
				t.Fatalf("Open(%q) succeeded on a root that is not a directory", u)
			}
		}
		after, _ := os.ReadDir(root)
		if len(after) != len(before) {
			t.Fatalf("Open(%q) created something under the root", u)
		}
		// Any other text: only its not panicking matters (only file:// is
		// registered in this test binary, so nothing reaches the network).
		storage.Open(context.Background(), raw)
	})
}
