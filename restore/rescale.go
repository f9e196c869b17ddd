package restore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/zeebo/blake3"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/internal/safefs"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// RescaleOptions says which old tasks' checkpoints a rescale restore reads
// and which key range of them it keeps.
type RescaleOptions struct {
	Store storage.Store
	Job   string
	// From names the old tasks whose stores hold the range between them.
	From []string
	// Start and End bound the range [Start, End); nil is open.
	Start, End []byte
	// Engine must be "pebble" (the only engine whose files rescale reads).
	Engine string
	// Target is the directory to create; it must be absent or empty.
	Target string
	// Checkpoint picks the checkpoint; it must be job-complete for every
	// task of From. 0 picks the newest such checkpoint.
	Checkpoint uint64
	// Parallelism bounds concurrent file downloads (default 8).
	Parallelism int
	// Partial builds the store from the tasks of From even when other
	// tasks of the job-complete checkpoint hold keys in the range (their
	// keys are then missing from it). Without it such a rescale fails,
	// naming those tasks; checking them costs their private files.
	Partial bool
}

// RescaleTask is what one old task contributed to a rescale restore.
type RescaleTask struct {
	Task string `json:"task"`
	// Files counts the old checkpoint's files, FilesFetched those fetched:
	// the private files and the tables whose key bounds meet the range.
	Files        int   `json:"files"`
	FilesFetched int   `json:"files_fetched"`
	BytesFetched int64 `json:"bytes_fetched"`
	// BytesPrivate is the part of BytesFetched in private files (MANIFEST,
	// OPTIONS, WAL), which every rescale restore fetches whole.
	BytesPrivate int64 `json:"bytes_private"`
	// BytesInRange is Pebble's estimate of the old store's bytes in the
	// range (whole tables inside it, a share of the tables that straddle it).
	BytesInRange int64 `json:"bytes_in_range"`
	// Keys counts the live keys of the old store in the range, as read
	// from the old checkpoint (the verification also compares BLAKE3 sums
	// over their key/value pairs, piece by piece).
	Keys int64 `json:"keys"`
	// First and Last are the task's first and last key in the range (hex).
	First string `json:"first,omitempty"`
	Last  string `json:"last,omitempty"`
	// TablesIngested and BytesIngested count the old tables ingested into
	// the new store unchanged (their bytes are the old objects'), and
	// DeltaKeys the keys written above them from the task's newer tables
	// and WAL. Rewritten says why the task's keys were rewritten instead,
	// one by one; empty when its tables were ingested.
	TablesIngested int    `json:"tables_ingested"`
	BytesIngested  int64  `json:"bytes_ingested"`
	DeltaKeys      int64  `json:"delta_keys"`
	Rewritten      string `json:"rewritten,omitempty"`
}

// RescaleResult is `ckpt restore --rescale-from --json`: the fields of a
// restore's result, with Bytes the bytes fetched from storage.
type RescaleResult struct {
	Restored    bool     `json:"restored"`
	Task        string   `json:"task,omitempty"`
	From        []string `json:"from"`
	Checkpoint  uint64   `json:"checkpoint"`
	Files       int      `json:"files"` // files of the new store
	Bytes       int64    `json:"bytes"` // bytes fetched
	BytesLocal  int64    `json:"bytes_local"`
	BytesRemote int64    `json:"bytes_remote"`
	// BytesInRange sums the old stores' bytes in the range (RescaleTask),
	// BytesPrivate the private files' bytes among Bytes.
	BytesInRange int64 `json:"bytes_in_range"`
	BytesPrivate int64 `json:"bytes_private"`
	// BytesWritten is the size of the new store's files.
	BytesWritten int64 `json:"bytes_written"`
	// FilesFetched and FilesSkipped count the old checkpoints' files
	// fetched and those never fetched because they lie outside the range.
	FilesFetched int   `json:"files_fetched"`
	FilesSkipped int   `json:"files_skipped"`
	Keys         int64 `json:"keys"`
	// TablesIngested, BytesIngested and DeltaKeys sum the tasks' (see
	// RescaleTask).
	TablesIngested int    `json:"tables_ingested"`
	BytesIngested  int64  `json:"bytes_ingested"`
	DeltaKeys      int64  `json:"delta_keys"`
	Start          string `json:"start"` // hex, "" open
	End            string `json:"end"`   // hex, "" open
	// Verified: the new store was opened after it was built, holds only
	// keys in the range, and per old task the count and BLAKE3 sum of its
	// keys equal those read from the old checkpoint.
	Verified bool          `json:"verified"`
	Tasks    []RescaleTask `json:"tasks"`
	// FetchMS, BuildMS and VerifyMS split the time: fetching the old
	// files, building the new store, checking it.
	FetchMS    int64  `json:"fetch_ms"`
	BuildMS    int64  `json:"build_ms"`
	VerifyMS   int64  `json:"verify_ms"`
	DurationMS int64  `json:"duration_ms"`
	Target     string `json:"target"`
}

// ParseKeyRange parses START:END, each a hex string that may be empty for
// an open bound, into [start, end) (nil for open).
func ParseKeyRange(s string) (start, end []byte, err error) {
	lo, hi, ok := strings.Cut(s, ":")
	if !ok || strings.Contains(hi, ":") {
		return nil, nil, fmt.Errorf("key range %q: want START:END, two hex strings, either may be empty (e.g. 00:80)", s)
	}
	if start, err = parseBound(lo); err != nil {
		return nil, nil, fmt.Errorf("key range %q: start: %w", s, err)
	}
	if end, err = parseBound(hi); err != nil {
		return nil, nil, fmt.Errorf("key range %q: end: %w", s, err)
	}
	if start != nil && end != nil && bytes.Compare(start, end) >= 0 {
		return nil, nil, fmt.Errorf("key range %q: start must be below end (the range is [START, END))", s)
	}
	return start, end, nil
}

