package pebble

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/engines"
)

var _ engines.Rescaler = Engine{}

// Rescale implements engines.Rescaler: it builds a new task's Pebble
// store in o.Target from the checkpoints of old tasks, keeping only the
// keys in [Start, End).
//
// For each old task it fetches the checkpoint's private files (MANIFEST,
// OPTIONS, CURRENT, markers, WAL) into a scratch directory, opens the old
// store read-only there through a file system that lists the tables it
// has not fetched, and asks Pebble for the tables whose key bounds meet
// the range (DB.SSTables reads only the MANIFEST's metadata). Only those
// tables (and any blob files) are fetched, each verified by its hash
// (o.Fetch); a table outside the range is never fetched, and if Pebble
// ever opened one, the read would fail, not return less.
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
// holds no key outside the old tasks' spans in the range (rescale_verify.go).
// The caller then renames it into place: the target appears whole and
// checked, or not at all. Old tasks whose keys in the range overlap each
// other fail: rescale restores stores that partition the key space.
func (Engine) Rescale(ctx context.Context, o engines.RescaleRequest) (*engines.RescaleReport, error) {
	b := &build{o: o, procs: runtime.GOMAXPROCS(0)}
	for i, s := range o.Sources {
		b.olds = append(b.olds, &oldTask{i: i, task: s.Task, src: s})
	}
	defer b.close()
	t0 := time.Now()
	b.cache = pebble.NewCache(64 << 20)
	if err := b.fetch(ctx); err != nil {
		return nil, err
	}
	fetchMS := time.Since(t0).Milliseconds()
	t0 = time.Now()
	if err := b.create(); err != nil {
		return nil, err
	}
	if err := b.choose(ctx); err != nil {
		return nil, err
	}
	if err := b.ingest(ctx); err != nil {
		return nil, err
	}
	err := b.db.Close()
	b.db = nil
	if err != nil {
		return nil, fmt.Errorf("rescale restore: close the new store: %w", err)
	}
	buildMS := time.Since(t0).Milliseconds()
	t0 = time.Now()
	// Check the new store against what the old ones hold.
	keys, err := verifyRescaled(ctx, o.Target, o, b.olds)
	if err != nil {
		return nil, err
	}
	rep := &engines.RescaleReport{Keys: keys, Verified: true, FetchMS: fetchMS, BuildMS: buildMS, VerifyMS: time.Since(t0).Milliseconds()}
	for _, t := range b.olds {
		for _, p := range t.pieces {
			t.c.Keys += p.keys
		}
		if err := t.sizeInRange(); err != nil {
			return nil, err
		}
		if t.c.Keys > 0 {
			t.c.Rewritten = t.rewrite
		}
		rep.Sources = append(rep.Sources, t.c)
	}
	return rep, nil
}

// HoldsKeys implements engines.Rescaler: a source holds keys in the range
// when a table of its MANIFEST meets the range (by its bounds: the tables
// themselves are not fetched) or its WAL holds a live key in it. Only the
// sources' private files are fetched.
func (Engine) HoldsKeys(ctx context.Context, o engines.RescaleRequest) ([]string, error) {
	cache := pebble.NewCache(8 << 20)
	defer cache.Unref()
	whys := make([]string, len(o.Sources))
	for i, s := range o.Sources {
		t := &oldTask{i: i, task: s.Task, src: s}
		why, err := t.holds(ctx, o, filepath.Join(o.Scratch, fmt.Sprintf("other-%d", i)), cache)
		if err != nil {
			return nil, err
		}
		whys[i] = why
	}
	return whys, nil
}

// holds says where the old store, fetched into dir (removed after), holds
// a key in the range; "" when it holds none.
func (t *oldTask) holds(ctx context.Context, o engines.RescaleRequest, dir string, cache *pebble.Cache) (string, error) {
	defer t.close()
	t.dir = dir
	if err := os.Mkdir(t.dir, 0o755); err != nil {
		return "", fmt.Errorf("rescale restore: %w", err)
	}
	defer os.RemoveAll(t.dir)
	if err := o.Fetch(ctx, t.private()); err != nil {
		return "", err
	}
	if err := t.plan(o, cache); err != nil {
		return "", err
	}
	for _, f := range t.tables {
		if strings.HasSuffix(f.Name, ".sst") {
			return "its table " + f.Name + " meets it", nil
		}
	}
	// No table meets the range: what the iterator finds there comes from
	// the WAL alone, and no table is read.
	it, err := t.db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: o.Start, UpperBound: o.End, KeyTypes: pebble.IterKeyTypePointsAndRanges})
	if err != nil {
		return "", fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
	}
	why := ""
	if it.First() {
		why = fmt.Sprintf("its WAL holds key %x", it.Key())
	}
	if err := it.Close(); err != nil {
		return "", fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
	}
	return why, nil
}

