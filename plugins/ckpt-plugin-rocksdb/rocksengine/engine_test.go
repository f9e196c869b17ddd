//go:build rocksdb

package rocksengine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/linxGnu/grocksdb"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
)

func TestRocksDBClassifySharesTableAndBlobFilesOnly(t *testing.T) {
	builtin, err := engines.NewRegistry().Lookup(Name)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]manifests.Kind{
		"000012.sst":         manifests.Shared,
		"000013.blob":        manifests.Shared,
		"MANIFEST-000005":    manifests.Private,
		"CURRENT":            manifests.Private,
		"OPTIONS-000007":     manifests.Private,
		"IDENTITY":           manifests.Private,
		"000004.log":         manifests.Private,
		"LOG":                manifests.Private,
		"LOG.old.1700000000": manifests.Private,
		"000012.sst.tmp":     manifests.Private,
		"something-else":     manifests.Private,
	} {
		if got := (Engine{}).Classify(name); got != want {
			t.Errorf("Classify(%q) = %s, want %s", name, got, want)
		}
		// An agent without the plugin must file the same store the same way.
		if got := builtin.Classify(name); got != want {
			t.Errorf("the built-in rocksdb engine classifies %q as %s, the plugin as %s", name, got, want)
		}
	}
}

// BenchmarkRocksDBCheck measures Check on a store of 144,000 keys in two
// column families, eight flushes (16 table files and their blob files,
// about 18 MB); bytes/s counts the store's bytes.
func BenchmarkRocksDBCheck(b *testing.B) {
	s := newStore(b, 8, 8000)
	var size int64
	entries, _ := os.ReadDir(s.dir)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil {
			size += fi.Size()
		}
	}
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := Engine{}.Check(context.Background(), s.dir)
		if err != nil || res.Keys != s.keys {
			b.Fatalf("Check: %+v, %v", res, err)
		}
	}
}

// store is a RocksDB store written by the test: keys in two column
// families, large values in blob files, several flushes.
type store struct {
	dir  string
	keys int64
}

// newStore writes a store with flushes flushed batches of perFlush keys
// per column family and returns a checkpoint of it made by RocksDB's
// Checkpoint API, with the WAL holding one more unflushed batch.
func newStore(t testing.TB, flushes, perFlush int) store {
	t.Helper()
	opts := grocksdb.NewDefaultOptions()
	defer opts.Destroy()
	opts.SetCreateIfMissing(true)
	opts.SetCreateIfMissingColumnFamilies(true)
	opts.EnableBlobFiles(true)
	opts.SetMinBlobSize(512)
	opts.SetDisableAutoCompactions(true)
	src := filepath.Join(t.TempDir(), "db")
	db, cfs, err := grocksdb.OpenDbColumnFamilies(opts, src, []string{"default", "counts"}, []*grocksdb.Options{opts, opts})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, cf := range cfs {
			cf.Destroy()
		}
		db.Close()
	}()
	wo := grocksdb.NewDefaultWriteOptions()
	defer wo.Destroy()
	fo := grocksdb.NewDefaultFlushOptions()
	defer fo.Destroy()
	fo.SetWait(true)
	var n int64
	put := func(round int) {
		for i := 0; i < perFlush; i++ {
			for c, cf := range cfs {
				v := []byte(fmt.Sprintf("value-%d-%d-%d", round, i, c))
				if i%10 == 0 {
					v = append(v, make([]byte, 1024)...) // goes to a blob file
				}
				if err := db.PutCF(wo, cf, []byte(fmt.Sprintf("key-%06d-%04d", i, round)), v); err != nil {
					t.Fatal(err)
				}
				n++
			}
		}
	}
	for r := 0; r < flushes; r++ {
		put(r)
		for _, cf := range cfs {
			if err := db.FlushCF(cf, fo); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(flushes) // stays in the WAL
	cp, err := db.NewCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Destroy()
	dir := filepath.Join(t.TempDir(), "checkpoint")
	if err := cp.CreateCheckpoint(dir, 1<<30); err != nil {
		t.Fatal(err)
	}
	return store{dir: dir, keys: n}
}

// files returns the name and SHA-256 of every file in dir.
func files(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = sha256.Sum256(b)
	}
	return out
}

func withSuffix(t *testing.T, dir, suffix string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+suffix))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(m)
	return m
}