func parseBound(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not hex: %w", s, err)
	}
	return b, nil
}

// checkRescale checks the request before anything is read or written.
func checkRescale(o *RescaleOptions) (string, error) {
	if o.Engine != "pebble" {
		return "", fmt.Errorf("rescale restore: engine %q: only pebble stores can be rescaled (use --engine pebble)", o.Engine)
	}
	if err := manifests.ValidName("job", o.Job); err != nil {
		return "", err
	}
	if len(o.From) == 0 {
		return "", errors.New("rescale restore: name the old tasks (--rescale-from T1,T2,...)")
	}
	seen := map[string]bool{}
	for _, t := range o.From {
		if err := manifests.ValidName("task", t); err != nil {
			return "", err
		}
		if seen[t] {
			return "", fmt.Errorf("rescale restore: task %s is named twice", t)
		}
		seen[t] = true
	}
	if o.Start != nil && o.End != nil && bytes.Compare(o.Start, o.End) >= 0 {
		return "", errors.New("rescale restore: the key range's start must be below its end")
	}
	if !filepath.IsAbs(o.Target) {
		return "", fmt.Errorf("restore target %q must be an absolute path", o.Target)
	}
	if o.Parallelism < 1 {
		o.Parallelism = 8
	}
	return filepath.Clean(o.Target), nil
}

// pickRescale returns the checkpoint to read: o.Checkpoint if it is
// job-complete for every old task, else the newest one that is.
func pickRescale(ctx context.Context, o RescaleOptions) (uint64, error) {
	cat, err := manifests.Scan(ctx, o.Store, o.Job, "")
	if err != nil {
		return 0, err
	}
	jr := manifests.NewJobReader(o.Store, cat)
	var common []uint64
	for i, t := range o.From {
		refs := cat.Retained(t)
		if len(refs) == 0 {
			return 0, fmt.Errorf("%w: storage %s holds no checkpoint of task %s in job %s (see ckpt list)", ErrNoCheckpoint, o.Store, t, o.Job)
		}
		var ns []uint64
		for _, r := range refs {
			if i == 0 || slices.Contains(common, r.Checkpoint) {
				ns = append(ns, r.Checkpoint)
			}
		}
		common = ns
	}
	complete := func(n uint64) (string, error) {
		st, err := jr.Status(ctx, n)
		if err != nil {
			return "", err
		}
		if !st.Complete {
			reason := st.Reason
			if reason == "" {
				reason = "it is not a job-wide checkpoint"
			}
			return fmt.Sprintf("checkpoint %d is not job-complete: %s", n, reason), nil
		}
		for _, t := range o.From {
			if !st.Includes(t) {
				return fmt.Sprintf("job-wide checkpoint %d does not include task %s", n, t), nil
			}
		}
		return "", nil
	}
	if o.Checkpoint != 0 {
		if !slices.Contains(common, o.Checkpoint) {
			return 0, fmt.Errorf("%w: checkpoint %d is not a complete retained checkpoint of every task of %s (see ckpt list)", ErrNoCheckpoint, o.Checkpoint, strings.Join(o.From, ","))
		}
		why, err := complete(o.Checkpoint)
		if err != nil {
			return 0, err
		}
		if why != "" {
			return 0, fmt.Errorf("%w: %s (see ckpt list)", ErrNoCheckpoint, why)
		}
		return o.Checkpoint, nil
	}
	sort.Slice(common, func(i, j int) bool { return common[i] > common[j] })
	var whys []string // why the newest ones are not job-complete: a damaged manifest is named
	for _, n := range common {
		why, err := complete(n)
		if err != nil {
			return 0, err
		}
		if why == "" {
			return n, nil
		}
		if len(whys) < 3 {
			whys = append(whys, why)
		}
	}
	if len(whys) > 0 {
		return 0, fmt.Errorf("%w: tasks %s have no job-complete checkpoint in common in job %s: %s (see ckpt list)", ErrNoCheckpoint, strings.Join(o.From, ","), o.Job, strings.Join(whys, "; "))
	}
	return 0, fmt.Errorf("%w: tasks %s have no job-complete checkpoint in common in job %s (see ckpt list)", ErrNoCheckpoint, strings.Join(o.From, ","), o.Job)
}