// private asks for the old task's private files, into its dir.
func (t *oldTask) private() []engines.FetchFile {
	var out []engines.FetchFile
	for _, f := range t.src.Files {
		if f.Kind != engines.Shared {
			out = append(out, engines.FetchFile{Source: t.i, Name: f.Name, Dir: t.dir})
		}
	}
	return out
}

// build is one rescale under way: the old stores, opened read-only in
// scratch, and the new store.
type build struct {
	o         engines.RescaleRequest
	olds      []*oldTask
	cache     *pebble.Cache
	db        *pebble.DB // the new store, while it is built
	ingestDir string
	procs     int
	// The rewritten tables hold only sets; the delta tables hold
	// deletions, which must not be written as if for the lowest level (a
	// tombstone there is marked obsolete, and hidden from readers).
	wopts, dopts sstable.WriterOptions
	ropts        sstable.ReaderOptions
}

func (b *build) close() {
	if b.db != nil {
		b.db.Close()
		b.db = nil
	}
	for _, t := range b.olds {
		t.close()
	}
	if b.cache != nil {
		b.cache.Unref()
		b.cache = nil
	}
}

// fetch fetches the private files of every old task, opens each from
// them to plan which tables meet the range, and fetches those tables and
// the blob files.
func (b *build) fetch(ctx context.Context) error {
	var files []engines.FetchFile
	for i, t := range b.olds {
		t.dir = filepath.Join(b.o.Scratch, fmt.Sprintf("old-%d", i))
		if err := os.Mkdir(t.dir, 0o755); err != nil {
			return fmt.Errorf("rescale restore: %w", err)
		}
		files = append(files, t.private()...)
	}
	if err := b.o.Fetch(ctx, files); err != nil {
		return err
	}
	files = nil
	for _, t := range b.olds {
		if err := t.plan(b.o, b.cache); err != nil {
			return err
		}
		for _, f := range t.tables {
			files = append(files, engines.FetchFile{Source: t.i, Name: f.Name, Dir: t.dir})
		}
	}
	return b.o.Fetch(ctx, files)
}

// create creates the new store. Its format supports virtual tables, so
// that the parts of clean tables outside the range can be excised.
func (b *build) create() error {
	fmv := pebble.FormatVirtualSSTables
	for _, t := range b.olds {
		fmv = max(fmv, t.db.FormatMajorVersion())
	}
	nopts := &pebble.Options{Logger: quiet{}, FormatMajorVersion: fmv, ErrorIfExists: true, Cache: b.cache}
	nopts.EnsureDefaults()
	db, err := pebble.Open(b.o.Target, nopts)
	if err != nil {
		return fmt.Errorf("rescale restore: create the new store in %s: %w", b.o.Target, err)
	}
	b.db = db
	b.ingestDir = filepath.Join(b.o.Scratch, "ingest")
	if err := os.Mkdir(b.ingestDir, 0o755); err != nil {
		return fmt.Errorf("rescale restore: %w", err)
	}
	b.wopts = nopts.MakeWriterOptions(6, db.TableFormat())
	b.dopts = nopts.MakeWriterOptions(0, db.TableFormat())
	b.ropts = nopts.MakeReaderOptions()
	return nil
}

// choose decides which tasks take the fast path and writes the overlay
// of those that do, the rewritten keys of those that do not. A fast task
// whose tables would meet another task's keys in the new store is
// rewritten instead.
func (b *build) choose(ctx context.Context) error {
	o, olds := b.o, b.olds
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(b.procs)
	for _, t := range olds {
		t.pieces = pieces([]*oldTask{t}, o, 2*b.procs)
		if t.rewrite == "" {
			g.Go(func() error { return t.inspect(gctx, o, b.ropts) })
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	demote(olds)
	for round := 0; ; round++ {
		if err := b.write(ctx, round); err != nil {
			return err
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
				return fmt.Errorf("rescale restore: tasks %s and %s both hold keys in the range (%x..%x and %x..%x): rescale needs old tasks that own disjoint key ranges",
					a.task, b.task, a.extent.lo, a.extent.hi, b.extent.lo, b.extent.hi)
			}
		}
	}
	return nil
}

// write writes, in one round of choose, the overlay of each fast task
// that has none yet and the rewritten keys of each slow task not yet
// rewritten.
func (b *build) write(ctx context.Context, round int) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(b.procs)
	for i, t := range b.olds {
		switch {
		case t.rewrite == "" && !t.overlaid:
			t.overlaid = true
			g.Go(func() error {
				return t.overlay(gctx, b.o, b.ropts, b.dopts, filepath.Join(b.ingestDir, fmt.Sprintf("d%d-%d", i, round)))
			})
		case t.rewrite != "" && !t.copied:
			t.copied = true
			for k, p := range t.pieces {
				g.Go(func() error {
					return p.copy(gctx, b.wopts, filepath.Join(b.ingestDir, fmt.Sprintf("p%d-%d", i, k)))
				})
			}
		}
	}
	return g.Wait()
}

