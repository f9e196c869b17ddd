package storage_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// Two storage URLs overlap when they reach the same objects, however they
// spell it: a symlink, "//", "./", a trailing slash, the case of the
// scheme or of the bucket, an endpoint given twice ways. Different
// buckets, services or sibling prefixes do not.
func TestOverlapComparesWhatURLsReachNotHowTheyAreSpelled(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_ENDPOINT_URL", "")
	t.Setenv("STORAGE_EMULATOR_HOST", "")
	root := t.TempDir()
	job := filepath.Join(root, "job")
	other := filepath.Join(root, "other")
	for _, d := range []string{job, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(job, link); err != nil {
		t.Fatal(err)
	}
	relLink := filepath.Join(other, "up")
	if err := os.Symlink("../job", relLink); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		a, b string
		want bool
	}{
		{"the same directory", "file://" + job, "file://" + job + "/", true},
		{"a directory inside", "file://" + job, "file://" + job + "/sp", true},
		{"the directory through a symlink", "file://" + job, "file://" + link, true},
		{"inside it through a symlink, not yet created", "file://" + job, "file://" + link + "/sp/new", true},
		{"through a relative symlink", "file://" + job, "file://" + relLink + "/sp", true},
		{"holding the job through a symlink", "file://" + link + "/a", "file://" + job, true},
		{"with // and ./", "file://" + job, "file://" + root + "//./job/./sp", true},
		{"scheme in upper case", "file://" + job, "FILE://" + job + "/sp", true},
		{"a sibling directory", "file://" + job, "file://" + other, false},
		{"a name that merely starts alike", "file://" + job, "file://" + job + "2", false},

		{"s3: one prefix", "s3://b/ckpt", "s3://b/ckpt/", true},
		{"s3: under it", "s3://b/ckpt", "s3://b/ckpt/sp", true},
		{"s3: // and ./", "s3://b/ckpt", "s3://b//ckpt/./sp", true},
		{"s3: the bucket holds it", "s3://b", "s3://b/ckpt/sp", true},
		{"s3: scheme and bucket case", "s3://b/ckpt", "S3://B/ckpt/sp", true},
		{"s3: the same endpoint spelled twice", "s3://b/ckpt?endpoint=http://127.0.0.1:7070", "s3://b/ckpt/sp?endpoint=http://localhost:7070/&path_style=true", true},
		{"s3: AWS's own endpoint", "s3://b/ckpt?endpoint=", "s3://b/ckpt/sp?endpoint=https://s3.us-east-1.amazonaws.com", true},
		{"s3: a plugin's scheme", "s3://b/ckpt", "s3+plugin://b/ckpt/sp", true},
		{"s3 interoperability at GCS", "gs://b/ckpt", "s3://b/ckpt/sp?endpoint=https://storage.googleapis.com", true},
		{"s3: a sibling prefix", "s3://b/ckpt", "s3://b/ckpt2", false},
		{"s3: another bucket", "s3://b/ckpt", "s3://c/ckpt", false},
		{"s3: another endpoint", "s3://b/ckpt?endpoint=http://127.0.0.1:7070", "s3://b/ckpt?endpoint=http://127.0.0.1:7071", false},
		{"s3 and gs", "s3://b/ckpt", "gs://b/ckpt", false},
		{"file and s3", "file:///b/ckpt", "s3://b/ckpt", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := storage.Overlap(c.a, c.b); got != c.want {
				t.Errorf("Overlap(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
			}
			if got := storage.Overlap(c.b, c.a); got != c.want {
				t.Errorf("Overlap(%s, %s) = %v, want %v", c.b, c.a, got, c.want)
			}
		})
	}
}

// A URL with no endpoint reaches the one the environment names, as the
// backend would.
func TestOverlapTakesTheEndpointFromTheEnvironmentAsTheBackendDoes(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:7070")
	if !storage.Overlap("s3://b/ckpt", "s3://b/ckpt/sp?endpoint=http://127.0.0.1:7070") {
		t.Error("s3://b/ckpt with AWS_ENDPOINT_URL does not overlap the same bucket with that endpoint in the URL")
	}
	if storage.Overlap("s3://b/ckpt", "s3://b/ckpt/sp?endpoint=http://127.0.0.1:9999") {
		t.Error("a bucket at another endpoint overlaps")
	}
	t.Setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
	if !storage.Overlap("gs://b/ckpt", "gs://b/ckpt/sp?endpoint=http://localhost:4443") {
		t.Error("gs://b/ckpt with STORAGE_EMULATOR_HOST does not overlap the same bucket at that endpoint")
	}
}

// A file:// store located through a symlink is located where its files
// are.
func TestAFileStoreIsLocatedAtItsRealPath(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	s, err := file.Open(filepath.Join(root, "link"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.EvalSymlinks(real)
	if got := storage.LocationOf(s); got != "file://"+want {
		t.Errorf("LocationOf(%s) = %s, want file://%s", s, got, want)
	}
}