// Rescale builds a new task's Pebble store from the checkpoints of old
// tasks, keeping only the keys in [Start, End).
//
// For each old task it fetches the checkpoint's private files (MANIFEST,
// OPTIONS, CURRENT, markers, WAL) into a scratch directory, opens the old
// store read-only there through a file system that lists the tables it
// has not fetched, and asks Pebble for the tables whose key bounds meet
// the range (DB.SSTables reads only the MANIFEST's metadata). Only those
// tables (and any blob files) are fetched, each verified by size and
// SHA-256; a table outside the range is never fetched, and if Pebble ever
// opened one, the read would fail, not return less.
//
// Then, per old task, the fast path (rescale_fast.go): its clean tables
// (every key at sequence number zero by the MANIFEST, no range deletions,
// range keys, merge operands or blob references) are ingested into the
// new store unchanged, so their bytes stay those of the old objects, and
// the overlay of everything newer (its other tables and its WAL) is
// resolved through the old store, key by key, into delta tables ingested
// above them; what the clean tables hold outside the range is excised. A
// task that cannot take it (no clean tables, or most of its bytes in
// other tables, range keys, blob files, a WAL entry the overlay does not
// read, tables that would shadow another task's keys) takes the slow
// path: its live keys in the range are read through Pebble's iterator and
// written into new tables, in pieces cut at table bounds and copied in
// parallel, which are ingested.
//
// The new store is reopened and checked while the old stores are read
// again: per piece of each old task, the count and BLAKE3 sum of its keys
// in the new store equal those the old store holds there, and the new store
// holds no key outside the old tasks' spans in the range. Then it is
// renamed into place: the target appears whole and checked, or not at
// all. Old tasks whose keys in the range overlap each other fail: rescale
// restores stores that partition the key space.
func Rescale(ctx context.Context, o RescaleOptions) (*RescaleResult, error) {
	start := time.Now()
	target, err := checkRescale(&o)
	if err != nil {
		return nil, err
	}
	if _, err := checkTarget(nil, target, false); err != nil {
		return nil, err
	}
	n, err := pickRescale(ctx, o)
	if err != nil {
		return nil, err
	}
	olds := make([]*oldTask, len(o.From))
	for i, t := range o.From {
		m, _, err := manifests.LoadEncoded(ctx, o.Store, o.Job, t, n)
		if err != nil {
			return nil, err
		}
		if m.Engine != "" && m.Engine != "pebble" {
			return nil, fmt.Errorf("rescale restore: task %s checkpoint %d is a %s store, not pebble", t, n, m.Engine)
		}
		olds[i] = &oldTask{task: t, m: m}
	}
	// The checkpoint's other tasks: checked for keys in the range.
	var others []*oldTask
	if !o.Partial {
		for _, t := range olds[0].m.Tasks {
			if slices.Contains(o.From, t) {
				continue
			}
			m, _, err := manifests.LoadEncoded(ctx, o.Store, o.Job, t, n)
			if err != nil {
				return nil, fmt.Errorf("rescale restore: task %s of job-complete checkpoint %d: %w", t, n, err)
			}
			others = append(others, &oldTask{task: t, m: m})
		}
	}
	r := &restorer{o: Options{Store: o.Store, Job: o.Job, Target: target}, target: target, n: n}
	defer r.close()
	if err := r.makeTemp(); err != nil {
		return nil, err
	}
	scratch, unlock, err := makeScratch(target)
	if err != nil {
		r.removeTemp()
		return nil, err
	}
	defer os.RemoveAll(scratch)
	defer unlock()
	if err := checkOthers(ctx, o, others, scratch); err != nil {
		r.removeTemp()
		return nil, err
	}
	res, err := rescale(ctx, o, r, olds, scratch)
	if err != nil {
		r.removeTemp()
		return nil, err
	}
	if err := r.place(); err != nil {
		r.removeTemp()
		return nil, err
	}
	res.Checkpoint, res.Target = n, target
	res.DurationMS = time.Since(start).Milliseconds()
	return res, nil
}

// checkOthers fails when a task of the checkpoint that the rescale does
// not read holds keys in the range: the new store would silently lack
// them. A task holds keys there when a table of its MANIFEST meets the
// range (by its bounds: the tables themselves are not fetched) or its WAL
// holds a live key in it. Only the tasks' private files are fetched.
func checkOthers(ctx context.Context, o RescaleOptions, others []*oldTask, scratch string) error {
	if len(others) == 0 {
		return nil
	}
	cache := pebble.NewCache(8 << 20)
	defer cache.Unref()
	var fetched atomic.Int64
	var holding []string
	for i, t := range others {
		if err := func() error {
			defer t.close()
			t.dir = filepath.Join(scratch, fmt.Sprintf("other-%d", i))
			if err := os.Mkdir(t.dir, 0o755); err != nil {
				return fmt.Errorf("rescale restore: %w", err)
			}
			defer os.RemoveAll(t.dir)
			d, err := safefs.OpenRoot(t.dir)
			if err != nil {
				return fmt.Errorf("rescale restore: %w", err)
			}
			defer d.Close()
			g, gctx := errgroup.WithContext(ctx)
			g.SetLimit(o.Parallelism)
			for _, f := range t.m.Files {
				if f.Kind != manifests.Shared {
					g.Go(func() error { return t.fetch(gctx, o.Store, d, f, &fetched) })
				}
			}
			if err := g.Wait(); err != nil {
				return err
			}
			if err := t.plan(o, cache); err != nil {
				return err
			}
			why := ""
			for _, f := range t.tables {
				if strings.HasSuffix(f.Name, ".sst") {
					why = "its table " + f.Name + " meets it"
					break
				}
			}
			if why == "" {
				// No table meets the range: what the iterator finds there
				// comes from the WAL alone, and no table is read.
				it, err := t.db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: o.Start, UpperBound: o.End, KeyTypes: pebble.IterKeyTypePointsAndRanges})
				if err != nil {
					return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
				}
				if it.First() {
					why = fmt.Sprintf("its WAL holds key %x", it.Key())
				}
				if err := it.Close(); err != nil {
					return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
				}
			}
			if why != "" {
				holding = append(holding, fmt.Sprintf("%s (%s)", t.task, why))
			}
			return nil
		}(); err != nil {
			return err
		}
	}
	if len(holding) == 0 {
		return nil
	}
	return fmt.Errorf("rescale restore: checkpoint %d's tasks %s also hold keys in [%s, %s), which --rescale-from does not name: the new store would lack them. Add them to --rescale-from, or give --partial to build it from the named tasks alone",
		others[0].m.Checkpoint, strings.Join(holding, ", "), hexBound(o.Start), hexBound(o.End))
}

