package manifests

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"
)

// sizedManifest builds a checkpoint of n shared SSTs named like Pebble's
// (000123.sst) of the given algorithm, plus the usual private files.
func sizedManifest(n int, alg Alg) *Manifest {
	m := &Manifest{Job: "orders", Task: "orders-3", Checkpoint: 1234, Parent: 1233, Created: time.Unix(1764600000, 0).UTC(),
		Engine: "pebble", AgentID: "node-7-0123abcd", Epoch: 3, Node: "node-7"}
	for i := range n {
		var sum [32]byte
		rand.Read(sum[:])
		f := File{Name: fmt.Sprintf("%06d.sst", 100+i*3), Kind: Shared, Size: 2<<20 + int64(i*4099)%(64<<20), Uploaded: i%50 == 0}
		f.SetDigest(digestOf(alg, hex.EncodeToString(sum[:])))
		f.Key = SharedKey(m.Job, f.Digest(), f.Size)
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	for _, name := range []string{"CURRENT", "MANIFEST-000001", "OPTIONS-000003", "marker.format-version.000001.013"} {
		data := []byte("private " + name)
		f := File{Name: name, Kind: Private, Size: int64(len(data)), Inline: data, Uploaded: true}
		f.SetDigest(SumBytes(alg, data))
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	return m
}

// TestFormat2TakesAtMost64BytesPerFile: the manifest of a large state
// stays small (format 1's JSON takes about 245 bytes per file).
func TestFormat2TakesAtMost64BytesPerFile(t *testing.T) {
	sizes := []int{1000, 10000, 100000}
	if testing.Short() {
		sizes = sizes[:2]
	}
	for _, n := range sizes {
		m := sizedManifest(n, BLAKE3)
		enc, err := m.Encode(0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(enc); err != nil {
			t.Fatal(err)
		}
		per := float64(len(enc)) / float64(n)
		t.Logf("format 2, %d files: %d bytes, %.1f bytes per file", n, len(enc), per)
		if per > 64 {
			t.Fatalf("format 2 takes %.1f bytes per file at %d files, want <= 64", per, n)
		}
	}
}
