package manifests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func sample() *Manifest {
	sst := bytes.Repeat([]byte("s"), 1000)
	cur := []byte("MANIFEST-000001\n")
	big := bytes.Repeat([]byte("m"), 70000)
	return &Manifest{
		Job: "job", Task: "orders-3", Checkpoint: 7, Parent: 6, Created: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
		Engine: "pebble", AgentID: "node-1",
		Files: []File{
			{Name: "000005.sst", Kind: Shared, Size: 1000, SHA256: sha(sst), Key: SharedKey("job", sha(sst), 1000)},
			{Name: "marker.format-version.000001.013", Kind: Private, Size: 0, SHA256: sha(nil), Inline: []byte{}, Uploaded: true},
			{Name: "CURRENT", Kind: Private, Size: int64(len(cur)), SHA256: sha(cur), Inline: cur, Uploaded: true},
			{Name: "MANIFEST-000001", Kind: Private, Size: 70000, SHA256: sha(big), Key: PrivateKey("job", "orders-3", 7, "MANIFEST-000001"), Uploaded: true},
		},
		FullSize: 1000 + int64(len(cur)) + 70000, FilesUploaded: 2, FilesReused: 1,
	}
}

func TestEncodeDecodeRoundTripCountsItsOwnBytes(t *testing.T) {
	m := sample()
	enc, err := m.Encode(70000)
	if err != nil {
		t.Fatal(err)
	}
	if m.CheckpointSize != 70000+int64(len(enc)) {
		t.Fatalf("checkpoint size %d, want objects 70000 + manifest %d", m.CheckpointSize, len(enc))
	}
	got, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if got.CheckpointSize != m.CheckpointSize || len(got.Files) != 4 || string(got.Files[2].Inline) != "MANIFEST-000001\n" || got.Files[1].Inline == nil {
		t.Fatalf("round trip lost data: %+v", got)
	}
}

// reseal recomputes the envelope checksum after editing the body, so only
// the body's own checks can catch the edit.
func reseal(t *testing.T, enc []byte, edit func(body map[string]any)) []byte {
	var env envelope
	if err := json.Unmarshal(enc, &env); err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	json.Unmarshal(env.Body, &body)
	edit(body)
	env.Body, _ = json.Marshal(body)
	env.SHA256 = sha(env.Body)
	out, _ := json.Marshal(env)
	return out
}