// hexBound shows a bound of the range in messages; nil is open.
func hexBound(b []byte) string {
	if b == nil {
		return "open"
	}
	return hex.EncodeToString(b)
}

// scratchPrefix starts the name of the scratch directories that rescale
// restores of the target base make beside it.
func scratchPrefix(base string) string { return tempPrefix(base) + "scratch-" }

// makeScratch creates the scratch directory of a rescale restore of
// target, beside it (on its filesystem, so that new tables are linked into
// the store, not copied), and locks it for as long as the restore runs.
// It first removes the scratch directories that restores of the same
// target left when they were killed: unlocked, and unchanged for
// staleAfter (each can hold a large part of the old stores).
func makeScratch(target string) (string, func(), error) {
	parent, base := filepath.Dir(target), filepath.Base(target)
	if entries, err := os.ReadDir(parent); err == nil {
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), scratchPrefix(base)) {
				continue
			}
			p := filepath.Join(parent, e.Name())
			d, err := os.Open(p)
			if err != nil {
				continue
			}
			fi, err := d.Stat()
			if err == nil && unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil && time.Since(fi.ModTime()) >= staleAfter {
				os.RemoveAll(p)
			}
			d.Close()
		}
	}
	scratch, err := os.MkdirTemp(parent, scratchPrefix(base))
	if err != nil {
		return "", nil, fmt.Errorf("rescale restore: scratch dir beside the target: %w", err)
	}
	d, err := os.Open(scratch)
	if err == nil {
		err = unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		if d != nil {
			d.Close()
		}
		os.RemoveAll(scratch)
		return "", nil, fmt.Errorf("rescale restore: lock %s: %w", scratch, err)
	}
	return scratch, func() { d.Close() }, nil
}

// oldTask is one old task's checkpoint, opened read-only in scratch.
type oldTask struct {
	task string
	m    *manifests.Manifest
	dir  string
	db   *pebble.DB
	// tables are the shared files to fetch: the tables that meet the
	// range, and the blob files.
	tables []manifests.File
	// splits are keys inside the range where the old store's tables end:
	// the range is cut there into pieces read in parallel.
	splits [][]byte
	// pieces cut the range; each holds what the old store holds there.
	pieces []*piece
	// clean are the tables ingested unchanged, dirty the other tables that
	// meet the range; walKeys and walDels the WAL's keys and range
	// deletions in the range; delta the tables written from the overlay.
	clean, dirty []*table
	walKeys      [][]byte
	walDels      []span
	delta        []string
	// rewrite, when set, says why the task's keys are rewritten (the
	// slow path) rather than its tables ingested.
	rewrite string
	// extent is the span of the new store where the task's keys may lie,
	// when keyed: for the fast path, the hull of its tables' bounds and its
	// WAL's keys in the range; for the slow path, its first to its last key.
	extent   span
	keyed    bool
	overlaid bool // the overlay was written
	copied   bool // the keys were rewritten
	c        RescaleTask
}

// piece is a part [lo, hi) of the range (nil: open) of one old task, read
// from the old store (and, on the slow path, written into new tables) by
// one goroutine.
type piece struct {
	t      *oldTask
	lo, hi []byte
	keys   int64
	sum    string // BLAKE3 of the piece's key/value pairs, see hashKV
	first  []byte // the piece's first and last key; nil when it has none
	last   []byte
	ssts   []string // the new tables written from its keys
	// newKeys and newSum are the same over the new store, in the piece
	// clipped to the task's extent.
	newKeys int64
	newSum  string
}

// pieces cuts the range of each old task into up to n pieces at its
// splits, evenly spaced among them.
func pieces(olds []*oldTask, o RescaleOptions, n int) []*piece {
	var out []*piece
	for _, t := range olds {
		cuts := t.splits
		if len(cuts) >= n {
			picked := make([][]byte, 0, n-1)
			for i := 1; i < n; i++ {
				picked = append(picked, cuts[i*len(cuts)/n])
			}
			cuts = picked
		}
		lo := o.Start
		for _, c := range cuts {
			out = append(out, &piece{t: t, lo: lo, hi: c})
			lo = c
		}
		out = append(out, &piece{t: t, lo: lo, hi: o.End})
	}
	return out
}

func (t *oldTask) close() {
	if t.db != nil {
		t.db.Close()
		t.db = nil
	}
}

