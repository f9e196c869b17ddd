package wal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

const (
	testJob  = "orders"
	testTask = "t-1"
)

func newTestStore(t *testing.T) storage.Store {
	t.Helper()
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func takeOwner(t *testing.T, s storage.Store, agent string) manifests.Owner {
	t.Helper()
	o, err := manifests.TakeOwnership(context.Background(), s, testJob, testTask, "node-"+agent, agent)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// snapshotLogs is ScanCopy of every log file of a snapshot dir.
func snapshotLogsOf(t *testing.T, dir string) []LogEnd {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []LogEnd
	for _, e := range entries {
		if _, ok := ParseLogName(e.Name()); !ok {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		l, err := ScanCopy(f, e.Name(), fi.Size())
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// shippedLogs reads the WAL chain of checkpoint n by epoch from storage
// and returns, per log name, the bytes shipped (checked against each
// segment's hash and size) and the segments, in order.
func shippedLogs(t *testing.T, s storage.Store, n, epoch uint64) (map[string][]byte, map[string][]SegmentRef, []*Manifest) {
	t.Helper()
	ctx := context.Background()
	chain, err := Chain(ctx, s, testJob, testTask, n, epoch, 0)
	if err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{}
	segs := map[string][]SegmentRef{}
	for _, m := range chain {
		for _, r := range m.Segments {
			rc, err := s.Get(ctx, m.SegmentKey(r))
			if err != nil {
				t.Fatalf("segment %+v of manifest %d: %v", r, m.Seq, err)
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(b)
			if int64(len(b)) != r.Size() || hex.EncodeToString(sum[:]) != r.SHA256 {
				t.Fatalf("segment %+v: stored bytes do not match its name", r)
			}
			data[r.Name] = append(data[r.Name], b...)
			segs[r.Name] = append(segs[r.Name], r)
		}
	}
	return data, segs, chain
}

func setSynced(t *testing.T, db *pebble.DB, i, size int) {
	t.Helper()
	v := bytes.Repeat([]byte{byte(i)}, size)
	if err := db.Set([]byte(fmt.Sprintf("k%07d", i)), v, pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

// A Pebble store writes before a checkpoint, between the checkpoint and
// the Rebase that follows its commit, and on while the shipper ships
// rounds; it rotates its log several times. For every log, the
// checkpoint's copy followed by the shipped segments is read by Pebble's
// own reader to a clean end, every segment ends on a record boundary,
// the records shipped are exactly the records written after the
// checkpoint, and each byte is shipped once.
func TestShipperShipsExactlyTheRecordsWrittenAfterTheCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a Pebble store writing a few thousand synced batches")
	}
	ctx := context.Background()
	root := t.TempDir()
	live, snap := filepath.Join(root, "db"), filepath.Join(root, "snap")
	// A large memtable: Pebble rotates its log with each (growing)
	// memtable but flushes, and so deletes logs, only past half of it:
	// this store keeps every log, so no gap can happen.
	db, err := pebble.Open(live, &pebble.Options{Logger: quietLogger{}, MemTableSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	size := func() int {
		if rng.IntN(20) == 0 {
			return 40_000 + rng.IntN(120_000) // larger than a segment: one of its own
		}
		return 10 + rng.IntN(3000)
	}
	i := 0
	for ; i < 300; i++ {
		setSynced(t, db, i, size())
	}
	if err := db.Checkpoint(snap, pebble.WithFlushedWAL()); err != nil {
		t.Fatal(err)
	}
	before := i
	for ; i < before+40; i++ { // after the snapshot, before the checkpoint commits
		setSynced(t, db, i, size())
	}
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	d, err := os.Open(live)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	logs := snapshotLogsOf(t, snap)
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: d, MaxSegment: 32 << 10, Agent: "a"})
	if err := sh.Rebase(1, owner.Epoch, logs); err != nil {
		t.Fatal(err)
	}
	commits := 0
	ship := func() {
		t.Helper()
		r, err := sh.Ship(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r.Seq > 0 {
			commits++
		}
	}
	for round := 0; round < 60; round++ {
		for range rng.IntN(40) {
			setSynced(t, db, i, size())
			i++
		}
		ship()
	}
	if r, err := sh.Ship(ctx); err != nil || r.Seq != 0 || r.Through.IsZero() {
		t.Fatalf("a round with nothing new: %+v, %v; want no commit and a through time", r, err)
	}
	if err := db.Close(); err != nil { // seals the last log with its trailer
		t.Fatal(err)
	}
	ship()
	written := i - before

	data, segs, chain := shippedLogs(t, s, 1, owner.Epoch)
	if len(chain) != commits {
		t.Fatalf("%d manifests in the chain, %d commits", len(chain), commits)
	}
	copies := map[string]LogEnd{}
	for _, l := range logs {
		copies[l.Name] = l
	}
	names := make([]string, 0, len(segs))
	for name := range segs {
		names = append(names, name)
	}
	sort.Strings(names)
	shippedRecords, shippedBytes, walBytes := 0, int64(0), int64(0)
	for _, name := range names {
		num, _ := ParseLogName(name)
		var prefix []byte
		copyRecords := 0
		if c, ok := copies[name]; ok {
			b, err := os.ReadFile(filepath.Join(snap, name))
			if err != nil {
				t.Fatal(err)
			}
			prefix = b[:c.End]
			copyRecords = ScanRecords(prefix, 0, uint32(num), 0).Records
		}
		if len(segs[name]) == 0 || segs[name][0].Start != int64(len(prefix)) {
			t.Fatalf("log %s: shipping starts at %d, its copy in the snapshot ends at %d", name, segs[name][0].Start, len(prefix))
		}
		whole := append(append([]byte(nil), prefix...), data[name]...)
		// Every segment ends on a record boundary: the bytes up to its end
		// read cleanly, with the records counted so far.
		count := copyRecords
		for _, r := range segs[name] {
			count += r.Records
			n, stop := pebbleRecords(whole[:r.End], num)
			if n != count || !errors.Is(stop, io.EOF) {
				t.Fatalf("log %s up to segment end %d: pebble read %d records then %v, want %d and a clean end", name, r.End, n, stop, count)
			}
			shippedBytes += r.Size()
			shippedRecords += r.Records
		}
		if last := segs[name][len(segs[name])-1]; !last.Sealed {
			t.Errorf("log %s: its last segment is not sealed; the store was closed", name)
		}
		final, err := os.ReadFile(filepath.Join(live, name))
		if err != nil {
			t.Fatal(err)
		}
		walBytes += ScanRecords(final, 0, uint32(num), 0).End - int64(len(prefix))
	}
	ratio := float64(shippedBytes) / float64(walBytes)
	t.Logf("%d records written after the checkpoint in %d logs, %d shipped in %d manifests; %d bytes shipped for %d bytes of WAL written: %.4f", written, len(names), shippedRecords, len(chain), shippedBytes, walBytes, ratio)
	if shippedRecords != written {
		t.Errorf("%d records shipped, %d written after the checkpoint", shippedRecords, written)
	}
	if ratio > 1.05 || ratio < 1 {
		t.Errorf("bytes shipped per byte of WAL written: %.4f, want 1 (at most 1.05)", ratio)
	}
	if len(names) < 2 {
		t.Errorf("the store used %d logs: the test wants rotations", len(names))
	}
}

// liveDir is a store dir written by hand from real Pebble logs' bytes.
type liveDir struct {
	t    *testing.T
	path string
	d    *os.File
	logs []pebbleLog
}

// newLiveDir writes batches of the given sizes into a Pebble store and
// keeps its logs (at least want of them) for a store dir written by hand.
func newLiveDir(t *testing.T, sizes []int, want int) *liveDir {
	t.Helper()
	logs := writePebbleLogs(t, sizes)
	if len(logs) < want {
		t.Fatalf("the store wrote %d logs, the test wants %d", len(logs), want)
	}
	ld := &liveDir{t: t, path: t.TempDir(), logs: logs}
	d, err := os.Open(ld.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ld.d = d
	return ld
}

func (ld *liveDir) name(i int) string { return fmt.Sprintf("%06d.log", ld.logs[i].num) }

// boundary returns the end of the first k records of log i.
func (ld *liveDir) boundary(i, k int) int64 {
	l := ld.logs[i]
	end := int64(0)
	for range k {
		s := ScanRecords(l.b[end:], end, uint32(l.num), 1)
		if s.Records != 1 {
			ld.t.Fatalf("log %d has fewer than %d records", l.num, k)
		}
		end = s.End
	}
	return end
}

// write makes live log i hold its first n bytes.
func (ld *liveDir) write(i int, n int64) {
	ld.t.Helper()
	if err := os.WriteFile(filepath.Join(ld.path, ld.name(i)), ld.logs[i].b[:n], 0o644); err != nil {
		ld.t.Fatal(err)
	}
}

// copyOf returns the LogEnd of a snapshot copy of log i holding its first
// n bytes.
func (ld *liveDir) copyOf(i int, n int64) LogEnd {
	l, err := ScanCopy(bytes.NewReader(ld.logs[i].b[:n]), ld.name(i), n)
	if err != nil {
		ld.t.Fatal(err)
	}
	return l
}

// ScanCopy finds the same end in a copy trimmed after its last record
// (client/pebble's) and in a whole copy with a torn record after it.
func TestScanCopyEndsAtTheLastCompleteRecord(t *testing.T) {
	logs := writePebbleLogs(t, []int{100, 5000, 70_000, 200, 3_000_000, 10})
	l := logs[len(logs)-1]
	name := fmt.Sprintf("%06d.log", l.num)
	whole := ScanRecords(l.b, 0, uint32(l.num), 0)
	for _, cut := range []int64{0, 1, 100, BlockSize + 3, 2_000_000} {
		n := max(whole.End-cut, 0)
		want := ScanRecords(l.b[:n], 0, uint32(l.num), 0).End
		got, err := ScanCopy(bytes.NewReader(l.b[:n]), name, n)
		if err != nil || got.End != want {
			t.Fatalf("copy of %d bytes: end %d, %v; want %d", n, got.End, err, want)
		}
		trimmed, err := ScanCopy(bytes.NewReader(l.b[:want]), name, want)
		if err != nil || trimmed.End != want || !bytes.Equal(trimmed.Tail, got.Tail) {
			t.Fatalf("trimmed copy: end %d, %v; want %d and the same tail", trimmed.End, err, want)
		}
	}
}

// gapSizes make a store that writes two logs.
var gapSizes = []int{300, 400, 5000, 200, 900, 100, 3000, 50, 400_000, 300, 100, 200, 900}

// A log that goes away before it was read to its end ends the chain: the
// round commits nothing, says so, and nothing more is shipped (not even
// a newer log's records) until the next Rebase, which ships again.
func TestAGapEndsTheChainUntilTheNextRebase(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 2)
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: ld.d})
	ld.write(0, ld.boundary(0, 4))
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{ld.copyOf(0, ld.boundary(0, 2))}); err != nil {
		t.Fatal(err)
	}
	r, err := sh.Ship(ctx)
	if err != nil || r.Seq != 1 || r.Records != 2 {
		t.Fatalf("first round: %+v, %v; want seq 1 with the 2 records after the snapshot", r, err)
	}
	ld.write(0, ld.boundary(0, 6)) // two more records, never read...
	if err := os.Remove(filepath.Join(ld.path, ld.name(0))); err != nil {
		t.Fatal(err)
	}
	ld.write(1, ld.boundary(1, 2)) // ...and a newer log
	r, err = sh.Ship(ctx)
	var g Gap
	if !errors.Is(err, ErrChainEnded) || !errors.As(err, &g) || g.Name != ld.name(0) || r.Seq != 0 {
		t.Fatalf("the round after the log went away: %+v, %v; want a gap of %s ending the chain", r, err, ld.name(0))
	}
	if n, ended := sh.Checkpoint(); n != 1 || ended == nil {
		t.Fatalf("Checkpoint() = %d, %v; want 1 and why it ended", n, ended)
	}
	ld.write(1, ld.boundary(1, 3))
	if r, err := sh.Ship(ctx); err != nil || r.Seq != 0 {
		t.Fatalf("a round after the chain ended: %+v, %v; want nothing shipped", r, err)
	}
	if seqs, _ := Seqs(ctx, s, testJob, testTask, 1, owner.Epoch); len(seqs) != 1 {
		t.Fatalf("checkpoint 1's WAL has manifests %v; want only seq 1, from before the gap", seqs)
	}
	// The next checkpoint's snapshot holds the newer log's first record.
	if err := sh.Rebase(2, owner.Epoch, []LogEnd{ld.copyOf(1, ld.boundary(1, 1))}); err != nil {
		t.Fatal(err)
	}
	r, err = sh.Ship(ctx)
	if err != nil || r.Checkpoint != 2 || r.Seq != 1 || r.Records != 2 {
		t.Fatalf("first round after the Rebase: %+v, %v; want seq 1 of checkpoint 2 with 2 records", r, err)
	}
	_, segs, _ := shippedLogs(t, s, 2, owner.Epoch)
	if got := segs[ld.name(1)]; len(got) != 1 || got[0].Start != ld.boundary(1, 1) || got[0].End != ld.boundary(1, 3) {
		t.Fatalf("checkpoint 2's WAL: %+v; want log %s from its snapshot copy's end", got, ld.name(1))
	}
}

// Rebase starts the chain only where the live log continues the
// snapshot's copy: a live file that does not hold the copy's bytes (another
// file under the name) or a missing newest log end the chain at once.
func TestRebaseRefusesALiveLogThatDoesNotContinueTheCopy(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 2)
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: ld.d})
	copied := ld.copyOf(0, ld.boundary(0, 3))
	// The live file under the name holds other bytes.
	other := bytes.Clone(ld.logs[0].b[:ld.boundary(0, 5)])
	other[copied.End-10] ^= 0xff
	if err := os.WriteFile(filepath.Join(ld.path, ld.name(0)), other, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{copied}); !errors.Is(err, ErrChainEnded) {
		t.Fatalf("Rebase on another file: %v; want the chain ended", err)
	}
	if r, err := sh.Ship(ctx); err != nil || r.Seq != 0 {
		t.Fatalf("a round after a refused Rebase: %+v, %v", r, err)
	}
	os.Remove(filepath.Join(ld.path, ld.name(0)))
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{copied}); !errors.Is(err, ErrChainEnded) {
		t.Fatalf("Rebase with the newest log gone: %v; want the chain ended", err)
	}
	if err := sh.Rebase(1, owner.Epoch, nil); !errors.Is(err, ErrChainEnded) {
		t.Fatalf("Rebase on a snapshot with no log: %v; want the chain ended", err)
	}
	// The same bytes: the chain starts after the copy.
	ld.write(0, ld.boundary(0, 5))
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{copied}); err != nil {
		t.Fatal(err)
	}
	if r, err := sh.Ship(ctx); err != nil || r.Seq != 1 || r.Records != 2 {
		t.Fatalf("round: %+v, %v; want the 2 records after the copy", r, err)
	}
}

