package manifests

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var update = flag.Bool("update", false, "rewrite the golden manifests in testdata/ (format 2 only: format 1's were written by the last build that wrote format 1 by default)")

// mixedSample is a format 2 manifest whose files carry both algorithms: a
// job that switched from format 1 reuses its SHA-256 objects.
func mixedSample() *Manifest {
	m := sample()
	sst := []byte("a new sst, hashed with blake3")
	f := File{Name: "000009.sst", Kind: Shared, Size: int64(len(sst)), Uploaded: true}
	f.SetDigest(SumBytes(BLAKE3, sst))
	f.Key = SharedKey(m.Job, f.Digest(), f.Size) + ".0123456789abcdef" // a FreshKey, fixed for the golden file
	g := File{Name: "OPTIONS-000003", Kind: Private, Size: 3, Inline: []byte("opt"), Uploaded: true}
	g.SetDigest(SumBytes(BLAKE3, g.Inline))
	m.Files = append(m.Files, f, g)
	m.FullSize += f.Size + g.Size
	return m
}

func TestFormat1ManifestsOfEarlierBuildsStillDecodeByteForByte(t *testing.T) {
	paths, _ := filepath.Glob("testdata/format1-*.manifest")
	if len(paths) == 0 {
		t.Fatal("no format 1 fixtures in testdata/")
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Decode(data)
			if err != nil {
				t.Fatalf("a format 1 manifest no longer decodes: %v", err)
			}
			if m.Format != Format1 || len(m.Files) == 0 {
				t.Fatalf("format %d, %d files", m.Format, len(m.Files))
			}
			for _, f := range m.Files {
				if f.Alg() != SHA256 || f.BLAKE3 != "" {
					t.Fatalf("file %s of a format 1 manifest is not sha256: %+v", f.Name, f)
				}
			}
			// Written again as format 1, it is the same bytes: a ckpt
			// that knows format 1 only reads what --manifest-format 1 writes.
			again, err := m.Encode(m.CheckpointSize - int64(len(data)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, data) {
				t.Fatalf("format 1 encoding changed:\n got %s\nwant %s", again, data)
			}
		})
	}
}

func TestFormat2RoundTripsFilesOfBothAlgorithms(t *testing.T) {
	m := mixedSample()
	enc, err := m.Encode(123)
	if err != nil {
		t.Fatal(err)
	}
	if m.Format != Format2 || m.CheckpointSize != 123+int64(len(enc)) {
		t.Fatalf("format %d, checkpoint size %d for %d bytes", m.Format, m.CheckpointSize, len(enc))
	}
	golden := "testdata/format2-mixed.manifest"
	if *update {
		os.WriteFile(golden, enc, 0o644)
	}
	got, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip changed the manifest:\n got %+v\nwant %+v", got, m)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(enc, want) {
		t.Fatalf("format 2 encoding changed (run go test -update if on purpose):\n got %s\nwant %s", enc, want)
	}
}

func TestFormat2OfEarlierBuildsStillDecodes(t *testing.T) {
	// Written by builds that compressed the file table at flate's default
	// level: the decoder reads any level.
	data, err := os.ReadFile("testdata/format2-mixed-flate6.manifest")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatalf("an earlier format 2 manifest no longer decodes: %v", err)
	}
	want := mixedSample()
	want.Format, want.CheckpointSize = Format2, got.CheckpointSize
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v\nwant %+v", got, want)
	}
}

func TestFormat1RefusesBLAKE3Files(t *testing.T) {
	m := mixedSample()
	m.Format = Format1
	if _, err := m.Encode(0); err == nil || !strings.Contains(err.Error(), "000009.sst") {
		t.Fatalf("format 1 encoded a blake3 id: %v", err)
	}
}

func TestAnOlderReaderRefusesFormat2WithAClearError(t *testing.T) {
	enc, _ := sample().Encode(0)
	// What a build that reads format 1 only sees: the envelope.
	var env struct {
		Format int `json:"format"`
	}
	if err := json.Unmarshal(enc, &env); err != nil || env.Format != 2 {
		t.Fatalf("format 2's envelope is not JSON with format 2: %v %d", err, env.Format)
	}
	_, err := Decode(bytes.Replace(enc, []byte(`"format":2`), []byte(`"format":3`), 1))
	if err == nil || !strings.Contains(err.Error(), "upgrade ckpt") {
		t.Fatalf("format 3: %v", err)
	}
}

// reseal2 rebuilds a format 2 envelope around raw (header and compressed
// table), with a valid checksum: only the body's own checks can refuse it.
func reseal2(raw []byte) []byte {
	body, _ := json.Marshal(base64.StdEncoding.EncodeToString(raw))
	out, _ := json.Marshal(envelope{Format: Format2, SHA256: sha(body), Body: body})
	return out
}

// body2 returns the header and the compressed table of a format 2 manifest.
func body2(t *testing.T, m *Manifest) (header, table []byte) {
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	var env envelope
	var s string
	json.Unmarshal(enc, &env)
	json.Unmarshal(env.Body, &s)
	raw, _ := base64.StdEncoding.DecodeString(s)
	n, k := binary.Uvarint(raw)
	return raw[k : k+int(n)], raw[k+int(n):]
}

