package manifests

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// scaleManifest is a manifest of n shared files of 4 KiB as the cost-growth
// bench makes them (BLAKE3 ids, default keys), plus two inline private files.
func scaleManifest(n int) *Manifest {
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	m := &Manifest{Job: "bench-job", Task: "scale", Checkpoint: 7, Parent: 6, Created: time.Unix(1e9, 0).UTC(),
		Engine: "pebble", AgentID: "agent-1", Epoch: 1, Node: "node-1", Format: Format2}
	var sum [32]byte
	for i := range n {
		for j := range sum {
			sum[j] = byte(rng.Uint32())
		}
		d := digestOf(BLAKE3, hex.EncodeToString(sum[:]))
		f := File{Name: fmt.Sprintf("%07d.sst", i+1), Kind: Shared, Size: 4096, Uploaded: i >= n-10}
		f.SetDigest(d)
		f.Key = SharedKey(m.Job, d, f.Size)
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	for _, name := range []string{"CURRENT", "MANIFEST-000001"} {
		data := []byte("MANIFEST-000001\n")
		f := File{Name: name, Kind: Private, Size: int64(len(data)), Inline: data, Uploaded: true}
		f.SetDigest(SumBytes(BLAKE3, data))
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	return m
}

// BenchmarkEncode is the manifest's encoding in a checkpoint of n files.
func BenchmarkEncode(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		m := scaleManifest(n)
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			var out []byte
			for b.Loop() {
				var err error
				if out, err = m.Encode(40960); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(out))/float64(n), "B/file")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(n), "us/file")
		})
	}
}