// A shipper whose task was taken over by a newer owner between two rounds
// commits nothing from then on, and says it was fenced.
func TestAFencedShipperCommitsNothing(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 1)
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: ld.d})
	ld.write(0, ld.boundary(0, 3))
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{ld.copyOf(0, ld.boundary(0, 1))}); err != nil {
		t.Fatal(err)
	}
	if r, err := sh.Ship(ctx); err != nil || r.Seq != 1 {
		t.Fatalf("round as the owner: %+v, %v", r, err)
	}
	takeOwner(t, s, "b")
	ld.write(0, ld.boundary(0, 5))
	for range 2 {
		if r, err := sh.Ship(ctx); !errors.Is(err, manifests.ErrFenced) || r.Seq != 0 {
			t.Fatalf("round after a takeover: %+v, %v; want fenced, nothing committed", r, err)
		}
	}
	if err := sh.Rebase(2, owner.Epoch, []LogEnd{ld.copyOf(0, ld.boundary(0, 5))}); !errors.Is(err, manifests.ErrFenced) {
		t.Fatalf("Rebase of a fenced shipper: %v", err)
	}
	if seqs, _ := Seqs(ctx, s, testJob, testTask, 1, owner.Epoch); len(seqs) != 1 {
		t.Fatalf("manifests %v; want only seq 1, from before the takeover", seqs)
	}
}

