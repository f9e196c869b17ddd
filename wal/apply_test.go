package wal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// twoLogs writes synced batches into a real Pebble store, reads its log,
// rotates it with a flush, writes more and reads the new log: two logs of
// one store, oldest first, as a tailer sees them.
func twoLogs(t *testing.T) (a, b pebbleLog) {
	t.Helper()
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}, MemTableSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	read := func(after uint64) pebbleLog {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if n, ok := ParseLogName(e.Name()); ok && n > after {
				data, err := os.ReadFile(filepath.Join(dir, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				return pebbleLog{b: data, num: n}
			}
		}
		t.Fatal("no log")
		return pebbleLog{}
	}
	write := func(from int) {
		for i := from; i < from+20; i++ {
			if err := db.Set([]byte(fmt.Sprintf("k%03d", i)), bytes.Repeat([]byte{byte(i)}, 2000+i*300), pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(0)
	a = read(0)
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	write(20)
	b = read(a.num)
	return a, b
}

// bounds returns the offsets where each record of l ends.
func bounds(l pebbleLog) []int64 {
	var out []int64
	for off := int64(0); ; {
		s := ScanRecords(l.b[off:], off, uint32(l.num), 1)
		if s.Records == 0 {
			return out
		}
		out = append(out, s.End)
		off = s.End
	}
}

func logName(n uint64) string { return fmt.Sprintf("%06d.log", n) }

// walFixture is a restored snapshot dir holding log a up to record 5 plus
// a torn tail, and a WAL in storage that extends it: manifest 1 to record
// 10 of a, manifest 2 to a's end (sealed) and log b's record 6, manifest 3
// to b's end.
type walFixture struct {
	t      *testing.T
	a, b   pebbleLog
	ba, bb []int64
	store  *file.Store
	dir    string
	chain  [][]SegmentRef
	why    string // why UsableChain stopped short
}

func newWALFixture(t *testing.T) *walFixture {
	a, b := twoLogs(t)
	f := &walFixture{t: t, a: a, b: b, ba: bounds(a), bb: bounds(b), dir: t.TempDir()}
	if len(f.ba) < 20 || len(f.bb) < 20 {
		t.Fatalf("logs of %d and %d records", len(f.ba), len(f.bb))
	}
	f.store, _ = file.New(t.TempDir())
	torn := append(bytes.Clone(a.b[:f.ba[4]]), a.b[f.ba[4]:f.ba[4]+100]...)
	if err := os.WriteFile(filepath.Join(f.dir, logName(a.num)), torn, 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(f.dir, "MANIFEST-000001"), []byte("not a log"), 0o644)
	f.chain = [][]SegmentRef{
		{f.ref(a, f.ba[4], f.ba[9], false)},
		{f.ref(a, f.ba[9], f.ba[len(f.ba)-1], true), f.ref(b, 0, f.bb[5], false)},
		{f.ref(b, f.bb[5], f.bb[len(f.bb)-1], false)},
	}
	return f
}

func (f *walFixture) ref(l pebbleLog, start, end int64, sealed bool) SegmentRef {
	sum := sha256.Sum256(l.b[start:end])
	return SegmentRef{Name: logName(l.num), Log: l.num, Start: start, End: end, Sealed: sealed, SHA256: hex.EncodeToString(sum[:])}
}

// commit stores the segments and manifests of f.chain (checkpoint 7 by
// epoch 1); skip names seqs whose manifest is left out.
func (f *walFixture) commit(skip ...uint64) {
	ctx := context.Background()
	for i, refs := range f.chain {
		seq := uint64(i + 1)
		m := &Manifest{Job: "job", Task: "t", Checkpoint: 7, Epoch: 1, Seq: seq, ThroughUnixMs: 1_700_000_000_000 + int64(seq), Segments: refs}
		for _, r := range refs {
			l := f.a
			if r.Log == f.b.num {
				l = f.b
			}
			data := l.b[r.Start:r.End]
			if err := f.store.Put(ctx, m.SegmentKey(r), bytes.NewReader(data), int64(len(data))); err != nil {
				f.t.Fatal(err)
			}
		}
		if bytes.Contains([]byte(fmt.Sprint(skip)), []byte(fmt.Sprint(seq))) {
			continue
		}
		if err := Commit(ctx, f.store, m); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *walFixture) apply() (*Applied, error) {
	f.t.Helper()
	chain, why, err := UsableChain(context.Background(), f.store, "job", "t", 7, 1)
	if err != nil {
		f.t.Fatal(err)
	}
	f.why = why
	d, err := os.Open(f.dir)
	if err != nil {
		f.t.Fatal(err)
	}
	defer d.Close()
	return Apply(context.Background(), f.store, d, chain)
}

// holds checks that log l in the dir is exactly its first end bytes, and
// that Pebble's reader reads them whole.
func (f *walFixture) holds(l pebbleLog, end int64) {
	f.t.Helper()
	got, err := os.ReadFile(filepath.Join(f.dir, logName(l.num)))
	if err != nil {
		f.t.Fatal(err)
	}
	if !bytes.Equal(got, l.b[:end]) {
		f.t.Fatalf("log %d: %d bytes, want its first %d", l.num, len(got), end)
	}
	if _, stop := pebbleRecords(got, l.num); !errors.Is(stop, io.EOF) {
		f.t.Fatalf("log %d: pebble's reader stops with %v", l.num, stop)
	}
}

func (f *walFixture) absent(l pebbleLog) {
	f.t.Helper()
	if _, err := os.Stat(filepath.Join(f.dir, logName(l.num))); !errors.Is(err, os.ErrNotExist) {
		f.t.Fatalf("log %d was placed (%v)", l.num, err)
	}
}

func TestApplyExtendsTheSnapshotLogAndPlacesNewerOnes(t *testing.T) {
	f := newWALFixture(t)
	f.commit()
	got, err := f.apply()
	if err != nil {
		t.Fatal(err)
	}
	endA, endB := f.ba[len(f.ba)-1], f.bb[len(f.bb)-1]
	f.holds(f.a, endA)
	f.holds(f.b, endB)
	want := Position{Checkpoint: 7, Epoch: 1, Seq: 3, Log: logName(f.b.num), Offset: endB}
	if got.Position != want || got.Segments != 4 || got.Bytes != endA-f.ba[4]+endB || got.Stopped != "" || got.ThroughUnixMs != 1_700_000_000_003 {
		t.Fatalf("applied %+v, want position %+v, 4 segments, %d bytes", got, want, endA-f.ba[4]+endB)
	}
	if len(got.Changed) != 2 {
		t.Fatalf("changed %v", got.Changed)
	}
}

// Each stop rule: where the WAL stops, and what is (not) placed.
func TestApplyStopsAtAHoleAndNeverPlacesALaterLog(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(f *walFixture)
		skip  []uint64
		why   string
		alsoB bool // manifest 2 and 3 are not applied: b is absent
	}{
		{name: "a segment starts after where its log ends", why: "starts at",
			edit: func(f *walFixture) { f.chain[1][0] = f.ref(f.a, f.ba[10], f.ba[len(f.ba)-1], true) }},
		{name: "a newer log follows a log not known complete", why: "not known to be complete",
			edit: func(f *walFixture) { f.chain[1][0].Sealed = false }},
		{name: "a new log does not start at 0", why: "not 0",
			edit: func(f *walFixture) { f.chain[1][1] = f.ref(f.b, f.bb[0], f.bb[5], false) }},
		{name: "a manifest is missing", skip: []uint64{2}, why: "manifest 2 is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWALFixture(t)
			if tc.edit != nil {
				tc.edit(f)
			}
			f.commit(tc.skip...)
			got, err := f.apply()
			if err != nil {
				t.Fatal(err)
			}
			f.holds(f.a, f.ba[9]) // manifest 1 only
			f.absent(f.b)
			if got.Position.Seq != 1 || got.Position.Log != logName(f.a.num) || got.Position.Offset != f.ba[9] || got.ThroughUnixMs != 1_700_000_000_001 {
				t.Fatalf("position %+v through %d, want manifest 1 at %d", got.Position, got.ThroughUnixMs, f.ba[9])
			}
			if !strings.Contains(got.Stopped+f.why, tc.why) {
				t.Fatalf("stopped %q (%q), want it to say %q", got.Stopped, f.why, tc.why)
			}
		})
	}
}

// A segment object that is not what its manifest says fails the apply
// before a byte of it is written.
func TestApplyFailsOnABadOrMissingSegment(t *testing.T) {
	for name, spoil := range map[string]func(s *file.Store, key string, data []byte) error{
		"corrupt": func(s *file.Store, key string, data []byte) error {
			bad := bytes.Clone(data) // the right size, one bit flipped
			bad[len(bad)/2] ^= 1
			return s.Put(context.Background(), key, bytes.NewReader(bad), int64(len(bad)))
		},
		"missing": func(s *file.Store, key string, _ []byte) error { return s.Delete(context.Background(), key) },
	} {
		t.Run(name, func(t *testing.T) {
			f := newWALFixture(t)
			f.commit()
			m := &Manifest{Job: "job", Task: "t", Checkpoint: 7, Epoch: 1}
			if err := spoil(f.store, m.SegmentKey(f.chain[1][1]), f.b.b[:f.bb[5]]); err != nil {
				t.Fatal(err)
			}
			_, err := f.apply()
			if err == nil || !strings.Contains(err.Error(), "--to checkpoint") {
				t.Fatalf("apply: %v", err)
			}
			if name == "missing" && !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("apply: %v, want not found", err)
			}
			f.absent(f.b)
		})
	}
}

// Which WAL is used after a takeover: the zombie's later manifests never.
func TestUsableChainFollowsTheNextOwnersRecord(t *testing.T) {
	ctx := context.Background()
	f := newWALFixture(t)
	f.commit()
	owner := func(epoch uint64, resumed *manifests.WALResumed) {
		rec := manifests.Owner{Task: "t", Epoch: epoch, Node: "n", AgentID: "a", Created: time.Now(), After: 7, WALResumed: resumed}
		data, _ := json.Marshal(rec)
		if err := f.store.Put(ctx, manifests.OwnerKey("job", "t", epoch), bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	seqs := func() (int, string) {
		t.Helper()
		chain, why, err := UsableChain(ctx, f.store, "job", "t", 7, 1)
		if err != nil {
			t.Fatal(err)
		}
		return len(chain), why
	}
	owner(1, nil)
	if n, _ := seqs(); n != 3 {
		t.Fatalf("the newest owner's WAL: %d manifests, want 3", n)
	}
	owner(2, nil) // a taker that did not resume from the WAL
	if n, why := seqs(); n != 0 || !strings.Contains(why, "owner 2") {
		t.Fatalf("after a takeover without a resume point: %d manifests (%s), want none", n, why)
	}
	owner(2, &manifests.WALResumed{Checkpoint: 7, Epoch: 1, Seq: 2}) // manifest 3 is the zombie's
	if n, _ := seqs(); n != 2 {
		t.Fatalf("a taker that resumed from manifest 2: %d manifests, want 2", n)
	}
	owner(2, &manifests.WALResumed{Checkpoint: 6, Epoch: 1, Seq: 2})
	if n, _ := seqs(); n != 0 {
		t.Fatalf("a taker that resumed from another checkpoint: %d manifests, want none", n)
	}
	owner(2, &manifests.WALResumed{Checkpoint: 7, Epoch: 1, Seq: 5})
	if _, _, err := UsableChain(ctx, f.store, "job", "t", 7, 1); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("a chain shorter than the resume point: %v", err)
	}
}

// A snapshot log with another hard link (a local copy's) is copied apart
// before the WAL changes it: the other link keeps the checkpoint's bytes.
func TestApplyNeverWritesThroughAnotherLink(t *testing.T) {
	f := newWALFixture(t)
	f.commit()
	other := filepath.Join(t.TempDir(), "local-copy.log")
	if err := os.Link(filepath.Join(f.dir, logName(f.a.num)), other); err != nil {
		t.Skip("no hard links here:", err)
	}
	before, _ := os.ReadFile(other)
	if _, err := f.apply(); err != nil {
		t.Fatal(err)
	}
	f.holds(f.a, f.ba[len(f.ba)-1])
	after, _ := os.ReadFile(other)
	if !bytes.Equal(before, after) {
		t.Fatalf("the other link changed: %d bytes, was %d", len(after), len(before))
	}
	entries, _ := os.ReadDir(f.dir)
	if len(entries) != 3 {
		t.Fatalf("the dir holds %d entries, want the manifest and two logs", len(entries))
	}
}
