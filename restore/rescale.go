package restore

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/engines"
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
	// Engine names the stores' engine, which must implement
	// engines.Rescaler in engines.Default: "pebble", once package
	// engines/pebble is linked (cmd/ckpt links it).
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

// checkRescale checks the request before anything is read or written,
// and finds the engine that rescales its stores.
func checkRescale(o *RescaleOptions) (string, engines.Rescaler, error) {
	e, err := engines.Lookup(o.Engine)
	if err != nil {
		return "", nil, fmt.Errorf("rescale restore: %w", err)
	}
	rs, ok := e.(engines.Rescaler)
	if !ok {
		return "", nil, fmt.Errorf("rescale restore: engine %q cannot rescale its stores; engines that can: %s (use --engine with one of them)", e.Name(), rescalers())
	}
	if err := manifests.ValidName("job", o.Job); err != nil {
		return "", nil, err
	}
	if len(o.From) == 0 {
		return "", nil, errors.New("rescale restore: name the old tasks (--rescale-from T1,T2,...)")
	}
	seen := map[string]bool{}
	for _, t := range o.From {
		if err := manifests.ValidName("task", t); err != nil {
			return "", nil, err
		}
		if seen[t] {
			return "", nil, fmt.Errorf("rescale restore: task %s is named twice", t)
		}
		seen[t] = true
	}
	if o.Start != nil && o.End != nil && bytes.Compare(o.Start, o.End) >= 0 {
		return "", nil, errors.New("rescale restore: the key range's start must be below its end")
	}
	if !filepath.IsAbs(o.Target) {
		return "", nil, fmt.Errorf("restore target %q must be an absolute path", o.Target)
	}
	if o.Parallelism < 1 {
		o.Parallelism = 8
	}
	return filepath.Clean(o.Target), rs, nil
}