// A takeover between the owner check and the commit (the residual window,
// as for checkpoint manifests) lets that one manifest through, with a
// through time before the new owner's record; the next round sees the
// newer owner and commits nothing more.
func TestATakeoverBetweenTheOwnerCheckAndTheCommit(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 1)
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: ld.d})
	ld.write(0, ld.boundary(0, 3))
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{ld.copyOf(0, ld.boundary(0, 1))}); err != nil {
		t.Fatal(err)
	}
	var newer manifests.Owner
	sh.beforeCommit = func() {
		time.Sleep(2 * time.Millisecond) // the record's time is in ms, like the through time
		newer = takeOwner(t, s, "b")
		sh.beforeCommit = nil
	}
	r, err := sh.Ship(ctx)
	if err != nil || r.Seq != 1 {
		t.Fatalf("the round in the window: %+v, %v; want its commit through", r, err)
	}
	m, err := Load(ctx, s, testJob, testTask, 1, owner.Epoch, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.ThroughUnixMs >= newer.Created.UnixMilli() {
		t.Fatalf("the manifest in the window has through %d, not before the takeover at %d", m.ThroughUnixMs, newer.Created.UnixMilli())
	}
	ld.write(0, ld.boundary(0, 5))
	if r, err := sh.Ship(ctx); !errors.Is(err, manifests.ErrFenced) || r.Seq != 0 {
		t.Fatalf("the round after: %+v, %v; want fenced, nothing committed", r, err)
	}
	if seqs, _ := Seqs(ctx, s, testJob, testTask, 1, owner.Epoch); len(seqs) != 1 {
		t.Fatalf("manifests %v; want only the one in the window", seqs)
	}
}

