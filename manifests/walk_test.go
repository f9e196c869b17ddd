package manifests

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
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
	format, _, body, b64, ok := splitEnvelope(enc)
	if !ok || !b64 || format != Format2 {
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
		got, serr := keys(func(fn func(*FileView) error) error { return StreamWalkRef(ctx, s, m.Job, ref, fn) })
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

// reseal1 wraps a format 1 body in an envelope with a valid checksum.
func reseal1(body []byte) []byte {
	out, _ := json.Marshal(envelope{Format: Format1, SHA256: sha(body), Body: body})
	return out
}

// body1 returns the JSON body of m in format 1.
func body1(t testing.TB, m *Manifest) []byte {
	m.Format = Format1
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	var env envelope
	if err := json.Unmarshal(enc, &env); err != nil {
		t.Fatal(err)
	}
	return env.Body
}

// TestWalkStreamsFormat1AsEncodeWritesIt: a format 1 body as Encode
// writes it, names in order, is walked token by token; bodies spelled
// otherwise (fields reordered, repeated, in other case) are decoded whole,
// with Decode's result, and a misplaced one is refused by WalkRef.
func TestWalkStreamsFormat1AsEncodeWritesIt(t *testing.T) {
	m := sample()
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
	body := body1(t, m)
	seen := 0
	if _, n, err := walkBody1(body, func(*Manifest) error { return nil }, func(*FileView) error { seen++; return nil }); err != nil || n != len(m.Files) || seen != n {
		t.Fatalf("the streaming path: %v, %d files, %d seen", err, n, seen)
	}
	respelled := map[string][]byte{
		"files first":            bytes.Replace(bytes.Replace(body, []byte(`{"job":"job",`), []byte(`{`), 1), []byte(`,"full_size"`), []byte(`,"job":"job","full_size"`), 1),
		"epoch after the files":  bytes.Replace(body, []byte(`,"full_size"`), []byte(`,"epoch":3,"full_size"`), 1),
		"a field twice":          bytes.Replace(body, []byte(`,"full_size"`), []byte(`,"task":"other","full_size"`), 1),
		"a field in other case":  bytes.Replace(body, []byte(`,"full_size"`), []byte(`,"Task":"other","full_size"`), 1),
		"files in other case":    bytes.Replace(body, []byte(`"files":`), []byte(`"Files":`), 1),
		"files null":             bytes.Replace(bytes.Replace(body, []byte(`"files":[`), []byte(`"files":null,"x":[`), 1), []byte(`"full_size":71016`), []byte(`"full_size":0`), 1),
		"a wrong full size":      bytes.Replace(body, []byte(`"full_size":71016`), []byte(`"full_size":71017`), 1),
		"an unknown file field":  bytes.Replace(body, []byte(`"uploaded":true}`), []byte(`"uploaded":true,"x":1}`), 1),
		"an unknown field":       bytes.Replace(body, []byte(`{"job"`), []byte(`{"x":1,"job"`), 1),
		"a file of another type": bytes.Replace(body, []byte(`"size":1000`), []byte(`"size":"1000"`), 1),
	}
	if !bytes.Contains(body, []byte(`"full_size":71016`)) {
		t.Fatalf("the sample's body changed: %s", body)
	}
	for name, b := range respelled {
		t.Run(name, func(t *testing.T) {
			if bytes.Equal(b, body) {
				t.Fatal("the edit did not apply")
			}
			walkMatchesDecode(t, reseal1(b))
		})
	}
	// Encode's envelope is read without a copy of the body; one that only
	// looks like it, around a body that is not JSON, is refused.
	if _, _, _, b64, ok := splitEnvelope(reseal1(body)); !ok || b64 {
		t.Fatal("Encode's format 1 envelope is not the one splitEnvelope reads")
	}
	for _, tail := range []string{" x", "}", ",", ` "a"`} {
		b := append(bytes.Clone(body), tail...)
		data := []byte(`{"format":1,"sha256":"` + sha(b) + `","body":` + string(b) + `}`)
		if _, _, err := Walk(data, nil); err == nil {
			t.Fatalf("accepted a body followed by %q", tail)
		}
		walkMatchesDecode(t, data)
	}
	// Misplaced once the whole header is read: refused, as Decode's
	// header says. (No private file with a key: its key names the epoch.)
	s := newFileStore(t)
	m.Files = slices.DeleteFunc(m.Files, func(f File) bool { return f.Name == "MANIFEST-000001" })
	m.FullSize -= 70000
	data := reseal1(bytes.Replace(body1(t, m), []byte(`,"full_size"`), []byte(`,"epoch":3,"full_size"`), 1))
	ref := RefOf(m)
	if err := s.Put(context.Background(), ref.Key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	var bad *UnreadableError
	if _, _, err := WalkRef(context.Background(), s, m.Job, ref, nil); !errors.As(err, &bad) || !strings.Contains(err.Error(), "not where it is stored") {
		t.Fatalf("a manifest whose epoch, after its files, names another place: %v", err)
	}
}

// FuzzWalkMatchesDecodeFormat1: any format 1 body behind a valid checksum
// is accepted by Walk exactly when Decode accepts it, with the same files.
func FuzzWalkMatchesDecodeFormat1(f *testing.F) {
	m := sample()
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
	f.Add(body1(f, m))
	f.Add(body1(f, sample()))
	f.Add([]byte(`{"job":"j","task":"t","checkpoint":1,"files":[],"full_size":0}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		walkMatchesDecode(t, reseal1(body))
	})
}