func notBase64() []byte {
	body := []byte(`"@@not base64@@"`)
	out, _ := json.Marshal(envelope{Format: Format2, SHA256: sha(body), Body: body})
	return out
}

func join2(header, table []byte) []byte {
	return append(binary.AppendUvarint(nil, uint64(len(header))), append(append([]byte{}, header...), table...)...)
}

func TestDecodeRefusesTamperedFormat2(t *testing.T) {
	for name, data := range tamperedFormat2(t, mixedSample) {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(data)
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
		})
	}
}

// tamperedFormat2 returns format 2 manifests that every reader must
// refuse, by what is wrong with them, made from base (mixedSample's files
// in any order).
func tamperedFormat2(t *testing.T, base func() *Manifest) map[string][]byte {
	enc, _ := base().Encode(0)
	header, table := body2(t, base())
	edited := func(edit func(m *Manifest)) []byte {
		m := base()
		edit(m)
		h, tb := body2(t, m)
		return reseal2(join2(h, tb))
	}
	rawTable := func(raw []byte) []byte {
		m := &Manifest{Job: "job", Task: "t", Checkpoint: 1}
		h, _ := body2(t, m)
		return reseal2(join2(h, deflate(t, raw)))
	}
	cases := map[string][]byte{
		"a flipped base64 character":           bytes.Replace(enc, []byte(`"body":"`), []byte(`"body":"A`), 1),
		"not base64":                           notBase64(),
		"a header length past the end":         reseal2(append(binary.AppendUvarint(nil, 1<<40), header...)),
		"a truncated table":                    reseal2(join2(header, table[:len(table)/2])),
		"bytes after the table":                rawTable([]byte{0, 7}),
		"more files than bytes":                rawTable(binary.AppendUvarint(nil, 1<<40)),
		"unknown flags":                        rawTable(append([]byte{1, 0x80, 0, 1, 'a', 1}, make([]byte, 32)...)),
		"a name sharing past the previous one": rawTable(append([]byte{1, 0, 3, 1, 'a', 1}, make([]byte, 32)...)),
		"a dot-dot name":                       edited(func(m *Manifest) { fileOf(m, "000005.sst").Name = ".." }),
		"a name with a separator":              edited(func(m *Manifest) { fileOf(m, "000009.sst").Name = "a/b" }),
		"a duplicate name":                     edited(func(m *Manifest) { fileOf(m, "000009.sst").Name = "CURRENT" }),
		"a blake3 file under a sha256 key": edited(func(m *Manifest) {
			fileOf(m, "000009.sst").Key = SharedKey("job", sha([]byte("x")), fileOf(m, "000009.sst").Size)
		}),
		"a key outside the job":        edited(func(m *Manifest) { fileOf(m, "000009.sst").Key = "other/shared/aa/x" }),
		"inline bytes of another hash": edited(func(m *Manifest) { fileOf(m, "OPTIONS-000003").Inline = []byte("OPT") }),
		"a wrong full size":            edited(func(m *Manifest) { m.FullSize++ }),
		"a bad task name":              edited(func(m *Manifest) { m.Task = "../t" }),
		"files in the header":          reseal2(join2(bytes.Replace(header, []byte(`"files":null`), []byte(`"files":[]`), 1), table)),
		"an unknown header field":      reseal2(join2(bytes.Replace(header, []byte(`{`), []byte(`{"surprise":1,`), 1), table)),
	}
	return cases
}

// fileOf returns the file of m named name.
func fileOf(m *Manifest, name string) *File {
	for i := range m.Files {
		if m.Files[i].Name == name {
			return &m.Files[i]
		}
	}
	panic("no file " + name)
}

func deflate(t *testing.T, raw []byte) []byte {
	var b bytes.Buffer
	w, err := flate.NewWriter(&b, flate.DefaultCompression)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(raw)
	w.Close()
	return b.Bytes()
}