// rescale does Rescale's work in r's temporary directory and scratch.
func rescale(ctx context.Context, o RescaleOptions, r *restorer, olds []*oldTask, scratch string) (*RescaleResult, error) {
	defer func() {
		for _, t := range olds {
			t.close()
		}
	}()
	t0 := time.Now()
	cache := pebble.NewCache(64 << 20)
	defer cache.Unref()
	var fetched atomic.Int64
	// Each old task's scratch dir, open: files are fetched relative to it.
	dirs := make([]*os.File, len(olds))
	for i, t := range olds {
		t.dir = filepath.Join(scratch, fmt.Sprintf("old-%d", i))
		if err := os.Mkdir(t.dir, 0o755); err != nil {
			return nil, fmt.Errorf("rescale restore: %w", err)
		}
		d, err := safefs.OpenRoot(t.dir)
		if err != nil {
			return nil, fmt.Errorf("rescale restore: %w", err)
		}
		defer d.Close()
		dirs[i] = d
	}
	// 1. The private files of every old task, and the plan: which tables
	// meet the range.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Parallelism)
	for i, t := range olds {
		d := dirs[i]
		t.c = RescaleTask{Task: t.task, Files: len(t.m.Files)}
		for _, f := range t.m.Files {
			if f.Kind == manifests.Shared {
				continue
			}
			t.c.FilesFetched++
			t.c.BytesFetched += f.Size
			t.c.BytesPrivate += f.Size
			g.Go(func() error { return t.fetch(gctx, o.Store, d, f, &fetched) })
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for _, t := range olds {
		if err := t.plan(o, cache); err != nil {
			return nil, err
		}
	}
	// 2. The tables that meet the range, and the blob files.
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(o.Parallelism)
	for i, t := range olds {
		d := dirs[i]
		for _, f := range t.tables {
			t.c.FilesFetched++
			t.c.BytesFetched += f.Size
			g.Go(func() error { return t.fetch(gctx, o.Store, d, f, &fetched) })
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	fetchMS := time.Since(t0).Milliseconds()
	t0 = time.Now()
	// 3. The new store. Its format supports virtual tables, so that the
	// parts of clean tables outside the range can be excised.
	fmv := pebble.FormatVirtualSSTables
	for _, t := range olds {
		fmv = max(fmv, t.db.FormatMajorVersion())
	}
	nopts := &pebble.Options{Logger: quiet{}, FormatMajorVersion: fmv, ErrorIfExists: true, Cache: cache}
	nopts.EnsureDefaults()
	db, err := pebble.Open(r.tmp, nopts)
	if err != nil {
		return nil, fmt.Errorf("rescale restore: create the new store in %s: %w", r.tmp, err)
	}
	defer func() {
		if db != nil {
			db.Close()
		}
	}()
	ingestDir := filepath.Join(scratch, "ingest")
	if err := os.Mkdir(ingestDir, 0o755); err != nil {
		return nil, fmt.Errorf("rescale restore: %w", err)
	}
	// The rewritten tables hold only sets; the delta tables hold
	// deletions, which must not be written as if for the lowest level (a
	// tombstone there is marked obsolete, and hidden from readers).
	wopts := nopts.MakeWriterOptions(6, db.TableFormat())
	dopts := nopts.MakeWriterOptions(0, db.TableFormat())
	ropts := nopts.MakeReaderOptions()
	procs := runtime.GOMAXPROCS(0)
	// 4. Which tasks take the fast path; the overlay of those that do, the
	// rewritten keys of those that do not. A fast task whose tables would
	// meet another task's keys in the new store is rewritten instead.
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(procs)
	for _, t := range olds {
		t.pieces = pieces([]*oldTask{t}, o, 2*procs)
		if t.rewrite == "" {
			g.Go(func() error { return t.inspect(gctx, o, ropts) })
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	demote(olds)
	for round := 0; ; round++ {
		g, gctx = errgroup.WithContext(ctx)
		g.SetLimit(procs)
		for i, t := range olds {
			switch {
			case t.rewrite == "" && !t.overlaid:
				t.overlaid = true
				g.Go(func() error {
					return t.overlay(gctx, o, ropts, dopts, filepath.Join(ingestDir, fmt.Sprintf("d%d-%d", i, round)))
				})
			case t.rewrite != "" && !t.copied:
				t.copied = true
				for k, p := range t.pieces {
					g.Go(func() error {
						return p.copy(gctx, wopts, filepath.Join(ingestDir, fmt.Sprintf("p%d-%d", i, k)))
					})
				}
			}
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
		for _, t := range olds {
			if t.rewrite != "" && t.copied && !t.keyed {
				t.keysSpan()
			}
		}
		if !demote(olds) && !slices.ContainsFunc(olds, func(t *oldTask) bool { return t.rewrite != "" && !t.copied }) {
			break
		}
		for _, t := range olds {
			if t.rewrite != "" && len(t.delta) > 0 {
				t.delta, t.c.DeltaKeys = nil, 0 // demoted: its keys are rewritten
			}
		}
	}
	for i, a := range olds {
		for _, b := range olds[i+1:] {
			if a.keyed && b.keyed && a.extent.overlaps(b.extent) {
				return nil, fmt.Errorf("rescale restore: tasks %s and %s both hold keys in the range (%x..%x and %x..%x): rescale needs old tasks that own disjoint key ranges",
					a.task, b.task, a.extent.lo, a.extent.hi, b.extent.lo, b.extent.hi)
			}
		}
	}
	// 5. Ingest: per fast task its clean tables, unchanged, then its delta
	// tables above them; then the rewritten tables; then excise what the
	// clean tables hold outside the range.
	var below, above bool
	var highest []byte
	for i, t := range olds {
		if t.rewrite != "" {
			continue
		}
		var paths []string
		for _, tb := range t.clean {
			// Ingest links the file into the store and removes the path it
			// was given: give it a second link, the old store still reads
			// the first.
			p := filepath.Join(ingestDir, fmt.Sprintf("c%d-%s", i, tb.name))
			if err := os.Link(filepath.Join(t.dir, tb.name), p); err != nil {
				return nil, fmt.Errorf("rescale restore: %w", err)
			}
			paths = append(paths, p)
			t.c.TablesIngested++
			t.c.BytesIngested += int64(tb.info.Size)
			below = below || (o.Start != nil && bytes.Compare(tb.info.Smallest.UserKey, o.Start) < 0)
			if o.End != nil && bytes.Compare(tb.info.Largest.UserKey, o.End) >= 0 {
				above = true
				if bytes.Compare(tb.info.Largest.UserKey, highest) > 0 {
					highest = tb.info.Largest.UserKey
				}
			}
		}
		if err := db.Ingest(ctx, paths); err != nil {
			return nil, fmt.Errorf("rescale restore: ingest the tables of task %s: %w", t.task, err)
		}
		if len(t.delta) > 0 {
			if err := db.Ingest(ctx, t.delta); err != nil {
				return nil, fmt.Errorf("rescale restore: ingest the overlay of task %s: %w", t.task, err)
			}
		}
	}
	var paths []string
	for _, t := range olds {
		if t.rewrite != "" {
			for _, p := range t.pieces {
				paths = append(paths, p.ssts...)
			}
		}
	}
	if len(paths) > 0 {
		if err := db.Ingest(ctx, paths); err != nil {
			return nil, fmt.Errorf("rescale restore: ingest the new tables: %w", err)
		}
	}
	if below {
		if err := db.Excise(ctx, pebble.KeyRange{Start: []byte{}, End: o.Start}); err != nil {
			return nil, fmt.Errorf("rescale restore: cut the keys below the range: %w", err)
		}
	}
	if above {
		if err := db.Excise(ctx, pebble.KeyRange{Start: o.End, End: keyAfter(highest)}); err != nil {
			return nil, fmt.Errorf("rescale restore: cut the keys above the range: %w", err)
		}
	}
	err = db.Close()
	db = nil
	if err != nil {
		return nil, fmt.Errorf("rescale restore: close the new store: %w", err)
	}
	buildMS := time.Since(t0).Milliseconds()
	t0 = time.Now()
	// 6. Check the new store against what the old ones hold.
	keys, err := verifyRescaled(ctx, r.tmp, o, olds)
	if err != nil {
		return nil, err
	}
	verifyMS := time.Since(t0).Milliseconds()
	for _, t := range olds {
		for _, p := range t.pieces {
			t.c.Keys += p.keys
		}
		if err := t.sizeInRange(); err != nil {
			return nil, err
		}
		if t.c.Keys > 0 {
			t.c.Rewritten = t.rewrite
		}
	}
	for _, t := range olds {
		t.close()
	}
	res := &RescaleResult{Restored: true, From: o.From, Keys: keys, Verified: true, FetchMS: fetchMS, BuildMS: buildMS, VerifyMS: verifyMS,
		Start: hex.EncodeToString(o.Start), End: hex.EncodeToString(o.End)}
	for _, t := range olds {
		res.Tasks = append(res.Tasks, t.c)
		res.FilesFetched += t.c.FilesFetched
		res.FilesSkipped += t.c.Files - t.c.FilesFetched
		res.BytesInRange += t.c.BytesInRange
		res.BytesPrivate += t.c.BytesPrivate
		res.TablesIngested += t.c.TablesIngested
		res.BytesIngested += t.c.BytesIngested
		res.DeltaKeys += t.c.DeltaKeys
	}
	res.Bytes = fetched.Load()
	res.BytesRemote = res.Bytes
	entries, err := r.tmpDir.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("rescale restore: %w", err)
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			res.Files++
			res.BytesWritten += fi.Size()
		}
	}
	return res, nil
}

// fetch writes f into the old task's scratch dir from storage, verified.
func (t *oldTask) fetch(ctx context.Context, s storage.Store, dir *os.File, f manifests.File, fetched *atomic.Int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := fetchScratch(ctx, s, dir, f); err != nil {
		return fmt.Errorf("rescale restore: %s of %s checkpoint %d: %w", f.Name, t.task, t.m.Checkpoint, err)
	}
	fetched.Add(f.Size)
	return nil
}

// fetchScratch writes f from its inline bytes or its object into dir,
// verifying size and SHA-256 as a restore does (a mismatch fails loudly),
// but without an fsync: the old task's files live only in scratch, for the
// time the new store is built from them, and a crash loses only the
// scratch directory, never the target.
func fetchScratch(ctx context.Context, s storage.Store, dir *os.File, f manifests.File) error {
	var r io.Reader
	if f.Inline != nil {
		r = bytes.NewReader(f.Inline)
	} else {
		rc, err := s.Get(ctx, f.Key)
		if err != nil {
			return err
		}
		defer rc.Close()
		r = rc
	}
	fd, err := unix.Openat(int(dir.Fd()), f.Name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return &os.PathError{Op: "create", Path: filepath.Join(dir.Name(), f.Name), Err: err}
	}
	out := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), f.Name))
	defer out.Close()
	h := f.NewHasher()
	bp := fsutil.GetBuf()
	defer fsutil.PutBuf(bp)
	n, err := io.CopyBuffer(io.MultiWriter(out, h), io.LimitReader(r, f.Size+1), *bp)
	if err != nil {
		return err
	}
	if n != f.Size {
		return fmt.Errorf("got %d bytes or more, the manifest says %d", n, f.Size)
	}
	if err := f.Check(h.Digest()); err != nil {
		return fmt.Errorf("%w: the stored object is corrupt", err)
	}
	return out.Close()
}

// plan opens the old store read-only from its private files alone and
// picks the tables whose key bounds meet the range.
func (t *oldTask) plan(o RescaleOptions, cache *pebble.Cache) error {
	var absent []string
	byName := map[string]manifests.File{}
	for _, f := range t.m.Files {
		if f.Kind == manifests.Shared {
			absent = append(absent, f.Name)
			byName[f.Name] = f
		}
	}
	fs := &absentFS{FS: vfs.Default, dir: filepath.Clean(t.dir), absent: absent}
	db, err := pebble.Open(t.dir, &pebble.Options{ReadOnly: true, FS: fs, Logger: quiet{}, Cache: cache,
		DisableConsistencyCheck: true})
	if err != nil {
		return fmt.Errorf("rescale restore: open task %s checkpoint %d (is it a pebble store?): %w", t.task, t.m.Checkpoint, err)
	}
	t.db = db
	levels, err := db.SSTables()
	if err != nil {
		return fmt.Errorf("rescale restore: tables of task %s: %w", t.task, err)
	}
	want := map[string]bool{}
	var tables []*table
	for level, infos := range levels {
		for _, tb := range infos {
			if !meets(tb.Smallest.UserKey, tb.Largest.UserKey, o.Start, o.End) {
				continue
			}
			name := tb.BackingSSTNum.String() + ".sst"
			if _, ok := byName[name]; !ok {
				return fmt.Errorf("rescale restore: task %s checkpoint %d: its MANIFEST names table %s, which the checkpoint does not hold", t.task, t.m.Checkpoint, name)
			}
			want[name] = true
			tables = append(tables, &table{name: name, info: tb, level: level})
			if k := tb.Largest.UserKey; (o.Start == nil || bytes.Compare(k, o.Start) > 0) && (o.End == nil || bytes.Compare(k, o.End) < 0) {
				t.splits = append(t.splits, slices.Clone(k))
			}
		}
	}
	slices.SortFunc(t.splits, bytes.Compare)
	t.splits = slices.CompactFunc(t.splits, bytes.Equal)
	t.classify(tables)
	for _, f := range t.m.Files {
		if f.Kind == manifests.Shared && (want[f.Name] || !strings.HasSuffix(f.Name, ".sst")) {
			t.tables = append(t.tables, f)
		}
	}
	return nil
}

// meets reports whether the table bounds [lo, hi] (inclusive, as the
// MANIFEST holds them) meet [start, end) (nil: open).
func meets(lo, hi, start, end []byte) bool {
	return (end == nil || bytes.Compare(lo, end) < 0) && (start == nil || bytes.Compare(hi, start) >= 0)
}

// absentFS lists the old checkpoint's tables that were not fetched as if
// they were in dir, so that Pebble opens the store from its MANIFEST
// without them. Reading one fails (the file is not there): a table
// outside the range is never read in place of its keys.
type absentFS struct {
	vfs.FS
	dir    string
	absent []string
}

// List implements vfs.FS.
func (f *absentFS) List(dir string) ([]string, error) {
	ls, err := f.FS.List(dir)
	if err != nil || filepath.Clean(dir) != f.dir {
		return ls, err
	}
	for _, n := range f.absent {
		if !slices.Contains(ls, n) {
			ls = append(ls, n)
		}
	}
	return ls, nil
}

// maxTableBytes is where copyRange starts a new table.
const maxTableBytes = 128 << 20

// copy reads the old store's live keys in the piece and writes them into
// new tables under prefix, counting and hashing them as it goes. With an
// empty prefix it only counts and hashes them.
func (p *piece) copy(ctx context.Context, wopts sstable.WriterOptions, prefix string) error {
	t := p.t
	ro := &pebble.IterOptions{LowerBound: p.lo, UpperBound: p.hi, KeyTypes: pebble.IterKeyTypeRangesOnly}
	it, err := t.db.NewIterWithContext(ctx, ro)
	if err != nil {
		return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
	}
	hasRange := it.First()
	if err := it.Close(); err != nil {
		return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
	}
	if hasRange {
		return fmt.Errorf("rescale restore: task %s holds range keys in the range; rescale copies point keys only", t.task)
	}
	ro.KeyTypes = pebble.IterKeyTypePointsOnly
	it, err = t.db.NewIterWithContext(ctx, ro)
	if err != nil {
		return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
	}
	defer it.Close()
	h := newPairHash()
	var w *sstable.Writer
	finish := func() error {
		if w == nil {
			return nil
		}
		err := w.Close()
		w = nil
		return err
	}
	defer finish()
	for valid := it.First(); valid; valid = it.Next() {
		if p.keys%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
		}
		k := it.Key()
		if prefix != "" {
			if err := p.write(&w, wopts, prefix, k, v); err != nil {
				return err
			}
		}
		hashKV(h, k, v)
		if p.first == nil {
			p.first = slices.Clone(k)
		}
		p.last = append(p.last[:0], k...)
		p.keys++
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("rescale restore: read task %s checkpoint %d: %w", t.task, t.m.Checkpoint, err)
	}
	if err := finish(); err != nil {
		return fmt.Errorf("rescale restore: write a new table: %w", err)
	}
	p.sum = hex.EncodeToString(h.Sum(nil))
	return nil
}

// write adds k, v to the piece's current new table *w, starting a new
// one under prefix when there is none or it is full.
func (p *piece) write(w **sstable.Writer, wopts sstable.WriterOptions, prefix string, k, v []byte) error {
	if *w != nil && (*w).Raw().EstimatedSize() >= maxTableBytes {
		err := (*w).Close()
		*w = nil
		if err != nil {
			return fmt.Errorf("rescale restore: write a new table: %w", err)
		}
	}
	if *w == nil {
		name := fmt.Sprintf("%s-%06d.sst", prefix, len(p.ssts))
		f, err := vfs.Default.Create(name, vfs.WriteCategoryUnspecified)
		if err != nil {
			return fmt.Errorf("rescale restore: %w", err)
		}
		*w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), wopts)
		p.ssts = append(p.ssts, name)
	}
	if err := (*w).Set(k, v); err != nil {
		return fmt.Errorf("rescale restore: write a new table: %w", err)
	}
	return nil
}

