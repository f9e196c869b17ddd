package wal_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"pgregory.net/rapid"

	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
	"github.com/ckpt-io/ckpt/wal"
)

// holdFS holds back the removal of log files (Pebble's cleaner archives
// them by a rename) until the shipping loop has read them to their end, as
// an agent that follows the store closely does: the model is about what a
// restore makes of a WAL that was shipped, not about gaps.
type holdFS struct {
	vfs.FS
	mu   sync.Mutex
	held [][2]string
}

func (h *holdFS) Rename(oldname, newname string) error {
	if strings.HasSuffix(oldname, ".log") && strings.Contains(newname, "archive") {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.held = append(h.held, [2]string{oldname, newname})
		return nil
	}
	return h.FS.Rename(oldname, newname)
}

func (h *holdFS) take() [][2]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.held
	h.held = nil
	return out
}

// archiving embeds the ArchiveCleaner so that Pebble does not recycle log
// files (it recycles none for a cleaner that needs their contents).
type archiving struct{ pebble.ArchiveCleaner }

// batch is one acknowledged write batch of the model: its keys' new
// values (nil: deleted) and when Pebble acknowledged it.
type batch struct {
	kv    map[string][]byte
	ackMs int64
}

// shipper is the small shipping loop of the model: after checkpoint n it
// follows the store's logs with a Tailer and commits WAL manifests of n,
// each segment starting where the snapshot's copy of its log ends (or at 0
// for a newer log).
type shipper struct {
	n       uint64
	d       *os.File
	tl      *wal.Tailer
	start   map[string]int64
	minLog  uint64
	seq     uint64
	stopped bool
	// through and batches: the last committed manifest's through time and
	// how many batches were acknowledged when it was taken.
	through int64
	batches int
}