func TestRocksDBCheckReadsEveryKeyAndChangesNothing(t *testing.T) {
	s := newStore(t, 3, 500)
	if n := len(withSuffix(t, s.dir, ".sst")); n < 6 {
		t.Fatalf("the checkpoint holds %d table files, want at least 6", n)
	}
	if len(withSuffix(t, s.dir, ".blob")) == 0 {
		t.Fatal("the checkpoint holds no blob file")
	}
	before := files(t, s.dir)
	res, err := Engine{}.Check(context.Background(), s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Checked || res.Keys != s.keys {
		t.Errorf("Check = %+v, want checked with %d keys", res, s.keys)
	}
	after := files(t, s.dir)
	if len(after) != len(before) {
		t.Errorf("Check changed the directory: %d files before, %d after", len(before), len(after))
	}
	for name, sum := range before {
		if after[name] != sum {
			t.Errorf("Check changed %s", name)
		}
	}
}

// flip inverts n bytes in the middle of path.
func flip(t *testing.T, path string, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	mid := len(b) / 3
	for i := mid; i < mid+n && i < len(b); i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCheckNamesACorruptFile: the file pass finds the corruption first
// and names the file; the read-through finds it too, on its own.
func TestRocksDBCheckNamesACorruptFile(t *testing.T) {
	for suffix, what := range map[string]string{".sst": "table file", ".blob": "blob file"} {
		t.Run("a flipped byte in a "+what, func(t *testing.T) {
			s := newStore(t, 2, 300)
			bad := withSuffix(t, s.dir, suffix)[0]
			flip(t, bad, 8)
			_, err := Engine{}.Check(context.Background(), s.dir)
			if err == nil {
				t.Fatalf("Check passed a store with %s corrupt", filepath.Base(bad))
			}
			if want := what + " " + filepath.Base(bad) + " is corrupt"; !strings.Contains(err.Error(), want) {
				t.Errorf("the error does not say %q: %v", want, err)
			}
			if _, err := scan(context.Background(), s.dir); err == nil || !strings.Contains(err.Error(), "Corruption") {
				t.Errorf("reading the store through with %s corrupt: %v, want a corruption", filepath.Base(bad), err)
			}
		})
	}
}

// TestCheckFindsACorruptBlobNoKeyReads: a blob file whose values were all
// overwritten is still in the checkpoint (no compaction ran); reading the
// store never reaches it, the blob file pass does.
func TestRocksDBCheckFindsACorruptBlobNoKeyReads(t *testing.T) {
	var s store
	opts := grocksdb.NewDefaultOptions()
	defer opts.Destroy()
	opts.EnableBlobFiles(true)
	opts.SetMinBlobSize(512)
	opts.SetDisableAutoCompactions(true)
	opts.SetCreateIfMissing(true)
	src := filepath.Join(t.TempDir(), "db")
	db, err := grocksdb.OpenDb(opts, src)
	if err != nil {
		t.Fatal(err)
	}
	wo := grocksdb.NewDefaultWriteOptions()
	fo := grocksdb.NewDefaultFlushOptions()
	fo.SetWait(true)
	for round := 0; round < 2; round++ {
		for i := 0; i < 50; i++ {
			if err := db.Put(wo, []byte(fmt.Sprintf("k%03d", i)), append([]byte(fmt.Sprint(round)), make([]byte, 1024)...)); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Flush(fo); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := db.NewCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	s.dir = filepath.Join(t.TempDir(), "checkpoint")
	err = cp.CreateCheckpoint(s.dir, 0)
	cp.Destroy()
	wo.Destroy()
	fo.Destroy()
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	blobs := withSuffix(t, s.dir, ".blob")
	if len(blobs) != 2 {
		t.Fatalf("the checkpoint holds blob files %v, want 2", blobs)
	}
	old := blobs[0] // the first flush's: every value in it was overwritten
	flip(t, old, 8)
	if n, err := scan(context.Background(), s.dir); err != nil || n != 50 {
		t.Fatalf("reading the store through: %d keys, %v; want 50 keys and no error", n, err)
	}
	_, err = Engine{}.Check(context.Background(), s.dir)
	if want := "blob file " + filepath.Base(old) + " is corrupt"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Check = %v, want an error saying %q", err, want)
	}
}

func TestRocksDBCheckRefusesWhatIsNotAStore(t *testing.T) {
	empty := t.TempDir()
	file := filepath.Join(empty, "f")
	os.WriteFile(file, []byte("x"), 0o644)
	s := newStore(t, 1, 10)
	missing := withSuffix(t, s.dir, ".sst")[0]
	os.Remove(missing)
	for name, tc := range map[string]struct{ dir, want string }{
		"a missing directory":     {filepath.Join(empty, "nope"), "no such file"},
		"a file":                  {file, "not a directory"},
		"a directory no CURRENT":  {empty, "no CURRENT file"},
		"a store missing a table": {s.dir, strings.TrimSuffix(filepath.Base(missing), ".sst")},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Engine{}.Check(context.Background(), tc.dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Check(%s) = %v, want an error containing %q", tc.dir, err, tc.want)
			}
		})
	}
}

func TestRocksDBCheckHonoursACanceledContext(t *testing.T) {
	s := newStore(t, 1, 10)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (Engine{}).Check(ctx, s.dir); !errors.Is(err, context.Canceled) {
		t.Errorf("Check with a canceled context = %v", err)
	}
}
