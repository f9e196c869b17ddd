package manifests

import (
	"bytes"
	"compress/flate"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// walkAll walks data and returns the header and the files fn saw.
func walkAll(data []byte) (*Manifest, []File, error) {
	var files []File
	m, n, err := Walk(data, func(v *FileView) error {
		files = append(files, v.File())
		return nil
	})
	if err == nil && n != len(files) {
		return nil, nil, errors.New("count differs from the files walked")
	}
	return m, files, err
}

// walkMatchesDecode fails unless Walk accepts exactly what Decode accepts
// and hands over the files Decode returns, in order, with the same header.
func walkMatchesDecode(t interface {
	Helper()
	Fatalf(string, ...any)
}, data []byte) {
	t.Helper()
	want, derr := Decode(data)
	got, files, werr := walkAll(data)
	if (derr == nil) != (werr == nil) {
		t.Fatalf("Decode: %v\nWalk: %v", derr, werr)
	}
	if derr != nil {
		return
	}
	if len(want.Files) == 0 {
		want.Files = nil
	}
	if !reflect.DeepEqual(files, want.Files) {
		t.Fatalf("Walk's files differ from Decode's:\n got %+v\nwant %+v", files, want.Files)
	}
	want.Files = nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Walk's header differs from Decode's:\n got %+v\nwant %+v", got, want)
	}
}

// TestWalkMatchesDecodeOnAnyManifest: for any valid manifest of either
// format, names sorted (the streaming path) or not (the decoded one),
// Walk hands over what Decode returns.
func TestWalkMatchesDecodeOnAnyManifest(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := drawManifest(t)
		if rapid.Bool().Draw(t, "sorted") {
			sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
		}
		enc, err := m.Encode(0)
		if err != nil {
			t.Fatal(err)
		}
		walkMatchesDecode(t, enc)
	})
}

func TestWalkMatchesDecodeOnStoredManifests(t *testing.T) {
	paths, _ := filepath.Glob("testdata/*.manifest")
	if len(paths) == 0 {
		t.Fatal("no golden manifests")
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		walkMatchesDecode(t, data)
	}
}

// TestWalkRefusesWhatDecodeRefuses runs the tampered manifests of
// TestDecodeRefusesTamperedFormat2 through both, with the files in the
// sample's order (Walk decodes them whole) and sorted (Walk streams them).
func TestWalkRefusesWhatDecodeRefuses(t *testing.T) {
	cases := map[string][]byte{}
	for name, data := range tamperedFormat2(t, mixedSample) {
		cases["unsorted, "+name] = data
	}
	for name, data := range tamperedFormat2(t, sortedMixedSample) {
		cases["sorted, "+name] = data
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if _, _, err := Walk(data, nil); err == nil {
				t.Fatal("Walk accepted it")
			}
			walkMatchesDecode(t, data)
		})
	}
}

// TestWalkStreamsASortedTable: the streaming path is the one taken for a
// sorted table (not the decoded fallback), and files a later problem
// condemns were handed over before the error: a caller keeps what fn
// gathered only when Walk succeeds.
func TestWalkStreamsASortedTable(t *testing.T) {
	m := sortedMixedSample()
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	format, _, body, ok := splitEnvelope(enc)
	if !ok || format != Format2 {
		t.Fatal("Encode's envelope is not the one splitEnvelope reads")
	}
	seen := 0
	if _, _, err := walkBody2(body, true, func(*Manifest) error { return nil }, func(*FileView) error { seen++; return nil }); err != nil || seen != len(m.Files) {
		t.Fatalf("the streaming path: %v, %d of %d files", err, seen, len(m.Files))
	}

	m.Files[len(m.Files)-1].Name = "zz/bad"
	h, tb := body2(t, m)
	bad := reseal2(join2(h, tb))
	seen = 0
	if _, _, err := Walk(bad, func(*FileView) error { seen++; return nil }); err == nil {
		t.Fatal("accepted a bad last name")
	}
	if seen != len(m.Files)-1 {
		t.Fatalf("saw %d files before the bad one, want %d", seen, len(m.Files)-1)
	}
}

// TestWalkReturnsFnErrorAsIs: fn's error stops the walk and comes back
// unwrapped, from Walk and WalkRef alike, not as an unreadable manifest.
func TestWalkReturnsFnErrorAsIs(t *testing.T) {
	stop := errors.New("enough")
	m := sample()
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Walk(enc, func(*FileView) error { return stop }); err != stop {
		t.Fatalf("Walk: %v", err)
	}
	s := newFileStore(t)
	if err := Commit(context.Background(), s, m, enc); err != nil {
		t.Fatal(err)
	}
	_, _, err = WalkRef(context.Background(), s, m.Job, RefOf(m), func(*FileView) error { return stop })
	if err != stop {
		t.Fatalf("WalkRef: %v", err)
	}
}