// A round that fails (storage refuses a segment, or the manifest) moves
// nothing: the next round ships the same records again, whole, under the
// same seq.
func TestAFailedRoundShipsItsRecordsAgain(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 1)
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	fs := &failingPuts{Store: s}
	sh := NewShipper(ShipperConfig{Store: fs, Job: testJob, Task: testTask, Dir: ld.d})
	ld.write(0, ld.boundary(0, 4))
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{ld.copyOf(0, ld.boundary(0, 1))}); err != nil {
		t.Fatal(err)
	}
	fs.failPut = true
	if r, err := sh.Ship(ctx); err == nil || r.Seq != 0 {
		t.Fatalf("a round whose upload failed: %+v, %v", r, err)
	}
	fs.failPut, fs.failCreate = false, true
	if r, err := sh.Ship(ctx); err == nil || r.Seq != 0 {
		t.Fatalf("a round whose commit failed: %+v, %v", r, err)
	}
	fs.failCreate = false
	r, err := sh.Ship(ctx)
	if err != nil || r.Seq != 1 || r.Records != 3 {
		t.Fatalf("the round after: %+v, %v; want seq 1 with all 3 records", r, err)
	}
}

type failingPuts struct {
	storage.Store
	failPut, failCreate bool
}

func (f *failingPuts) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if f.failPut {
		return errors.New("injected: storage refuses the upload")
	}
	return f.Store.Put(ctx, key, body, size)
}