// span returns the task's first and last key in the range, read from the
// old store by its pieces; nil when it holds none.
func (t *oldTask) span() (first, last []byte) {
	for _, p := range t.pieces {
		if p.first != nil {
			if first == nil {
				first = p.first
			}
			last = p.last
		}
	}
	return first, last
}

// keysSpan sets a rewritten task's extent to its keys' span.
func (t *oldTask) keysSpan() {
	if first, last := t.span(); first != nil {
		t.extent, t.keyed = span{first, keyAfter(last)}, true
	}
}

// sizeInRange sets the task's first and last key in the range and
// Pebble's estimate of its bytes between them, from its pieces.
func (t *oldTask) sizeInRange() error {
	first, last := t.span()
	if first == nil {
		return nil
	}
	t.c.First, t.c.Last = hex.EncodeToString(first), hex.EncodeToString(last)
	est, err := t.db.EstimateDiskUsage(first, last)
	if err != nil {
		return fmt.Errorf("rescale restore: size of task %s's range: %w", t.task, err)
	}
	t.c.BytesInRange = int64(est)
	return nil
}

// newPairHash returns the hash of the check's key/value pairs: BLAKE3,
// as strong as SHA-256 against a difference and about twice as fast here.
func newPairHash() hash.Hash { return blake3.New() }

