package pebble

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/client"
	_ "github.com/ckpt-io/ckpt/engines/pebble" // the agent classifies Pebble snapshots
	"github.com/ckpt-io/ckpt/storage/file"
)

// shipped is what one checkpoint cost: the agent's figures and the bytes
// of the WAL in its snapshot.
type shipped struct {
	size, full    int64
	uploaded      int
	reused        int
	walBytes      int64
	roundBytes    int64
	pauseDuration time.Duration
}

// checkpointRounds writes rounds of fresh random values into a Pebble
// store with memtable size memtable (0: Pebble's default) and checkpoints
// it after each round through a real agent on file:// storage, with opts.
func checkpointRounds(t *testing.T, rounds int, perRound int64, memtable uint64, opts ...Option) []shipped {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "apps")
	storeDir, local, socket := filepath.Join(root, "store"), filepath.Join(root, "local"), filepath.Join(base, "ckpt.sock")
	st, err := file.New(filepath.Join(base, "storage"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Socket: socket, Store: st, Job: "job", LocalDir: local, AllowRoots: []string{root},
		GCGrace: time.Hour, GCInterval: -1, ShutdownGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	<-a.Ready()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	po := &pebble.Options{MemTableSize: memtable, Logger: quiet{}}
	db, err := pebble.Open(storeDir, po)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	rng := rand.New(rand.NewPCG(1, 2))
	val := make([]byte, 1024)
	var out []shipped
	key := 0
	for n := uint64(1); n <= uint64(rounds); n++ {
		for written := int64(0); written < perRound; written += int64(len(val)) {
			for i := range val {
				val[i] = byte(rng.Uint32())
			}
			key++
			if err := db.Set([]byte(fmt.Sprintf("key-%09d", key)), val, pebble.NoSync); err != nil {
				t.Fatal(err)
			}
		}
		t0 := time.Now()
		p, err := Checkpoint(ctx, c, db, storeDir, "kv", n, opts...)
		if err != nil {
			t.Fatalf("checkpoint %d: %v", n, err)
		}
		pause := time.Since(t0)
		ev, err := p.Wait(ctx)
		if err != nil {
			t.Fatalf("checkpoint %d: %v", n, err)
		}
		s := shipped{size: ev.CheckpointSize, full: ev.FullSize, uploaded: ev.FilesUploaded, reused: ev.FilesReused,
			roundBytes: perRound, pauseDuration: pause}
		copyDir := filepath.Join(local, "job", "kv", fmt.Sprintf("%020d", n))
		entries, err := os.ReadDir(copyDir)
		if err != nil {
			t.Fatalf("local copy of checkpoint %d: %v", n, err)
		}
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".log") {
				fi, err := e.Info()
				if err != nil {
					t.Fatal(err)
				}
				s.walBytes += fi.Size()
			}
		}
		out = append(out, s)
	}
	return out
}

type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func logRounds(t *testing.T, name string, rs []shipped) {
	t.Helper()
	var total int64
	for i, s := range rs {
		if i > 0 {
			total += s.size
		}
		t.Logf("%s: checkpoint %d: checkpoint_size %d B (WAL %d B) for %d B written, %d files uploaded, %d reused, full %d B, app waited %v",
			name, i+1, s.size, s.walBytes, s.roundBytes, s.uploaded, s.reused, s.full, s.pauseDuration.Round(time.Millisecond))
	}
	t.Logf("%s: checkpoints 2..%d shipped %d B, %.2fx the bytes written", name, len(rs), total, float64(total)/float64(int64(len(rs)-1)*rs[0].roundBytes))
}