func newShipper(t *rapid.T, n uint64, snap, live string) *shipper {
	d, err := os.Open(live)
	if err != nil {
		t.Fatal(err)
	}
	sh := &shipper{n: n, d: d, tl: wal.NewTailer(d, 64<<20), start: map[string]int64{}}
	entries, _ := os.ReadDir(snap)
	for _, e := range entries {
		num, ok := wal.ParseLogName(e.Name())
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(snap, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sh.start[e.Name()] = wal.ScanRecords(data, 0, uint32(num), 0).End
		sh.minLog = max(sh.minLog, num)
	}
	return sh
}

// ship ships what the logs hold since the last call as WAL manifest seq+1.
func (sh *shipper) ship(t *rapid.T, s *file.Store, hfs *holdFS, acked int) {
	ctx := context.Background()
	held := hfs.take() // logs Pebble closed: Next reads them to their trailer
	defer func() {
		for _, h := range held {
			if err := hfs.FS.Rename(h[0], h[1]); err != nil {
				t.Fatal(err)
			}
		}
	}()
	through := time.Now().UnixMilli()
	segs, gaps, err := sh.tl.Next()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gaps {
		if g.Log >= sh.minLog {
			sh.stopped = true // a gap: nothing after it continues the WAL
		}
	}
	var refs []wal.SegmentRef
	for _, seg := range segs {
		sh.tl.Ack(seg)
		if seg.Log < sh.minLog || sh.stopped {
			continue // in the checkpoint already
		}
		from := sh.start[seg.Name] // 0 for a log newer than the snapshot
		if seg.End < from {
			t.Fatalf("log %s: a segment [%d, %d) before the snapshot's end %d", seg.Name, seg.Start, seg.End, from)
		}
		data := seg.Data[from-seg.Start:]
		if len(data) == 0 && !seg.Sealed {
			continue
		}
		sum := sha256.Sum256(data)
		ref := wal.SegmentRef{Name: seg.Name, Log: seg.Log, Start: from, End: seg.End, Sealed: seg.Sealed,
			Records: wal.ScanRecords(data, from, uint32(seg.Log), 0).Records, SHA256: hex.EncodeToString(sum[:])}
		if err := s.Put(ctx, wal.SegmentKey("job", "t", sh.n, 0, ref.SHA256, ref.Size()), bytes.NewReader(data), ref.Size()); err != nil {
			t.Fatal(err)
		}
		sh.start[seg.Name] = seg.End
		refs = append(refs, ref)
	}
	if sh.stopped {
		return
	}
	sh.seq++
	m := &wal.Manifest{Job: "job", Task: "t", Checkpoint: sh.n, Seq: sh.seq, ThroughUnixMs: through, Segments: refs}
	if err := wal.Commit(ctx, s, m); err != nil {
		t.Fatal(err)
	}
	sh.through, sh.batches = through, acked
}

// checkpoint makes checkpoint n of the live store through the Pebble
// helper's Snapshot and commits it the way the agent does.
func checkpoint(t *rapid.T, db *pebble.DB, live string, n uint64, ls *localrecovery.Store, s *file.Store) (snapDir string, created time.Time) {
	ctx := context.Background()
	dir, err := ckptpebble.Snapshot(db, live, n)
	if err != nil {
		t.Fatal(err)
	}
	sn, err := ls.Take("t", n, dir, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		t.Fatal(err)
	}
	res, err := uploader.Upload(ctx, uploader.Request{Store: s, Job: "job", Task: "t", Checkpoint: n, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: n, Created: time.Now(), Engine: "pebble", Files: res.Files}
	for _, f := range res.Files {
		m.FullSize += f.Size
	}
	enc, err := m.Encode(res.BytesWritten)
	if err == nil {
		err = manifests.Commit(ctx, s, m, enc)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls.Complete("t", n, m, enc); err != nil {
		t.Fatal(err)
	}
	return dir, m.Created
}

// A real Pebble store under random synced write batches, flushes,
// compactions and log rotations, checkpointed through the Pebble helper
// at random points, its WAL shipped by a small loop: a restore to latest
// into a fresh dir opens with Pebble and holds exactly the batches
// acknowledged before the last committed manifest's through time was
// taken (so every one acknowledged before that time), each whole, and no
// later one.
func TestRestoreToLatestHoldsEveryWriteBeforeTheThroughTime(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: real Pebble stores under synced writes")
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if f := flag.Lookup("rapid.checks"); f != nil && !set {
		f.Value.Set("25") // each check runs a store; -rapid.checks=N for more
		defer f.Value.Set(f.DefValue)
	}
	var runs, manifestsApplied, segmentsApplied, logsPlaced, newerLogs int
	rapid.Check(t, func(rt *rapid.T) {
		base, err := os.MkdirTemp("", "walmodel-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(base)
		live := filepath.Join(base, "db")
		hfs := &holdFS{FS: vfs.Default}
		db, err := pebble.Open(live, &pebble.Options{FS: hfs, Cleaner: archiving{}, Logger: quietLogger{}, MemTableSize: 256 << 10, L0CompactionThreshold: 2})
		if err != nil {
			rt.Fatal(err)
		}
		defer db.Close()
		s, _ := file.New(filepath.Join(base, "store"))
		ls, err := localrecovery.Open(filepath.Join(base, "local"), "job")
		if err != nil {
			rt.Fatal(err)
		}
		var batches []batch
		var sh *shipper
		var n uint64
		var ckptBatches int
		var ckptCreated time.Time
		write := func() {
			b := db.NewBatch()
			kv := map[string][]byte{}
			for range rapid.IntRange(1, 4).Draw(rt, "keys") {
				k := fmt.Sprintf("k%02d", rapid.IntRange(0, 40).Draw(rt, "key"))
				if rapid.IntRange(0, 9).Draw(rt, "del") == 0 {
					b.Delete([]byte(k), nil)
					kv[k] = nil
					continue
				}
				v := bytes.Repeat([]byte(fmt.Sprintf("%s@%d;", k, len(batches))), rapid.IntRange(1, 1500).Draw(rt, "len"))
				b.Set([]byte(k), v, nil)
				kv[k] = v
			}
			if err := b.Commit(pebble.Sync); err != nil {
				rt.Fatal(err)
			}
			batches = append(batches, batch{kv: kv, ackMs: time.Now().UnixMilli()})
		}
		takeCheckpoint := func() {
			n++
			if sh != nil {
				sh.d.Close()
			}
			dir, created := checkpoint(rt, db, live, n, ls, s)
			sh = newShipper(rt, n, dir, live)
			os.RemoveAll(dir)
			ckptBatches, ckptCreated = len(batches), created
		}
		ops := rapid.IntRange(10, 120).Draw(rt, "ops")
		for i := range ops {
			switch op := rapid.IntRange(0, 99).Draw(rt, "op"); {
			case op < 70 || (i < 3 && n == 0):
				write()
			case op < 75:
				if err := db.Flush(); err != nil {
					rt.Fatal(err)
				}
			case op < 79:
				if err := db.Compact(context.Background(), []byte("k"), []byte("l"), false); err != nil {
					rt.Fatal(err)
				}
			case op < 86 || n == 0:
				takeCheckpoint()
			default:
				sh.ship(rt, s, hfs, len(batches))
			}
		}
		if n == 0 {
			takeCheckpoint()
		}
		if rapid.Bool().Draw(rt, "ship last") {
			sh.ship(rt, s, hfs, len(batches))
		}
		defer sh.d.Close()

		target := filepath.Join(base, "restored", "db")
		res, err := restore.Run(context.Background(), restore.Options{Store: s, Job: "job", Task: "t", Target: target, To: restore.ToLatest})
		if err != nil {
			rt.Fatal(err)
		}
		// What the restore must hold: the batches acknowledged when the
		// last manifest's through time was taken, or at the checkpoint.
		want, through := ckptBatches, ckptCreated.UnixMilli()
		if sh.seq > 0 && !sh.stopped {
			want, through = sh.batches, sh.through
		}
		before := 0 // acknowledged before the through time: at most want
		for _, b := range batches {
			if b.ackMs < through {
				before++
			}
		}
		if before > want {
			rt.Fatalf("%d batches acknowledged before the through time, %d when it was taken", before, want)
		}
		if res.Checkpoint != n || res.WALPosition == nil || res.WALPosition.Seq != sh.seq || res.WALStopped != "" {
			rt.Fatalf("restored checkpoint %d position %+v (stopped %q), want checkpoint %d manifest %d", res.Checkpoint, res.WALPosition, res.WALStopped, n, sh.seq)
		}
		got := readAll(rt, target)
		state := map[string][]byte{}
		for p := 0; p <= len(batches); p++ {
			if p > 0 {
				for k, v := range batches[p-1].kv {
					if v == nil {
						delete(state, k)
					} else {
						state[k] = v
					}
				}
			}
			if p < want {
				continue
			}
			if maps.EqualFunc(state, got, bytes.Equal) {
				if p != want {
					rt.Fatalf("the restored store holds the first %d batches; the WAL shipped %d", p, want)
				}
				runs++
				manifestsApplied += int(res.WALPosition.Seq)
				segmentsApplied += res.WALSegments
				if res.WALSegments > 0 {
					logsPlaced++
				}
				if num, _ := wal.ParseLogName(res.WALPosition.Log); num > sh.minLog {
					newerLogs++ // the WAL went on in a log newer than the snapshot's
				}
				return
			}
			if p == want {
				rt.Fatalf("the restored store (%d keys) is not the store after the first %d batches (%d keys): %s", len(got), want, len(state), diff(state, got))
			}
		}
	})
	t.Logf("%d stores restored to latest: %d WAL manifests, %d segments applied; %d restores applied WAL, %d into logs newer than the snapshot's", runs, manifestsApplied, segmentsApplied, logsPlaced, newerLogs)
}

func readAll(t *rapid.T, dir string) map[string][]byte {
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		t.Fatalf("open the restored store: %v", err)
	}
	defer db.Close()
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	out := map[string][]byte{}
	for it.First(); it.Valid(); it.Next() {
		out[string(it.Key())] = bytes.Clone(it.Value())
	}
	return out
}

func diff(want, got map[string][]byte) string {
	var out []string
	for k, v := range want {
		if g, ok := got[k]; !ok || !bytes.Equal(g, v) {
			out = append(out, fmt.Sprintf("%s: want %.20q got %.20q", k, v, g))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			out = append(out, k+": not in the model")
		}
	}
	return strings.Join(out, "; ")
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)      {}
func (quietLogger) Errorf(string, ...any)     {}
func (quietLogger) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