// hashKV adds one key/value pair to h: each as uvarint length and bytes.
func hashKV(h hash.Hash, k, v []byte) {
	var b [binary.MaxVarintLen64]byte
	h.Write(b[:binary.PutUvarint(b[:], uint64(len(k)))])
	h.Write(k)
	h.Write(b[:binary.PutUvarint(b[:], uint64(len(v)))])
	h.Write(v)
}

// verifyRescaled opens the new store in dir read-only and checks it
// against the old stores, reading both at once: for each piece of each
// old task, the count and BLAKE3 sum of the new store's keys in the piece
// (clipped to the task's extent) must equal those of the old store's keys
// in the piece (read now for a task whose tables were ingested, while
// rewriting for the others); and the new store must hold no key outside
// the tasks' extents, which lie inside [Start, End) and are disjoint. It
// returns the number of keys.
func verifyRescaled(ctx context.Context, dir string, o RescaleOptions, olds []*oldTask) (int64, error) {
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: quiet{}})
	if err != nil {
		return 0, fmt.Errorf("rescale restore: the new store does not open: %w", err)
	}
	defer db.Close()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	var exts []span
	for _, t := range olds {
		if t.keyed {
			exts = append(exts, t.extent)
		}
		for _, p := range t.pieces {
			if t.rewrite == "" {
				g.Go(func() error { return p.copy(gctx, sstable.WriterOptions{}, "") })
			}
			g.Go(func() error { return p.verifyNew(gctx, db) })
		}
	}
	slices.SortFunc(exts, func(a, b span) int {
		switch {
		case a.lo == nil:
			return -1
		case b.lo == nil:
			return 1
		}
		return bytes.Compare(a.lo, b.lo)
	})
	// The gaps around the extents: below the first, between, above the last.
	gap, open := span{}, true
	for _, e := range exts {
		if e.lo != nil && (open || bytes.Compare(gap.lo, e.lo) < 0) {
			gp := span{gap.lo, e.lo}
			g.Go(func() error { return noKeys(gctx, db, o, gp) })
		}
		if e.hi == nil {
			open = false
			gap.lo = nil
			break
		}
		gap, open = span{lo: e.hi}, false
	}
	if gap.lo != nil || len(exts) == 0 {
		gp := span{lo: gap.lo}
		g.Go(func() error { return noKeys(gctx, db, o, gp) })
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	var keys int64
	for _, t := range olds {
		for _, p := range t.pieces {
			if p.newKeys != p.keys || p.newSum != p.sum {
				return 0, fmt.Errorf("rescale restore: the new store holds %d keys (blake3 %s) in [%x, %x) from task %s, its checkpoint %d holds %d (blake3 %s)",
					p.newKeys, p.newSum, p.lo, p.hi, t.task, t.m.Checkpoint, p.keys, p.sum)
			}
			keys += p.newKeys
		}
	}
	return keys, nil
}