func (f *failingPuts) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if f.failCreate {
		return errors.New("injected: storage refuses the manifest")
	}
	return f.Store.Create(ctx, key, body, size)
}

// A tailer that requires an owner reads no log file of another uid (in
// node-agent mode: a hard link to another user's file in a peer's dir).
func TestATailerReadsNoLogOfAnotherOwner(t *testing.T) {
	ld := newLiveDir(t, gapSizes, 1)
	ld.write(0, ld.boundary(0, 2))
	me := uint32(os.Getuid())
	tl := NewTailer(ld.d, 1<<20)
	tl.RequireOwner(me + 1)
	if segs, _, err := tl.Next(); err == nil || len(segs) != 0 {
		t.Fatalf("a log of uid %d read for owner %d: %d segments, %v", me, me+1, len(segs), err)
	}
	tl = NewTailer(ld.d, 1<<20)
	tl.RequireOwner(me)
	if segs, _, err := tl.Next(); err != nil || len(segs) != 1 {
		t.Fatalf("a log of its owner: %d segments, %v", len(segs), err)
	}
}

// A log the engine seals and deletes (or renames, to recycle it) between
// two rounds is still shipped to its seal, through the handle the tailer
// kept open: no gap, and every record of it is shipped.
func TestALogDeletedRightAfterItsSealIsShippedWhole(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 2)
	whole := ScanRecords(ld.logs[0].b, 0, uint32(ld.logs[0].num), 0)
	if whole.Stop != "sealed" {
		t.Fatalf("the store's first log ends %q, not sealed", whole.Stop)
	}
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: ld.d})
	defer sh.Close()
	ld.write(0, ld.boundary(0, 2))
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{ld.copyOf(0, ld.boundary(0, 1))}); err != nil {
		t.Fatal(err)
	}
	if r, err := sh.Ship(ctx); err != nil || r.Seq != 1 {
		t.Fatalf("first round: %+v, %v", r, err)
	}
	// The engine writes the rest, seals the log, opens the next one and
	// deletes the sealed one, all between two rounds.
	ld.write(0, int64(len(ld.logs[0].b)))
	ld.write(1, ld.boundary(1, 1))
	if err := os.Remove(filepath.Join(ld.path, ld.name(0))); err != nil {
		t.Fatal(err)
	}
	r, err := sh.Ship(ctx)
	if err != nil || r.Seq != 2 {
		t.Fatalf("the round after the seal and delete: %+v, %v; want seq 2, no gap", r, err)
	}
	_, segs, _ := shippedLogs(t, s, 1, owner.Epoch)
	got := segs[ld.name(0)]
	last := got[len(got)-1]
	records := 0
	for _, r := range got {
		records += r.Records
	}
	if !last.Sealed || last.End != whole.End || records != whole.Records-1 {
		t.Fatalf("log %s shipped to %d (sealed %v) with %d records; want to %d, sealed, %d records", ld.name(0), last.End, last.Sealed, records, whole.End, whole.Records-1)
	}
	if n := len(segs[ld.name(1)]); n != 1 {
		t.Fatalf("the next log has %d segments, want 1", n)
	}
}