// TestWalkRefShowsNoFileOfAMisplacedManifest: a manifest stored under
// another checkpoint's key is unreadable, and fn sees none of its files.
func TestWalkRefShowsNoFileOfAMisplacedManifest(t *testing.T) {
	ctx := context.Background()
	s := newFileStore(t)
	for _, format := range []int{Format1, Format2} {
		m := sample()
		m.Format = format
		enc, err := m.Encode(0)
		if err != nil {
			t.Fatal(err)
		}
		ref := RefOf(m)
		ref.Checkpoint++
		ref.Key = ManifestKeyOf(m.Job, m.Task, ref.Checkpoint, ref.Epoch)
		if err := s.Put(ctx, ref.Key, bytes.NewReader(enc), int64(len(enc))); err != nil {
			t.Fatal(err)
		}
		seen := 0
		_, _, err = WalkRef(ctx, s, m.Job, ref, func(*FileView) error { seen++; return nil })
		var bad *UnreadableError
		if !errors.As(err, &bad) || !strings.Contains(err.Error(), "not where it is stored") || seen != 0 {
			t.Fatalf("format %d: err %v, %d files seen", format, err, seen)
		}
		if err := s.Delete(ctx, ref.Key); err != nil {
			t.Fatal(err)
		}
	}
}

// sortedMixedSample is mixedSample with its files in name order, as
// ckpt's writers store them.
func sortedMixedSample() *Manifest {
	m := mixedSample()
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
	return m
}

func newFileStore(t testing.TB) storage.Store {
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// FuzzWalkMatchesDecode: any file table behind a valid checksum and
// header is accepted by Walk exactly when Decode accepts it, with the same
// files.
func FuzzWalkMatchesDecode(f *testing.F) {
	raw := func(m *Manifest) []byte {
		tb, _ := m.encodeTable()
		var b bytes.Buffer
		b.ReadFrom(flate.NewReader(bytes.NewReader(tb)))
		return b.Bytes()
	}
	f.Add(raw(sample()), false)
	f.Add(raw(mixedSample()), true)
	f.Add(raw(sortedMixedSample()), true)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, table []byte, fixSize bool) {
		m := &Manifest{Job: "job", Task: "orders-3", Checkpoint: 7, Format: Format2}
		if fixSize {
			// A table that parses gets the full size it sums to, so the
			// per-file checks are reached.
			if files, err := m.decodeTable(table); err == nil {
				for _, f := range files {
					m.FullSize += f.Size
				}
			}
		}
		h, _ := body2(t, m)
		var b bytes.Buffer
		w, _ := flate.NewWriter(&b, flate.BestSpeed)
		w.Write(table)
		w.Close()
		walkMatchesDecode(t, reseal2(join2(h, b.Bytes())))
	})
}

// TestStreamWalkRefSeesWhatWalkRefSees: GC's streamed walk accepts the
// manifests WalkRef accepts, whatever their spelling, with the same keys,
// and refuses those it refuses (tampered, truncated, misplaced).
func TestStreamWalkRefSeesWhatWalkRefSees(t *testing.T) {
	ctx := context.Background()
	s := newFileStore(t)
	rapid.Check(t, func(t *rapid.T) {
		m := drawManifest(t)
		if rapid.Bool().Draw(t, "sorted") {
			sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
		}
		enc, err := m.Encode(0)
		if err != nil {
			t.Fatal(err)
		}
		ref := RefOf(m)
		switch rapid.IntRange(0, 7).Draw(t, "spelling") {
		case 1: // valid JSON, not Encode's spelling
			enc = bytes.Replace(enc, []byte(`"body":`), []byte(`"body" : `), 1)
		case 2:
			enc = append(enc, " \n"...)
		case 3:
			enc = bytes.Replace(enc, []byte("/"), []byte(`\/`), 1)
		case 4: // corrupt
			enc[rapid.IntRange(0, len(enc)-1).Draw(t, "at")] ^= byte(rapid.IntRange(1, 255).Draw(t, "bits"))
		case 5:
			enc = enc[:rapid.IntRange(0, len(enc)-1).Draw(t, "cut")]
		case 6:
			enc = append(enc, `{}`...)
		case 7: // stored under another checkpoint
			ref.Checkpoint++
			ref.Key = ManifestKeyOf(m.Job, m.Task, ref.Checkpoint, ref.Epoch)
		}
		if err := s.Put(ctx, ref.Key, bytes.NewReader(enc), int64(len(enc))); err != nil {
			t.Fatal(err)
		}
		defer s.Delete(ctx, ref.Key)
		keys := func(walk func(fn func(*FileView) error) error) (map[string]bool, error) {
			got := map[string]bool{}
			err := walk(func(v *FileView) error {
				got[string(v.Key)] = true
				return nil
			})
			return got, err
		}
		want, werr := keys(func(fn func(*FileView) error) error {
			_, _, err := WalkRef(ctx, s, m.Job, ref, fn)
			return err
		})
		got, serr := keys(func(fn func(*FileView) error) error { return streamWalkRef(ctx, s, m.Job, ref, fn) })
		if (werr == nil) != (serr == nil) {
			t.Fatalf("WalkRef: %v\nstreamWalkRef: %v", werr, serr)
		}
		var bad *UnreadableError
		if werr != nil && errors.As(werr, &bad) != errors.As(serr, &bad) {
			t.Fatalf("WalkRef: %v\nstreamWalkRef: %v (one unreadable, the other not)", werr, serr)
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("streamed keys %v, want %v", got, want)
		}
	})
}
