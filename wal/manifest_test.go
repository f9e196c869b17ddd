package wal

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

func sha(c byte) string { return strings.Repeat(string(c), 64) }

func testManifest(seq uint64, segs ...SegmentRef) *Manifest {
	return &Manifest{Job: "orders", Task: "t-1", Checkpoint: 7, Epoch: 2, Seq: seq, ThroughUnixMs: 1_700_000_000_000, Segments: segs}
}

func TestWALManifestRoundTripsAndRefusesTampering(t *testing.T) {
	m := testManifest(1,
		SegmentRef{Name: "000012.log", Log: 12, Start: 100, End: 300, Records: 3, SHA256: sha('a')},
		SegmentRef{Name: "000012.log", Log: 12, Start: 300, End: 310, Records: 0, Sealed: true, SHA256: sha('b')},
		SegmentRef{Name: "000013.log", Log: 13, Start: 0, End: 64, Records: 1, SHA256: sha('c')})
	data, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Key() != "orders/tasks/t-1/chk/00000000000000000007/wal.e00000000000000000002/m/00000000000000000001" {
		t.Fatalf("key %s", got.Key())
	}
	if len(got.Segments) != 3 || got.Segments[2] != m.Segments[2] {
		t.Fatalf("segments %+v", got.Segments)
	}
	flipped := bytes.Replace(data, []byte(`000013.log`), []byte(`000014.log`), 1)
	if _, err := Decode(flipped); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("a changed body decoded: %v", err)
	}
}

func TestWALManifestRefusesSegmentsThatDoNotContinue(t *testing.T) {
	for name, segs := range map[string][]SegmentRef{
		"hole":          {{Name: "000012.log", Log: 12, Start: 0, End: 10, SHA256: sha('a')}, {Name: "000012.log", Log: 12, Start: 11, End: 20, SHA256: sha('b')}},
		"after seal":    {{Name: "000012.log", Log: 12, Start: 0, End: 10, Sealed: true, SHA256: sha('a')}, {Name: "000012.log", Log: 12, Start: 10, End: 20, SHA256: sha('b')}},
		"name mismatch": {{Name: "000013.log", Log: 12, Start: 0, End: 10, SHA256: sha('a')}},
		"not a log":     {{Name: "../x.log", Log: 12, Start: 0, End: 10, SHA256: sha('a')}},
		"backwards":     {{Name: "000012.log", Log: 12, Start: 10, End: 5, SHA256: sha('a')}},
		"bad hash":      {{Name: "000012.log", Log: 12, Start: 0, End: 5, SHA256: strings.Repeat("Z", 64)}},
	} {
		if _, err := testManifest(1, segs...).Encode(); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	bad := testManifest(1)
	bad.Task = "../x"
	if _, err := bad.Encode(); err == nil {
		t.Error("a bad task name encoded")
	}
}

func TestWALCommitIsConditionalAndChainsStopAtTheFirstMissingSeq(t *testing.T) {
	ctx := context.Background()
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m1 := testManifest(1, SegmentRef{Name: "000012.log", Log: 12, Start: 0, End: 10, SHA256: sha('a')})
	m2 := testManifest(2, SegmentRef{Name: "000012.log", Log: 12, Start: 10, End: 20, SHA256: sha('b')})
	m4 := testManifest(4, SegmentRef{Name: "000012.log", Log: 12, Start: 30, End: 40, SHA256: sha('d')})
	for _, m := range []*Manifest{m1, m2, m4} {
		if err := Commit(ctx, s, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := Commit(ctx, s, m2); !errors.Is(err, storage.ErrExists) {
		t.Fatalf("a second commit of seq 2: %v", err)
	}
	chain, err := Chain(ctx, s, "orders", "t-1", 7, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 {
		t.Fatalf("chain of %d manifests, want 2 (seq 3 is missing)", len(chain))
	}
	if chain, _ := Chain(ctx, s, "orders", "t-1", 7, 2, 1); len(chain) != 1 {
		t.Fatalf("upTo 1 gave %d manifests", len(chain))
	}
	if chain, _ := Chain(ctx, s, "orders", "t-1", 7, 3, 0); len(chain) != 0 {
		t.Fatalf("another epoch's chain has %d manifests", len(chain))
	}
	// A seq 3 that does not continue seq 2 fails the chain loudly.
	m3 := testManifest(3, SegmentRef{Name: "000012.log", Log: 12, Start: 25, End: 30, SHA256: sha('c')})
	if err := Commit(ctx, s, m3); err != nil {
		t.Fatal(err)
	}
	if _, err := Chain(ctx, s, "orders", "t-1", 7, 2, 0); err == nil || !strings.Contains(err.Error(), "does not continue") {
		t.Fatalf("a broken chain read: %v", err)
	}
	// A manifest stored under another seq's key is refused.
	data, _ := m1.Encode()
	key := ManifestKey("orders", "t-1", 8, 2, 1)
	if err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(ctx, s, "orders", "t-1", 8, 2, 1); err == nil || !strings.Contains(err.Error(), "moved") {
		t.Fatalf("a moved manifest loaded: %v", err)
	}
}

func FuzzDecodeWALManifest(f *testing.F) {
	m := testManifest(1, SegmentRef{Name: "000012.log", Log: 12, Start: 0, End: 10, SHA256: sha('a')})
	data, _ := m.Encode()
	f.Add(data)
	f.Add([]byte(`{"format":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded a manifest that fails its checks: %v", err)
		}
		if _, err := m.Encode(); err != nil {
			t.Fatalf("a decoded manifest does not encode: %v", err)
		}
	})
}