// A checkpoint's newest log that the engine deleted between the snapshot
// and the commit is continued through the handle Track kept open.
func TestRebaseContinuesALogGoneSinceTheSnapshotThatTrackHeld(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 2)
	whole := ScanRecords(ld.logs[0].b, 0, uint32(ld.logs[0].num), 0)
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: ld.d})
	defer sh.Close()
	ld.write(0, ld.boundary(0, 1))
	if err := sh.Track(); err != nil {
		t.Fatal(err)
	}
	snap := ld.copyOf(0, ld.boundary(0, 1)) // the snapshot
	ld.write(0, int64(len(ld.logs[0].b)))   // the rest, sealed...
	ld.write(1, ld.boundary(1, 1))
	if err := os.Remove(filepath.Join(ld.path, ld.name(0))); err != nil { // ...and deleted
		t.Fatal(err)
	}
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{snap}); err != nil {
		t.Fatalf("Rebase on a log gone but held: %v", err)
	}
	r, err := sh.Ship(ctx)
	if err != nil || r.Seq != 1 || r.Records != whole.Records-1+1 {
		t.Fatalf("round: %+v, %v; want the %d records after the snapshot and the next log's first", r, err, whole.Records-1)
	}
}

// Watch signals a log that appears in the dir (created or renamed there),
// not other files, and stops when told.
func TestWatchSignalsANewLog(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	events, stop, err := Watch(d)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	os.WriteFile(filepath.Join(dir, "000001.sst"), nil, 0o644)
	select {
	case f := <-events:
		t.Fatalf("an sst signalled: %s", f.Name())
	case <-time.After(50 * time.Millisecond):
	}
	os.WriteFile(filepath.Join(dir, "tmp"), nil, 0o644)
	os.Rename(filepath.Join(dir, "tmp"), filepath.Join(dir, "000007.log"))
	select {
	case f := <-events:
		defer f.Close()
		if f.Name() != "000007.log" {
			t.Fatalf("the watch opened %s", f.Name())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a log renamed into the dir did not signal")
	}
}

func dupFd(t *testing.T, f *os.File) int {
	t.Helper()
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// A log the watch opened, adopted after the shipper read it to its seal
// and let it go, is not shipped again (its segments would not continue).
func TestALateAdoptDoesNotShipALogAgain(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 2)
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: ld.d})
	defer sh.Close()
	ld.write(0, int64(len(ld.logs[0].b))) // sealed
	early, err := os.Open(filepath.Join(ld.path, ld.name(0)))
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{ld.copyOf(0, ld.boundary(0, 1))}); err != nil {
		t.Fatal(err)
	}
	ld.write(1, ld.boundary(1, 1))
	if r, err := sh.Ship(ctx); err != nil || r.Seq != 1 {
		t.Fatalf("round: %+v, %v", r, err)
	}
	os.Remove(filepath.Join(ld.path, ld.name(0)))
	if _, err := sh.Ship(ctx); err != nil { // lets the sealed log go
		t.Fatal(err)
	}
	// As Watch hands it over: named by the log's name.
	sh.Adopt(os.NewFile(uintptr(dupFd(t, early)), ld.name(0)))
	early.Close()
	ld.write(1, ld.boundary(1, 2))
	if r, err := sh.Ship(ctx); err != nil || r.Seq == 0 {
		t.Fatalf("round after the late adopt: %+v, %v", r, err)
	}
	if _, err := Chain(ctx, s, testJob, testTask, 1, owner.Epoch, 0); err != nil {
		t.Fatalf("the chain does not read: %v", err)
	}
}