// TestCheckpointShipsTheNewWritesOnce: with the helper's defaults, a
// checkpoint after a round of writes ships those writes once, as new SSTs,
// reuses every SST of the previous checkpoint, and carries no WAL worth
// the name. Without the flush it would ship the unflushed WAL whole, every
// time.
func TestCheckpointShipsTheNewWritesOnce(t *testing.T) {
	const perRound = 2 << 20 // below Pebble's default 4 MiB memtable: nothing flushes on its own
	rs := checkpointRounds(t, 4, perRound, 0)
	logRounds(t, "flush (default)", rs)
	for i, s := range rs {
		if s.walBytes > 64<<10 {
			t.Errorf("checkpoint %d: the snapshot's WAL holds %d B, want nearly nothing (the memtable is flushed first)", i+1, s.walBytes)
		}
		if i == 0 {
			continue
		}
		if s.size > perRound*5/4 {
			t.Errorf("checkpoint %d: checkpoint_size %d B for %d B of new writes: not incremental", i+1, s.size, perRound)
		}
		if s.reused <= rs[i-1].reused {
			t.Errorf("checkpoint %d: %d files reused, no more than checkpoint %d's %d: the SSTs it shipped are not reused", i+1, s.reused, i, rs[i-1].reused)
		}
	}
}

// TestCheckpointFlushFigures measures the helper with and without the
// flush on a store with a 64 MiB memtable (CKPT_PEBBLE_MEMTABLE_MB
// overrides it): bytes shipped per checkpoint and files reused.
func TestCheckpointFlushFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("measures 2 x 5 checkpoints of a Pebble store")
	}
	mb := uint64(64)
	if v := os.Getenv("CKPT_PEBBLE_MEMTABLE_MB"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CKPT_PEBBLE_MEMTABLE_MB=%q: %v", v, err)
		}
		mb = n
	}
	const perRound = 8 << 20
	with := checkpointRounds(t, 5, perRound, mb<<20)
	without := checkpointRounds(t, 5, perRound, mb<<20, WithoutFlush())
	logRounds(t, "flush (default)", with)
	logRounds(t, "WithoutFlush", without)
	var a, b int64
	for i := 1; i < len(with); i++ {
		a += with[i].size
		b += without[i].size
	}
	if a >= b {
		t.Errorf("with the flush checkpoints 2..5 shipped %d B, without it %d B: the flush saves nothing", a, b)
	}
}

// TestSnapshotKeepsEveryWriteOfATrimmedWAL: the WAL trimmed in a snapshot
// keeps every write not yet flushed (here, with WithoutFlush, all of a
// round's), and loses only the stale tail of the recycled file it reuses.
func TestSnapshotKeepsEveryWriteOfATrimmedWAL(t *testing.T) {
	base := t.TempDir()
	storeDir := filepath.Join(base, "store")
	db, err := pebble.Open(storeDir, &pebble.Options{Logger: quiet{}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	val := make([]byte, 1000)
	put := func(from, to int) {
		for k := from; k < to; k++ {
			for i := range val {
				val[i] = byte(k + i)
			}
			if err := db.Set([]byte(fmt.Sprintf("key-%09d", k)), val, pebble.NoSync); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Rounds of writes and flushes leave WAL files to recycle, each 1 MB.
	for r := range 4 {
		put(r*1000, (r+1)*1000)
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	put(4000, 4100) // unflushed: in the WAL alone
	dir, err := Snapshot(db, storeDir, 1, WithoutFlush())
	if err != nil {
		t.Fatal(err)
	}
	var wal int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".log") {
			fi, _ := e.Info()
			wal += fi.Size()
		}
	}
	t.Logf("the snapshot's WAL: %d B for 100 unflushed writes of 1 kB", wal)
	if wal > 200<<10 {
		t.Errorf("the snapshot's WAL holds %d B for 100 kB of unflushed writes: the recycled tail is shipped", wal)
	}
	restored, err := pebble.Open(dir, &pebble.Options{Logger: quiet{}})
	if err != nil {
		t.Fatalf("open the snapshot: %v", err)
	}
	defer restored.Close()
	for k := 0; k < 4100; k++ {
		v, closer, err := restored.Get([]byte(fmt.Sprintf("key-%09d", k)))
		if err != nil {
			t.Fatalf("key %d: %v (the snapshot lost a write)", k, err)
		}
		if v[0] != byte(k) {
			t.Fatalf("key %d: wrong value", k)
		}
		closer.Close()
	}
}