// rescalers names the engines of engines.Default that can rescale, or
// says there are none in this build.
func rescalers() string {
	var out []string
	for _, n := range engines.Default.Names() {
		if e, err := engines.Lookup(n); err == nil {
			if _, ok := e.(engines.Rescaler); ok {
				out = append(out, n)
			}
		}
	}
	if len(out) == 0 {
		return "none in this build"
	}
	return strings.Join(out, ", ")
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

// Rescale builds a new task's store from the checkpoints of old tasks,
// keeping only the keys in [Start, End). The engine does the building
// (engines.Rescaler: Pebble's is in package engines/pebble); this package
// chooses the checkpoint (job-complete for every old task), loads the old
// tasks' manifests, refuses a range that tasks not named hold keys in
// (unless Partial), fetches every file the engine asks for, checked by
// size and hash as a restore does (a mismatch fails loudly), and gives
// the engine an empty temporary directory beside the target, renamed into
// place once the engine has built and checked the store: the target
// appears whole and checked, or not at all.
func Rescale(ctx context.Context, o RescaleOptions) (*RescaleResult, error) {
	start := time.Now()
	target, eng, err := checkRescale(&o)
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
	olds, others, err := loadRescale(ctx, o, n)
	if err != nil {
		return nil, err
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
	if err := checkOthers(ctx, o, eng, others, scratch); err != nil {
		r.removeTemp()
		return nil, err
	}
	res, err := rescale(ctx, o, eng, r, olds, scratch)
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

// oldTask is one old task's checkpoint that a rescale reads.
type oldTask struct {
	task string
	m    *manifests.Manifest
}

// loadRescale loads checkpoint n of the old tasks and, unless o.Partial,
// of the checkpoint's other tasks (checked for keys in the range).
func loadRescale(ctx context.Context, o RescaleOptions, n uint64) (olds, others []oldTask, err error) {
	for _, t := range o.From {
		m, _, err := manifests.LoadEncoded(ctx, o.Store, o.Job, t, n)
		if err != nil {
			return nil, nil, err
		}
		if m.Engine != "" && m.Engine != o.Engine {
			return nil, nil, fmt.Errorf("rescale restore: task %s checkpoint %d is a %s store, not %s", t, n, m.Engine, o.Engine)
		}
		olds = append(olds, oldTask{task: t, m: m})
	}
	if o.Partial {
		return olds, nil, nil
	}
	for _, t := range olds[0].m.Tasks {
		if slices.Contains(o.From, t) {
			continue
		}
		m, _, err := manifests.LoadEncoded(ctx, o.Store, o.Job, t, n)
		if err != nil {
			return nil, nil, fmt.Errorf("rescale restore: task %s of job-complete checkpoint %d: %w", t, n, err)
		}
		others = append(others, oldTask{task: t, m: m})
	}
	return olds, others, nil
}

// checkOthers fails when a task of the checkpoint that the rescale does
// not read holds keys in the range: the new store would silently lack
// them. The engine says whether it does, from as few of its files as it
// can (Pebble's: its private files alone).
func checkOthers(ctx context.Context, o RescaleOptions, eng engines.Rescaler, others []oldTask, scratch string) error {
	if len(others) == 0 {
		return nil
	}
	f := newFetcher(o, others, scratch)
	whys, err := eng.HoldsKeys(ctx, engines.RescaleRequest{Sources: f.sources(), Start: o.Start, End: o.End, Scratch: scratch, Fetch: f.fetch})
	if err != nil {
		return err
	}
	if len(whys) != len(others) {
		return fmt.Errorf("rescale restore: engine %s answered for %d tasks of %d", eng.Name(), len(whys), len(others))
	}
	var holding []string
	for i, why := range whys {
		if why != "" {
			holding = append(holding, fmt.Sprintf("%s (%s)", others[i].task, why))
		}
	}
	if len(holding) == 0 {
		return nil
	}
	return fmt.Errorf("rescale restore: checkpoint %d's tasks %s also hold keys in [%s, %s), which --rescale-from does not name: the new store would lack them. Add them to --rescale-from, or give --partial to build it from the named tasks alone",
		others[0].m.Checkpoint, strings.Join(holding, ", "), hexBound(o.Start), hexBound(o.End))
}

// rescale has the engine build the new store in r's temporary directory
// from the old tasks, and reports what it fetched and built.
func rescale(ctx context.Context, o RescaleOptions, eng engines.Rescaler, r *restorer, olds []oldTask, scratch string) (*RescaleResult, error) {
	f := newFetcher(o, olds, scratch)
	rep, err := eng.Rescale(ctx, engines.RescaleRequest{Sources: f.sources(), Start: o.Start, End: o.End, Target: r.tmp, Scratch: scratch, Fetch: f.fetch})
	if err != nil {
		return nil, err
	}
	if len(rep.Sources) != len(olds) {
		return nil, fmt.Errorf("rescale restore: engine %s reported on %d tasks of %d", eng.Name(), len(rep.Sources), len(olds))
	}
	if !rep.Verified {
		return nil, fmt.Errorf("rescale restore: engine %s did not check the store it built: nothing was restored", eng.Name())
	}
	res := &RescaleResult{Restored: true, From: o.From, Keys: rep.Keys, Verified: true, FetchMS: rep.FetchMS, BuildMS: rep.BuildMS, VerifyMS: rep.VerifyMS,
		Start: hex.EncodeToString(o.Start), End: hex.EncodeToString(o.End)}
	for i, sr := range rep.Sources {
		c := f.counts[i]
		c.Keys, c.BytesInRange, c.Rewritten = sr.Keys, sr.BytesInRange, sr.Rewritten
		c.TablesIngested, c.BytesIngested, c.DeltaKeys = sr.TablesIngested, sr.BytesIngested, sr.DeltaKeys
		if sr.First != nil {
			c.First, c.Last = hex.EncodeToString(sr.First), hex.EncodeToString(sr.Last)
		}
		res.Tasks = append(res.Tasks, c)
		res.FilesFetched += c.FilesFetched
		res.FilesSkipped += c.Files - c.FilesFetched
		res.BytesInRange += c.BytesInRange
		res.BytesPrivate += c.BytesPrivate
		res.TablesIngested += c.TablesIngested
		res.BytesIngested += c.BytesIngested
		res.DeltaKeys += c.DeltaKeys
	}
	res.Bytes = f.fetched.Load()
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

// fetcher fetches the old tasks' files an engine asks for into its
// scratch directory, each verified, and counts them per task.
type fetcher struct {
	store   storage.Store
	scratch string
	par     int
	olds    []oldTask
	byName  []map[string]manifests.File
	fetched atomic.Int64
	mu      sync.Mutex
	counts  []RescaleTask // Task, Files, FilesFetched, BytesFetched, BytesPrivate
}

func newFetcher(o RescaleOptions, olds []oldTask, scratch string) *fetcher {
	f := &fetcher{store: o.Store, scratch: filepath.Clean(scratch), par: o.Parallelism, olds: olds}
	for _, t := range olds {
		byName := map[string]manifests.File{}
		for _, mf := range t.m.Files {
			byName[mf.Name] = mf
		}
		f.byName = append(f.byName, byName)
		f.counts = append(f.counts, RescaleTask{Task: t.task, Files: len(t.m.Files)})
	}
	return f
}

// sources describes the old tasks to the engine.
func (f *fetcher) sources() []engines.RescaleSource {
	out := make([]engines.RescaleSource, len(f.olds))
	for i, t := range f.olds {
		out[i] = engines.RescaleSource{Task: t.task, Checkpoint: t.m.Checkpoint}
		for _, mf := range t.m.Files {
			out[i].Files = append(out[i].Files, engines.SourceFile{Name: mf.Name, Kind: mf.Kind, Size: mf.Size})
		}
	}
	return out
}

// fetch implements engines.Fetcher: it writes each file into its
// directory (below the scratch directory, opened once per call, the file
// created through its handle), from storage or the manifest's inline
// bytes, checked by size and hash, o.Parallelism at once.
func (f *fetcher) fetch(ctx context.Context, files []engines.FetchFile) error {
	type job struct {
		dir *os.File
		src int
		mf  manifests.File
	}
	dirs := map[string]*os.File{}
	defer func() {
		for _, d := range dirs {
			d.Close()
		}
	}()
	jobs := make([]job, 0, len(files))
	for _, ff := range files {
		if ff.Source < 0 || ff.Source >= len(f.olds) {
			return fmt.Errorf("rescale restore: the engine asked for a file of task %d of %d", ff.Source, len(f.olds))
		}
		t := f.olds[ff.Source]
		mf, ok := f.byName[ff.Source][ff.Name]
		if !ok {
			return fmt.Errorf("rescale restore: the engine asked for %s, which %s checkpoint %d does not hold", ff.Name, t.task, t.m.Checkpoint)
		}
		dir := filepath.Clean(ff.Dir)
		if !strings.HasPrefix(dir, f.scratch+string(filepath.Separator)) {
			return fmt.Errorf("rescale restore: the engine asked for %s of %s in %s, outside its scratch dir %s", ff.Name, t.task, dir, f.scratch)
		}
		d, ok := dirs[dir]
		if !ok {
			var err error
			if d, err = safefs.OpenRoot(dir); err != nil {
				return fmt.Errorf("rescale restore: %w", err)
			}
			dirs[dir] = d
		}
		f.mu.Lock()
		c := &f.counts[ff.Source]
		c.FilesFetched++
		c.BytesFetched += mf.Size
		if mf.Kind != manifests.Shared {
			c.BytesPrivate += mf.Size
		}
		f.mu.Unlock()
		jobs = append(jobs, job{d, ff.Source, mf})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(f.par)
	for _, j := range jobs {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			t := f.olds[j.src]
			if err := fetchScratch(gctx, f.store, j.dir, j.mf); err != nil {
				return fmt.Errorf("rescale restore: %s of %s checkpoint %d: %w", j.mf.Name, t.task, t.m.Checkpoint, err)
			}
			f.fetched.Add(j.mf.Size)
			return nil
		})
	}
	return g.Wait()
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