func TestDecodeRefusesWhatStorageCannotBeTrustedWith(t *testing.T) {
	// Format 1's JSON body, edited field by field; format 2's are in
	// format_test.go.
	m := sample()
	m.Format = Format1
	enc, _ := m.Encode(0)
	setName := func(name string) func(map[string]any) {
		return func(b map[string]any) { b["files"].([]any)[0].(map[string]any)["name"] = name }
	}
	cases := map[string][]byte{
		"a flipped byte":          bytes.Replace(enc, []byte(`"pebble"`), []byte(`"pebblE"`), 1),
		"an unknown format":       bytes.Replace(enc, []byte(`"format":1`), []byte(`"format":9`), 1),
		"not JSON":                []byte("PK\x03\x04"),
		"a dot-dot name":          reseal(t, enc, setName("../evil")),
		"an absolute name":        reseal(t, enc, setName("/etc/passwd")),
		"a name with a separator": reseal(t, enc, setName("a/b")),
		"a name with NUL":         reseal(t, enc, setName("a\x00b")),
		"a dot name":              reseal(t, enc, setName(".")),
		"a duplicate name":        reseal(t, enc, setName("CURRENT")),
		"a shared key elsewhere":  reseal(t, enc, func(b map[string]any) { b["files"].([]any)[0].(map[string]any)["key"] = "other/shared/aa/x" }),
		"a private key elsewhere": reseal(t, enc, func(b map[string]any) {
			b["files"].([]any)[3].(map[string]any)["key"] = "job/tasks/x/chk/00000000000000000001/private/M"
		}),
		"inline bytes of wrong size": reseal(t, enc, func(b map[string]any) { b["files"].([]any)[2].(map[string]any)["size"] = 3 }),
		"a wrong full size":          reseal(t, enc, func(b map[string]any) { b["full_size"] = 1 }),
		"a bad task name":            reseal(t, enc, func(b map[string]any) { b["task"] = "../t" }),
		"an unknown field":           reseal(t, enc, func(b map[string]any) { b["surprise"] = 1 }),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := Decode(data); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func newStore(t *testing.T) storage.Store {
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func put(t *testing.T, s storage.Store, key string, data []byte) {
	if err := s.Put(context.Background(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
}

// commit stores a checkpoint of task with the given shared contents.
func commit(t *testing.T, s storage.Store, task string, n uint64, contents ...string) {
	m := &Manifest{Job: "job", Task: task, Checkpoint: n, Created: time.Now()}
	for i, c := range contents {
		b := []byte(c)
		f := File{Name: string(rune('a'+i)) + ".sst", Kind: Shared, Size: int64(len(b)), SHA256: sha(b), Key: SharedKey("job", sha(b), int64(len(b)))}
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
}

func TestCommitIsConditional(t *testing.T) {
	s := newStore(t)
	commit(t, s, "t", 1, "x")
	m := &Manifest{Job: "job", Task: "t", Checkpoint: 1}
	enc, _ := m.Encode(0)
	if err := Commit(context.Background(), s, m, enc); !errors.Is(err, ErrConflict) {
		t.Fatalf("second commit: %v, want ErrConflict", err)
	}
	got, err := Load(context.Background(), s, "job", "t", 1)
	if err != nil || len(got.Files) != 1 {
		t.Fatalf("the first manifest was not kept: %v %+v", err, got)
	}
}

// FuzzDecode: storage is not trusted. Whatever bytes a manifest object
// holds, Decode returns an error or a manifest whose every file name is a
// plain path element and whose keys stay inside the job; it never panics.
func FuzzDecode(f *testing.F) {
	good, _ := sample().Encode(0)
	f.Add(good)
	v1 := sample()
	v1.Format = Format1
	good1, _ := v1.Encode(0)
	f.Add(good1)
	mixed, _ := mixedSample().Encode(0)
	f.Add(mixed)
	f.Add([]byte(`{"format":1,"sha256":"","body":{}}`))
	f.Add([]byte(`{"format":2}`))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			return
		}
		for _, file := range m.Files {
			if ValidFileName(file.Name) != nil {
				t.Fatalf("accepted file name %q", file.Name)
			}
			if file.Key != "" && !strings.HasPrefix(file.Key, m.Job+"/") {
				t.Fatalf("accepted key %q outside job %q", file.Key, m.Job)
			}
		}
	})
}

func TestRetentionRetiresAllButTheNewestKeep(t *testing.T) {
	refs := []Ref{{Task: "t", Checkpoint: 1}, {Task: "t", Checkpoint: 2}, {Task: "t", Checkpoint: 5}}
	nums := func(rs []Ref) []uint64 {
		out := []uint64{}
		for _, r := range rs {
			out = append(out, r.Checkpoint)
		}
		return out
	}
	for _, c := range []struct {
		keep           int
		retained, gone []uint64
	}{
		{keep: 2, retained: []uint64{2, 5}, gone: []uint64{1}},
		{keep: 3, retained: []uint64{1, 2, 5}, gone: []uint64{}},
		{keep: 9, retained: []uint64{1, 2, 5}, gone: []uint64{}},
		{keep: 1, retained: []uint64{5}, gone: []uint64{1, 2}},
		{keep: 0, retained: []uint64{5}, gone: []uint64{1, 2}}, // never the newest
		{keep: -1, retained: []uint64{5}, gone: []uint64{1, 2}},
	} {
		retained, retire := Retention(refs, c.keep)
		if fmt.Sprint(nums(retained)) != fmt.Sprint(c.retained) || fmt.Sprint(nums(retire)) != fmt.Sprint(c.gone) {
			t.Errorf("keep %d: retained %v, retire %v; want %v, %v", c.keep, nums(retained), nums(retire), c.retained, c.gone)
		}
	}
	if retained, retire := Retention(nil, 2); len(retained) != 0 || len(retire) != 0 {
		t.Errorf("no checkpoints: retained %v, retire %v", retained, retire)
	}
	if refs[0].Checkpoint != 1 || refs[2].Checkpoint != 5 {
		t.Errorf("Retention changed its input: %v", refs)
	}
}

func TestLoadRetainedReportsAnUnreadableManifestAndLoadsTheRest(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	commit(t, s, "a", 1, "x")
	commit(t, s, "b", 1, "y")
	put(t, s, ManifestKey("job", "b", 2), []byte("{garbage"))
	cat, err := Scan(ctx, s, "job", "")
	if err != nil {
		t.Fatal(err)
	}
	ms, probs, err := LoadRetained(ctx, s, "job", cat.Retained(""))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || len(probs) != 1 || probs[0].Key != ManifestKey("job", "b", 2) || probs[0].Task != "b" || probs[0].Checkpoint != 2 {
		t.Fatalf("loaded %d manifests, problems %+v; want 2 and the garbage one", len(ms), probs)
	}
}

// countingStore counts Gets by key.
type countingStore struct {
	storage.Store
	mu   sync.Mutex
	gets map[string]int
}

func (c *countingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	c.mu.Lock()
	c.gets[key]++
	c.mu.Unlock()
	return c.Store.Get(ctx, key)
}

// VerifyAll reads an object shared by many checkpoints once, and reports
// a bad one against every checkpoint that names it.
func TestVerifyAllReadsEachObjectOnce(t *testing.T) {
	ctx := context.Background()
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: fs, gets: map[string]int{}}
	put := func(body string) File {
		sum := sha256.Sum256([]byte(body))
		f := File{Name: fmt.Sprintf("%06d.sst", len(body)), Kind: Shared, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}
		f.Key = SharedKey("j", f.SHA256, f.Size)
		if err := fs.Put(ctx, f.Key, strings.NewReader(body), f.Size); err != nil {
			t.Fatal(err)
		}
		return f
	}
	shared, other := put("shared by every checkpoint"), put("only in the last")
	var ms []*Manifest
	for n := uint64(1); n <= 5; n++ {
		m := &Manifest{Job: "j", Task: "t", Checkpoint: n, Files: []File{shared}}
		if n == 5 {
			m.Files = append(m.Files, other)
		}
		ms = append(ms, m)
	}
	probs, objects, n, err := VerifyAll(ctx, cs, ms, 4)
	if err != nil || len(probs) != 0 || objects != 2 || n != shared.Size+other.Size {
		t.Fatalf("VerifyAll: %v, %d objects, %d bytes, %v", probs, objects, n, err)
	}
	if cs.gets[shared.Key] != 1 {
		t.Fatalf("the shared object was read %d times, want once", cs.gets[shared.Key])
	}
	bad := strings.Repeat("x", int(shared.Size))
	if err := fs.Put(ctx, shared.Key, strings.NewReader(bad), shared.Size); err != nil {
		t.Fatal(err)
	}
	probs, _, _, err = VerifyAll(ctx, cs, ms, 4)
	if err != nil || len(probs) != 5 {
		t.Fatalf("a damaged shared object: %d problems (%v), want one per checkpoint naming it", len(probs), err)
	}
}

// CheckRef, which walks stored manifests instead of decoding them, reads
// an object shared by many checkpoints once, reports a bad one against
// every checkpoint that names it, and an unusable manifest as a problem.
func TestCheckRefReadsEachObjectOnceFromStoredManifests(t *testing.T) {
	ctx := context.Background()
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: fs, gets: map[string]int{}}
	put := func(body string) File {
		f := File{Name: fmt.Sprintf("%06d.sst", len(body)), Kind: Shared, Size: int64(len(body))}
		f.SetDigest(SumBytes(BLAKE3, []byte(body)))
		f.Key = SharedKey("j", f.Digest(), f.Size)
		if err := fs.Put(ctx, f.Key, strings.NewReader(body), f.Size); err != nil {
			t.Fatal(err)
		}
		return f
	}
	shared, other := put("shared by every checkpoint"), put("only in the last")
	var refs []Ref
	for n := uint64(1); n <= 5; n++ {
		m := &Manifest{Job: "j", Task: "t", Checkpoint: n, Files: []File{shared}, FullSize: shared.Size}
		if n == 5 {
			m.Files = append(m.Files, other)
			m.FullSize += other.Size
		}
		enc, err := m.Encode(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := Commit(ctx, fs, m, enc); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, RefOf(m))
	}
	check := func() ([]Problem, *Verifier) {
		v := NewVerifier(cs, 4)
		var probs []Problem
		for _, r := range refs {
			p, err := v.CheckRef(ctx, "j", r)
			if err != nil {
				t.Fatal(err)
			}
			probs = append(probs, p...)
		}
		return probs, v
	}
	probs, v := check()
	if len(probs) != 0 || v.Objects != 2 || v.Bytes != shared.Size+other.Size || cs.gets[shared.Key] != 1 {
		t.Fatalf("CheckRef: %v, %d objects, %d bytes, the shared one read %d times", probs, v.Objects, v.Bytes, cs.gets[shared.Key])
	}
	bad := strings.Repeat("x", int(shared.Size))
	if err := fs.Put(ctx, shared.Key, strings.NewReader(bad), shared.Size); err != nil {
		t.Fatal(err)
	}
	if probs, _ = check(); len(probs) != 5 || probs[4].File != shared.Name || probs[4].Checkpoint != 5 {
		t.Fatalf("a damaged shared object: %+v, want one problem per checkpoint naming it", probs)
	}
	if err := fs.Put(ctx, refs[2].Key, strings.NewReader("{}"), 2); err != nil {
		t.Fatal(err)
	}
	if probs, _ = check(); len(probs) != 5 || probs[2].Checkpoint != 3 || probs[2].File != "" {
		t.Fatalf("an unusable manifest: %+v, want it as a problem of its own", probs)
	}
}