// verifyNew counts and hashes the new store's keys in the piece, clipped
// to its task's extent.
func (p *piece) verifyNew(ctx context.Context, db *pebble.DB) error {
	h := newPairHash()
	defer func() { p.newSum = hex.EncodeToString(h.Sum(nil)) }()
	s, ok := span{p.lo, p.hi}.clip(p.t.extent)
	if !p.t.keyed || !ok {
		return nil
	}
	it, err := db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: s.lo, UpperBound: s.hi})
	if err != nil {
		return fmt.Errorf("rescale restore: read the new store: %w", err)
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		if p.newKeys%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("rescale restore: read the new store: %w", err)
		}
		hashKV(h, it.Key(), v)
		p.newKeys++
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("rescale restore: read the new store: %w", err)
	}
	return nil
}

// noKeys checks that the new store holds no key in s, where no old task
// put any.
func noKeys(ctx context.Context, db *pebble.DB, o RescaleOptions, s span) error {
	it, err := db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: s.lo, UpperBound: s.hi})
	if err != nil {
		return fmt.Errorf("rescale restore: read the new store: %w", err)
	}
	defer it.Close()
	if it.First() {
		k := it.Key()
		if !(span{o.Start, o.End}).contains(k) {
			return fmt.Errorf("rescale restore: the new store holds key %x outside the range [%x, %x)", k, o.Start, o.End)
		}
		return fmt.Errorf("rescale restore: the new store holds key %x, which no old task holds", k)
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("rescale restore: read the new store: %w", err)
	}
	return nil
}

// quiet drops Pebble's informational logs (WAL replay lines).
type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