// FuzzDecodeFormat2Table: the file table of a format 2 manifest, after
// the checksum and the compression, is parsed without a panic and yields
// only plain file names and keys inside the job.
func FuzzDecodeFormat2Table(f *testing.F) {
	raw := func(m *Manifest) []byte {
		tb, _ := m.encodeTable()
		var b bytes.Buffer
		fr := flate.NewReader(bytes.NewReader(tb))
		b.ReadFrom(fr)
		return b.Bytes()
	}
	f.Add(raw(sample()))
	f.Add(raw(mixedSample()))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, table []byte) {
		m := &Manifest{Job: "job", Task: "orders-3", Checkpoint: 7, Format: Format2}
		files, err := m.decodeTable(table)
		if err != nil {
			return
		}
		m.Files = files
		for _, f := range files {
			m.FullSize += f.Size
		}
		if m.Validate() != nil {
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

// TestEncodeDecodeRoundTripsAnyManifest: whatever a writer puts in a valid
// manifest comes back equal from both formats (format 1: sha256 ids only).
func TestEncodeDecodeRoundTripsAnyManifest(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := drawManifest(t)
		enc, err := m.Encode(rapid.Int64Range(0, 1<<40).Draw(t, "objects"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(enc)
		if err != nil {
			t.Fatalf("a valid manifest does not decode: %v", err)
		}
		if m.Files == nil {
			m.Files = []File{}
		}
		if got.Files == nil {
			got.Files = []File{}
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip changed the manifest:\n got %+v\nwant %+v", got, m)
		}
	})
}

// drawManifest draws a valid manifest of format 1 or 2: files of every
// kind, fresh keys, both algorithms (format 2), names in any order.
func drawManifest(t *rapid.T) *Manifest {
	format := rapid.SampledFrom([]int{Format1, Format2}).Draw(t, "format")
	m := &Manifest{
		Job:        rapid.StringMatching(`[a-z][a-z0-9-]{0,8}`).Draw(t, "job"),
		Task:       rapid.StringMatching(`[a-z][a-z0-9.-]{0,8}`).Draw(t, "task"),
		Checkpoint: rapid.Uint64Range(1, 1<<40).Draw(t, "n"),
		Parent:     rapid.Uint64Range(0, 1<<40).Draw(t, "parent"),
		Created:    time.Unix(rapid.Int64Range(0, 1<<34).Draw(t, "created"), 0).UTC(),
		Epoch:      rapid.Uint64Range(0, 5).Draw(t, "epoch"),
		Format:     format,
	}
	names := rapid.SliceOfDistinct(rapid.StringMatching(`[0-9]{6}\.sst|MANIFEST-[0-9]{6}|[A-Za-z0-9._-]{1,40}`), rapid.ID[string]).Draw(t, "names")
	for _, name := range names {
		if name == "." || name == ".." {
			continue
		}
		alg := SHA256
		if format == Format2 && rapid.Bool().Draw(t, "blake3") {
			alg = BLAKE3
		}
		data := []byte(rapid.StringN(0, 40, -1).Draw(t, "data"))
		f := File{Name: name, Size: int64(len(data)), Uploaded: rapid.Bool().Draw(t, "uploaded")}
		f.SetDigest(SumBytes(alg, data))
		switch rapid.IntRange(0, 2).Draw(t, "kind") {
		case 0:
			f.Kind, f.Key = Shared, SharedKey(m.Job, f.Digest(), f.Size)
			if rapid.Bool().Draw(t, "fresh") {
				f.Key = FreshKey(f.Key)
			}
		case 1:
			f.Kind, f.Inline = Private, data
		default:
			f.Kind, f.Key = Private, PrivateKeyOf(m.Job, m.Task, m.Checkpoint, m.Epoch, name)
		}
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	return m
}

func TestEncodeKnowsADefaultKeyWithoutBuildingIt(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := &Manifest{Job: rapid.SampledFrom([]string{"job", "j", "job-2"}).Draw(t, "job"), Task: "t", Checkpoint: 3, Epoch: rapid.Uint64Range(0, 2).Draw(t, "epoch")}
		f := File{Name: "000001.sst", Kind: rapid.SampledFrom([]Kind{Shared, Private}).Draw(t, "kind"), Size: rapid.Int64Range(0, 1<<40).Draw(t, "size")}
		sum := rapid.StringMatching(`[0-9a-f]{64}`).Draw(t, "sum")
		f.SetDigest(digestOf(rapid.SampledFrom([]Alg{SHA256, BLAKE3}).Draw(t, "alg"), sum))
		f.Key = m.defaultKey(f)
		switch rapid.IntRange(0, 4).Draw(t, "change") {
		case 1: // a fresh key
			f.Key += ".0123456789abcdef"
		case 2: // another size
			f.Key = SharedKey(m.Job, f.Digest(), f.Size+1)
		case 3: // another job
			f.Key = SharedKey(m.Job+"x", f.Digest(), f.Size)
		case 4: // cut short
			f.Key = f.Key[:rapid.IntRange(0, len(f.Key)-1).Draw(t, "cut")]
		}
		if got, want := m.hasDefaultKey(&f), f.Key == m.defaultKey(f); got != want {
			t.Fatalf("hasDefaultKey(%q) = %v, want %v", f.Key, got, want)
		}
	})
}

func TestEncodeDecodesHashesAsHexDoes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		raw := rapid.SliceOfN(rapid.Byte(), hashLen, hashLen).Draw(t, "sum")
		s := hex.EncodeToString(raw)
		if rapid.Bool().Draw(t, "upper") {
			s = strings.ToUpper(s)
		}
		if rapid.Bool().Draw(t, "spoil") {
			i := rapid.IntRange(0, len(s)-1).Draw(t, "at")
			c := rapid.SampledFrom([]byte{'g', 'G', 'x', ' ', 0, 0xff, '/', ':', '@', '`'}).Draw(t, "with")
			s = s[:i] + string([]byte{c}) + s[i+1:]
		}
		want, err := hex.DecodeString(s)
		var got [hashLen]byte
		ok := decodeHash(&got, s)
		if ok != (err == nil) || (ok && !bytes.Equal(got[:], want)) {
			t.Fatalf("decodeHash(%q) = %x %v, hex says %x %v", s, got, ok, want, err)
		}
	})
}