// A checkpoint whose snapshot was taken before its newest log was sealed,
// that log since shipped to its seal under the last chain and deleted, is
// continued from the handle the tailer kept (a store that rotates faster
// than checkpoints commit).
func TestRebaseContinuesALogTheLastChainShippedToItsSeal(t *testing.T) {
	ctx := context.Background()
	ld := newLiveDir(t, gapSizes, 2)
	whole := ScanRecords(ld.logs[0].b, 0, uint32(ld.logs[0].num), 0)
	s := newTestStore(t)
	owner := takeOwner(t, s, "a")
	sh := NewShipper(ShipperConfig{Store: s, Job: testJob, Task: testTask, Dir: ld.d})
	defer sh.Close()
	ld.write(0, ld.boundary(0, 2))
	if err := sh.Rebase(1, owner.Epoch, []LogEnd{ld.copyOf(0, ld.boundary(0, 1))}); err != nil {
		t.Fatal(err)
	}
	snap2 := ld.copyOf(0, ld.boundary(0, 2)) // checkpoint 2's snapshot, committed later
	ld.write(0, int64(len(ld.logs[0].b)))
	ld.write(1, ld.boundary(1, 2))
	if r, err := sh.Ship(ctx); err != nil || r.Seq != 1 {
		t.Fatalf("round: %+v, %v", r, err)
	}
	os.Remove(filepath.Join(ld.path, ld.name(0)))
	if _, err := sh.Ship(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sh.Rebase(2, owner.Epoch, []LogEnd{snap2}); err != nil {
		t.Fatalf("Rebase on a log shipped to its seal and gone: %v", err)
	}
	r, err := sh.Ship(ctx)
	if err != nil || r.Seq != 1 || r.Records != whole.Records-2+2 {
		t.Fatalf("checkpoint 2's first round: %+v, %v; want the %d records of log 0 after the snapshot and log 1's 2", r, err, whole.Records-2)
	}
}

// A log whose held file was let go of while a state still names it (a
// round undone after the tailer retired it) is opened again by its name,
// not read through the closed file.
func TestAClosedHeldLogIsOpenedAgain(t *testing.T) {
	ld := newLiveDir(t, gapSizes, 1)
	ld.write(0, ld.boundary(0, 1))
	tl := NewTailer(ld.d, 1<<20)
	defer tl.Close()
	segs, _, err := tl.Next()
	if err != nil || len(segs) != 1 {
		t.Fatalf("%d segments, %v", len(segs), err)
	}
	tl.Ack(segs[0])
	tl.logs[ld.name(0)].f.Close()
	ld.write(0, ld.boundary(0, 3))
	segs, _, err = tl.Next()
	if err != nil || len(segs) != 1 || segs[0].Records != 2 {
		t.Fatalf("after the held file was closed: %+v, %v; want the 2 new records", segs, err)
	}
}