// ingest ingests, per fast task, its clean tables unchanged, then its
// delta tables above them; then the rewritten tables; then excises what
// the clean tables hold outside the range.
func (b *build) ingest(ctx context.Context) error {
	o := b.o
	var below, above bool
	var highest []byte
	for i, t := range b.olds {
		if t.rewrite != "" {
			continue
		}
		var paths []string
		for _, tb := range t.clean {
			// Ingest links the file into the store and removes the path it
			// was given: give it a second link, the old store still reads
			// the first.
			p := filepath.Join(b.ingestDir, fmt.Sprintf("c%d-%s", i, tb.name))
			if err := os.Link(filepath.Join(t.dir, tb.name), p); err != nil {
				return fmt.Errorf("rescale restore: %w", err)
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
		if err := b.db.Ingest(ctx, paths); err != nil {
			return fmt.Errorf("rescale restore: ingest the tables of task %s: %w", t.task, err)
		}
		if len(t.delta) > 0 {
			if err := b.db.Ingest(ctx, t.delta); err != nil {
				return fmt.Errorf("rescale restore: ingest the overlay of task %s: %w", t.task, err)
			}
		}
	}
	var paths []string
	for _, t := range b.olds {
		if t.rewrite != "" {
			for _, p := range t.pieces {
				paths = append(paths, p.ssts...)
			}
		}
	}
	if len(paths) > 0 {
		if err := b.db.Ingest(ctx, paths); err != nil {
			return fmt.Errorf("rescale restore: ingest the new tables: %w", err)
		}
	}
	if below {
		if err := b.db.Excise(ctx, pebble.KeyRange{Start: []byte{}, End: o.Start}); err != nil {
			return fmt.Errorf("rescale restore: cut the keys below the range: %w", err)
		}
	}
	if above {
		if err := b.db.Excise(ctx, pebble.KeyRange{Start: o.End, End: keyAfter(highest)}); err != nil {
			return fmt.Errorf("rescale restore: cut the keys above the range: %w", err)
		}
	}
	return nil
}

// oldTask is one old task's checkpoint, opened read-only in scratch.
type oldTask struct {
	i    int // its index in the request's sources
	task string
	src  engines.RescaleSource
	dir  string
	db   *pebble.DB
	// tables are the shared files to fetch: the tables that meet the
	// range, and the blob files.
	tables []engines.SourceFile
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
	c        engines.SourceReport
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
func pieces(olds []*oldTask, o engines.RescaleRequest, n int) []*piece {
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

// plan opens the old store read-only from its private files alone and
// picks the tables whose key bounds meet the range.
func (t *oldTask) plan(o engines.RescaleRequest, cache *pebble.Cache) error {
	var absent []string
	byName := map[string]engines.SourceFile{}
	for _, f := range t.src.Files {
		if f.Kind == engines.Shared {
			absent = append(absent, f.Name)
			byName[f.Name] = f
		}
	}
	fs := &absentFS{FS: vfs.Default, dir: filepath.Clean(t.dir), absent: absent}
	db, err := pebble.Open(t.dir, &pebble.Options{ReadOnly: true, FS: fs, Logger: quiet{}, Cache: cache,
		DisableConsistencyCheck: true})
	if err != nil {
		return fmt.Errorf("rescale restore: open task %s checkpoint %d (is it a pebble store?): %w", t.task, t.src.Checkpoint, err)
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
				return fmt.Errorf("rescale restore: task %s checkpoint %d: its MANIFEST names table %s, which the checkpoint does not hold", t.task, t.src.Checkpoint, name)
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
	for _, f := range t.src.Files {
		if f.Kind == engines.Shared && (want[f.Name] || !strings.HasSuffix(f.Name, ".sst")) {
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
		return fmt.Errorf("rescale restore: read task %s checkpoint %d: %w", t.task, t.src.Checkpoint, err)
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
	t.c.First, t.c.Last = first, last
	est, err := t.db.EstimateDiskUsage(first, last)
	if err != nil {
		return fmt.Errorf("rescale restore: size of task %s's range: %w", t.task, err)
	}
	t.c.BytesInRange = int64(est)
	return nil
}
