package restore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// bigSize is an object fetched in ranged pieces: two whole 16 MiB pieces
// and a short last one, above the 32 MiB from which objects are ranged.
const bigSize = 2*(16<<20) + (3 << 20) + 7

// rangeStore is a decorator that counts ranged and whole reads of the
// store it wraps and can make its ranged reads misbehave.
type rangeStore struct {
	storage.Store
	mu     sync.Mutex
	ranges map[string]int // key -> ranged reads
	gets   map[string]int // key -> whole reads
	// bad, when set, replaces what a ranged read of [off, off+length)
	// returns, given the correct bytes of the whole object.
	bad func(obj []byte, off, length int64) []byte
}

func (s *rangeStore) Unwrap() storage.Store { return s.Store }

func (s *rangeStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.mu.Lock()
	s.gets[key]++
	s.mu.Unlock()
	return s.Store.Get(ctx, key)
}

func (s *rangeStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	s.mu.Lock()
	s.ranges[key]++
	s.mu.Unlock()
	if s.bad == nil {
		return storage.Range(ctx, s.Store, key, off, length)
	}
	rc, err := s.Store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	obj, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(s.bad(obj, off, length))), nil
}

// setupBig checkpoints a snapshot with one large random SST and two small
// files as checkpoint 1 of task t, behind a rangeStore.
func setupBig(t *testing.T) (*rangeStore, string, map[string][]byte) {
	base := t.TempDir()
	fs, err := file.New(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	st := &rangeStore{Store: fs, ranges: map[string]int{}, gets: map[string]int{}}
	snap := filepath.Join(base, "snap")
	os.MkdirAll(snap, 0o755)
	rng := rand.NewChaCha8([32]byte{1})
	files := map[string][]byte{"000007.sst": make([]byte, bigSize), "000008.sst": make([]byte, 300_000), "MANIFEST-000001": bytes.Repeat([]byte("m"), 70_000)}
	rng.Read(files["000007.sst"])
	rng.Read(files["000008.sst"])
	for name, b := range files {
		os.WriteFile(filepath.Join(snap, name), b, 0o644)
	}
	ctx := context.Background()
	ls, err := localrecovery.Open(filepath.Join(base, "local"), "job")
	if err != nil {
		t.Fatal(err)
	}
	sn, err := ls.Take("t", 1, snap, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		t.Fatal(err)
	}
	res, err := uploader.Upload(ctx, uploader.Request{Store: fs, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: 1, Created: time.Now(), Files: res.Files}
	for _, f := range res.Files {
		m.FullSize += f.Size
	}
	enc, _ := m.Encode(res.BytesWritten)
	if err := manifests.Commit(ctx, fs, m, enc); err != nil {
		t.Fatal(err)
	}
	return st, filepath.Join(base, "restored", "db"), files
}

func keyOf(t *testing.T, s storage.Store, name string) string {
	m, err := manifests.Load(context.Background(), s, "job", "t", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Files {
		if f.Name == name {
			return f.Key
		}
	}
	t.Fatalf("%s is not in the manifest", name)
	return ""
}

func TestALargeObjectIsFetchedInRangedPiecesByteExact(t *testing.T) {
	st, target, files := setupBig(t)
	var last, total int64
	var mu sync.Mutex
	res, err := restore.Run(context.Background(), restore.Options{Store: st, Job: "job", Task: "t", Target: target,
		Progress: func(done, all int64) { mu.Lock(); last, total = done, all; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(target, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s differs after a ranged restore (%v)", name, err)
		}
	}
	big, small := keyOf(t, st, "000007.sst"), keyOf(t, st, "000008.sst")
	if st.ranges[big] != 3 || st.gets[big] != 0 {
		t.Fatalf("the large object was read in %d ranges and %d whole reads, want 3 pieces and no whole read", st.ranges[big], st.gets[big])
	}
	if st.ranges[small] != 0 || st.gets[small] != 1 {
		t.Fatalf("the small object was read in %d ranges and %d whole reads, want one whole read", st.ranges[small], st.gets[small])
	}
	if res.BytesRemote != res.Bytes || last != total || total != res.Bytes {
		t.Fatalf("counted %d remote bytes, progress %d of %d, want %d", res.BytesRemote, last, total, res.Bytes)
	}
}

func TestABadRangeFailsTheRestoreNamingTheFile(t *testing.T) {
	cases := []struct {
		name string
		bad  func(obj []byte, off, length int64) []byte
		want string
	}{
		{"a short piece", func(obj []byte, off, length int64) []byte { return obj[off : off+length-1] }, "shorter"},
		{"an empty piece", func(obj []byte, off, length int64) []byte { return nil }, "shorter"},
		{"the whole object for a range", func(obj []byte, off, length int64) []byte { return obj[off:] }, "more than"},
		{"the bytes of another offset", func(obj []byte, off, length int64) []byte {
			if off == 0 {
				return obj[1 : 1+length]
			}
			return obj[off : off+length]
		}, "does not match the manifest"},
		{"a flipped byte in the last piece", func(obj []byte, off, length int64) []byte {
			b := bytes.Clone(obj[off : off+length])
			if off+length == int64(len(obj)) {
				b[len(b)-1] ^= 1
			}
			return b
		}, "does not match the manifest"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, target, _ := setupBig(t)
			st.bad = c.bad
			_, err := restore.Run(context.Background(), restore.Options{Store: st, Job: "job", Task: "t", Target: target})
			if err == nil || !strings.Contains(err.Error(), "000007.sst") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("restore with %s: %v, want an error naming 000007.sst and saying %q", c.name, err, c.want)
			}
			if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("a failed restore placed a target")
			}
			if left, _ := os.ReadDir(filepath.Dir(target)); len(left) != 0 {
				t.Fatalf("a failed restore left %d entries beside the target", len(left))
			}
		})
	}
}
