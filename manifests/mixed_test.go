package manifests

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// commitAlg stores a checkpoint of task in format with shared contents,
// each hashed with the algorithm its name asks for ("sha:..." SHA-256,
// else BLAKE3; format 1 takes SHA-256 only).
func commitAlg(t *testing.T, s storage.Store, task string, n uint64, format int, contents ...string) *Manifest {
	t.Helper()
	m := &Manifest{Job: "job", Task: task, Checkpoint: n, Created: time.Now(), Format: format}
	for i, c := range contents {
		alg := BLAKE3
		if strings.HasPrefix(c, "sha:") || format == Format1 {
			alg = SHA256
		}
		b := []byte(strings.TrimPrefix(c, "sha:"))
		f := File{Name: string(rune('a'+i)) + ".sst", Kind: Shared, Size: int64(len(b))}
		f.SetDigest(SumBytes(alg, b))
		f.Key = SharedKey("job", f.Digest(), f.Size)
		put(t, s, f.Key, b)
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := Commit(context.Background(), s, m, enc); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestKeysOfTheTwoAlgorithmsNeverCollideAndKeepTheirSpread(t *testing.T) {
	b := []byte("same bytes")
	k1, k2 := SharedKey("job", SumBytes(SHA256, b), 10), SharedKey("job", SumBytes(BLAKE3, b), 10)
	if k1 == k2 || !strings.Contains(k2, "/b3-") || strings.Contains(k1, "/b3-") {
		t.Fatalf("keys %s and %s", k1, k2)
	}
	for _, k := range []string{k1, k2} {
		rest := strings.TrimPrefix(k, SharedPrefix("job"))
		hh, id, _ := strings.Cut(rest, "/")
		if len(hh) != 2 || !strings.HasPrefix(strings.TrimPrefix(id, "b3-"), hh) {
			t.Fatalf("key %s: spread %q is not the hash's first two digits", k, hh)
		}
	}
}

func TestVerifyNamesTheCorruptFileUnderEitherAlgorithm(t *testing.T) {
	for _, c := range []struct {
		content, alg string
	}{{"sha:an object keyed by sha256", "sha256"}, {"an object keyed by blake3", "blake3"}} {
		t.Run(c.alg, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s, err := file.New(dir)
			if err != nil {
				t.Fatal(err)
			}
			m := commitAlg(t, s, "t", 1, Format2, "sha:intact", c.content)
			if problems, _, err := Verify(ctx, s, m, 2); err != nil || len(problems) != 0 {
				t.Fatalf("intact checkpoint: %v %v", problems, err)
			}
			p := filepath.Join(dir, m.Files[1].Key)
			b, _ := os.ReadFile(p)
			b[3] ^= 1 // same size: only the hash can tell
			os.WriteFile(p, b, 0o644)
			problems, _, err := Verify(ctx, s, m, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(problems) != 1 || problems[0].File != "b.sst" || !strings.HasPrefix(problems[0].Problem, c.alg+" ") {
				t.Fatalf("problems %+v, want b.sst's %s mismatch", problems, c.alg)
			}
		})
	}
}
