package pebble

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/batchrepr"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/record"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ckpt-io/ckpt/engines"
)

// The fast path of a rescale restore. An old task's tables whose keys all
// carry sequence number zero (the MANIFEST's LargestSeqNum, not the
// table's first and last key, which is all Pebble's ingest looks at), and
// which hold no range deletions, range keys, merge operands or blob
// references, are "clean": Pebble resolves nothing inside them, so their
// keys are what the old store shows unless something newer covers them.
// Clean tables are ingested into the new store as they are (Pebble links
// them; their bytes stay those of the old objects, so the new task's first
// checkpoint reuses them), and the parts outside the range are excised.
// Everything newer (the other tables, the WAL the read-only open
// replayed) is the overlay: every user key it touches, and every clean key
// its range deletions cover, is looked up in the old store and written,
// with its visible value or as a deletion, into delta tables ingested
// after the clean ones, so that they win. A task whose overlay cannot be
// read this way (range keys, blob files, a WAL entry of another kind) has
// its keys rewritten, as the slow path always does.

// span is the key range [lo, hi); a nil lo is open below, a nil hi above.
type span struct{ lo, hi []byte }

// overlaps reports whether s and x share a key.
func (s span) overlaps(x span) bool {
	return (s.hi == nil || x.lo == nil || bytes.Compare(x.lo, s.hi) < 0) &&
		(x.hi == nil || s.lo == nil || bytes.Compare(s.lo, x.hi) < 0)
}

// clip returns s ∩ x and whether it holds a key.
func (s span) clip(x span) (span, bool) {
	out := s
	if x.lo != nil && (out.lo == nil || bytes.Compare(x.lo, out.lo) > 0) {
		out.lo = x.lo
	}
	if x.hi != nil && (out.hi == nil || bytes.Compare(x.hi, out.hi) < 0) {
		out.hi = x.hi
	}
	return out, out.lo == nil || out.hi == nil || bytes.Compare(out.lo, out.hi) < 0
}

// contains reports whether k lies in s.
func (s span) contains(k []byte) bool {
	return (s.lo == nil || bytes.Compare(k, s.lo) >= 0) && (s.hi == nil || bytes.Compare(k, s.hi) < 0)
}

// hull returns the smallest span holding s and x.
func (s span) hull(x span) span {
	out := s
	if out.lo != nil && (x.lo == nil || bytes.Compare(x.lo, out.lo) < 0) {
		out.lo = x.lo
	}
	if out.hi != nil && (x.hi == nil || bytes.Compare(x.hi, out.hi) > 0) {
		out.hi = x.hi
	}
	return out
}

// keyAfter returns the smallest key above k.
func keyAfter(k []byte) []byte { return append(slices.Clip(slices.Clone(k)), 0) }

// table is one table of an old task's MANIFEST that meets the range.
type table struct {
	name  string // the backing file: NNNNNN.sst
	info  pebble.SSTableInfo
	level int
}

func (tb *table) bounds() span {
	return span{tb.info.Smallest.UserKey, keyAfter(tb.info.Largest.UserKey)}
}

// classify splits the tables that meet the range into the clean
// candidates (sequence numbers all zero by the MANIFEST, physical, no blob
// references, and overlapping no other candidate: a user key then has at
// most one clean entry) and the rest. The tables' properties are checked
// once they are fetched (see inspect).
func (t *oldTask) classify(tables []*table) {
	var cand []*table
	for _, tb := range tables {
		if len(tb.info.GetBlobReferenceFiles()) > 0 {
			t.slow("its tables keep values in blob files")
		}
		if tb.info.LargestSeqNum == 0 && !tb.info.Virtual && len(tb.info.GetBlobReferenceFiles()) == 0 {
			cand = append(cand, tb)
		} else {
			t.dirty = append(t.dirty, tb)
		}
	}
	slices.SortFunc(cand, func(a, b *table) int { return bytes.Compare(a.info.Smallest.UserKey, b.info.Smallest.UserKey) })
	for i := 0; i < len(cand); {
		j, hi := i+1, cand[i].info.Largest.UserKey
		for j < len(cand) && bytes.Compare(cand[j].info.Smallest.UserKey, hi) <= 0 {
			if bytes.Compare(cand[j].info.Largest.UserKey, hi) > 0 {
				hi = cand[j].info.Largest.UserKey
			}
			j++
		}
		if j-i == 1 {
			t.clean = append(t.clean, cand[i])
		} else {
			t.dirty = append(t.dirty, cand[i:j]...)
		}
		i = j
	}
}

// slow sends the task down the slow path, for the reason why (the first
// one given is kept).
func (t *oldTask) slow(why string) {
	if t.rewrite == "" {
		t.rewrite = why
	}
}

// openTable opens one of the task's fetched tables.
func (t *oldTask) openTable(ctx context.Context, name string, ropts sstable.ReaderOptions) (*sstable.Reader, error) {
	path := filepath.Join(t.dir, name)
	f, err := vfs.Default.Open(path)
	if err != nil {
		return nil, err
	}
	readable, err := objstorageprovider.NewFileReadable(f, vfs.Default, objstorageprovider.NewReadaheadConfig(), path)
	if err != nil {
		f.Close()
		return nil, err
	}
	r, err := sstable.NewReader(ctx, readable, ropts)
	if err != nil {
		readable.Close()
		return nil, err
	}
	return r, nil
}

// inspect checks, once the tables are fetched, what classify could not:
// the clean candidates' properties, the range keys of the old store, and
// the WAL's entries. It sets the span of the new store where the task's
// keys may lie (t.extent), or sends the task down the slow path.
func (t *oldTask) inspect(ctx context.Context, o engines.RescaleRequest, ropts sstable.ReaderOptions) error {
	rng := span{o.Start, o.End}
	it, err := t.db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: o.Start, UpperBound: o.End, KeyTypes: pebble.IterKeyTypeRangesOnly})
	if err != nil {
		return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
	}
	hasRange := it.First()
	if err := it.Close(); err != nil {
		return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
	}
	if hasRange {
		t.slow("it holds range keys in the range")
	}
	clean := t.clean[:0]
	for _, tb := range t.clean {
		r, err := t.openTable(ctx, tb.name, ropts)
		if err != nil {
			return fmt.Errorf("rescale restore: table %s of task %s: %w", tb.name, t.task, err)
		}
		p, err := r.ReadPropertiesBlock(ctx, nil)
		r.Close()
		if err != nil {
			return fmt.Errorf("rescale restore: table %s of task %s: %w", tb.name, t.task, err)
		}
		if p.NumRangeDeletions+p.NumRangeKeySets+p.NumRangeKeyUnsets+p.NumRangeKeyDels+p.NumMergeOperands+p.NumValuesInBlobFiles == 0 {
			clean = append(clean, tb)
		} else {
			t.dirty = append(t.dirty, tb)
		}
	}
	t.clean = clean
	var cleanBytes, dirtyBytes uint64
	for _, tb := range t.clean {
		cleanBytes += tb.info.Size
	}
	for _, tb := range t.dirty {
		dirtyBytes += tb.info.Size
	}
	switch {
	case len(t.clean) == 0:
		t.slow("none of its tables in the range can be ingested unchanged")
	case cleanBytes < dirtyBytes:
		// Every key of the other tables is looked up: as dear as a rewrite.
		t.slow("most of its bytes in the range are in tables that carry sequence numbers")
	}
	for _, f := range t.src.Files {
		if f.Kind == engines.Shared || !strings.HasSuffix(f.Name, ".log") {
			continue
		}
		if err := t.readWAL(f.Name, rng); err != nil {
			var un unreadableWAL
			if errors.As(err, &un) {
				t.slow(string(un))
				continue
			}
			return fmt.Errorf("rescale restore: WAL %s of task %s: %w", f.Name, t.task, err)
		}
	}
	if t.rewrite != "" {
		return nil
	}
	var ext span
	first := true
	add := func(s span) {
		if s, ok := s.clip(rng); ok {
			if first {
				ext, first = s, false
			} else {
				ext = ext.hull(s)
			}
		}
	}
	for _, tb := range t.clean {
		add(tb.bounds())
	}
	for _, tb := range t.dirty {
		add(tb.bounds())
	}
	for _, k := range t.walKeys {
		add(span{k, keyAfter(k)})
	}
	for _, d := range t.walDels {
		add(d)
	}
	t.extent, t.keyed = ext, !first
	return nil
}

// setUint sets *dst, of an integer type the package cannot name, to x.
func setUint[T ~uint64](dst *T, x uint64) { *dst = T(x) }

// unreadableWAL is a WAL entry the overlay does not read: the task takes
// the slow path.
type unreadableWAL string

func (u unreadableWAL) Error() string { return string(u) }

// readWAL adds the user keys and range deletions of the WAL file name
// that meet rng to the overlay. It reads the file as Pebble's replay does,
// and ends where the replay ends (the first invalid record). Keys of
// batches already flushed to tables may be among them: the overlay only
// looks them up again.
func (t *oldTask) readWAL(name string, rng span) error {
	num, err := strconv.ParseUint(strings.TrimSuffix(name, ".log"), 10, 64)
	if err != nil {
		return unreadableWAL("its WAL " + name + " is not named NNNNNN.log")
	}
	f, err := os.Open(filepath.Join(t.dir, name))
	if err != nil {
		return err
	}
	defer f.Close()
	var logNum = pebble.SSTableInfo{}.BackingSSTNum // Pebble's DiskFileNum
	setUint(&logNum, num)
	rr := record.NewReader(f, logNum)
	for {
		r, err := rr.Next()
		if err == io.EOF || record.IsInvalidRecord(err) {
			return nil
		}
		if err != nil {
			return err
		}
		data, err := io.ReadAll(r)
		if record.IsInvalidRecord(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(data) < batchrepr.HeaderLen {
			return unreadableWAL("its WAL " + name + " holds a record that is not a batch")
		}
		br := batchrepr.Read(data)
		for {
			kind, k, v, ok, err := br.Next()
			if err != nil {
				return unreadableWAL(fmt.Sprintf("its WAL %s holds a batch that does not decode: %v", name, err))
			}
			if !ok {
				break
			}
			switch kind {
			case pebble.InternalKeyKindSet, pebble.InternalKeyKindMerge, pebble.InternalKeyKindDelete,
				pebble.InternalKeyKindSingleDelete, pebble.InternalKeyKindDeleteSized:
				if rng.contains(k) {
					t.walKeys = append(t.walKeys, slices.Clone(k))
				}
			case pebble.InternalKeyKindRangeDelete:
				if s, ok := (span{k, v}).clip(rng); ok {
					t.walDels = append(t.walDels, span{slices.Clone(s.lo), slices.Clone(s.hi)})
				}
			case pebble.InternalKeyKindLogData:
			default:
				return unreadableWAL(fmt.Sprintf("its WAL %s holds a %s entry", name, kind))
			}
		}
	}
}

// maxOverlayKeyBytes bounds the memory of one task's overlay keys; a
// larger overlay takes the slow path.
const maxOverlayKeyBytes = 512 << 20

// overlay writes the task's delta tables under prefix: for every user key
// in the range that a table other than the clean ones or the WAL touches,
// and every clean key that their range deletions cover, the old store's
// visible value (a Set) or its absence (a Delete). Ingested after the
// clean tables, they make the new store show what the old one shows.
func (t *oldTask) overlay(ctx context.Context, o engines.RescaleRequest, ropts sstable.ReaderOptions, wopts sstable.WriterOptions, prefix string) error {
	rng := span{o.Start, o.End}
	keys := slices.Clone(t.walKeys)
	dels := slices.Clone(t.walDels)
	var size int
	add := func(k []byte) error {
		if n := len(keys); n > 0 && bytes.Equal(keys[n-1], k) {
			return nil
		}
		size += len(k) + 24
		if size > maxOverlayKeyBytes {
			return errOverlayTooLarge
		}
		keys = append(keys, slices.Clone(k))
		return nil
	}
	done := map[string]bool{}
	for _, tb := range t.dirty {
		if done[tb.name] {
			continue
		}
		done[tb.name] = true
		if err := t.tableKeys(ctx, tb.name, ropts, rng, add, &dels); err != nil {
			if errors.Is(err, errOverlayTooLarge) {
				t.slow("its overlay is too large to hold in memory")
				return nil
			}
			return err
		}
	}
	// The clean keys under a range deletion of the overlay.
	for _, d := range dels {
		for _, tb := range t.clean {
			s, ok := tb.bounds().clip(d)
			if !ok {
				continue
			}
			if err := t.tableKeys(ctx, tb.name, ropts, s, add, nil); err != nil {
				if errors.Is(err, errOverlayTooLarge) {
					t.slow("its overlay is too large to hold in memory")
					return nil
				}
				return err
			}
		}
	}
	slices.SortFunc(keys, bytes.Compare)
	keys = slices.CompactFunc(keys, bytes.Equal)
	it, err := t.db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: o.Start, UpperBound: o.End})
	if err != nil {
		return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
	}
	defer it.Close()
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
	for i, k := range keys {
		if i%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if w != nil && w.Raw().EstimatedSize() >= maxTableBytes {
			if err := finish(); err != nil {
				return fmt.Errorf("rescale restore: write a delta table: %w", err)
			}
		}
		if w == nil {
			name := fmt.Sprintf("%s-%06d.sst", prefix, len(t.delta))
			f, err := vfs.Default.Create(name, vfs.WriteCategoryUnspecified)
			if err != nil {
				return fmt.Errorf("rescale restore: %w", err)
			}
			w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), wopts)
			t.delta = append(t.delta, name)
		}
		var werr error
		if it.SeekGE(k) && bytes.Equal(it.Key(), k) {
			v, err := it.ValueAndErr()
			if err != nil {
				return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
			}
			werr = w.Set(k, v)
		} else {
			if err := it.Error(); err != nil {
				return fmt.Errorf("rescale restore: read task %s: %w", t.task, err)
			}
			werr = w.Delete(k)
		}
		if err := werr; err != nil {
			return fmt.Errorf("rescale restore: write a delta table: %w", err)
		}
		t.c.DeltaKeys++
	}
	if err := finish(); err != nil {
		return fmt.Errorf("rescale restore: write a delta table: %w", err)
	}
	return nil
}

var errOverlayTooLarge = errors.New("overlay too large")

// tableKeys calls add with the user keys of the point entries of the
// fetched table name in s, in order, and, when dels is not nil, appends
// its range deletions (clipped to s) to dels. A virtual table's backing
// is read whole: keys outside the virtual bounds are only looked up.
func (t *oldTask) tableKeys(ctx context.Context, name string, ropts sstable.ReaderOptions, s span, add func([]byte) error, dels *[]span) error {
	r, err := t.openTable(ctx, name, ropts)
	if err != nil {
		return fmt.Errorf("rescale restore: table %s of task %s: %w", name, t.task, err)
	}
	defer r.Close()
	fail := func(err error) error {
		return fmt.Errorf("rescale restore: read table %s of task %s: %w", name, t.task, err)
	}
	it, err := r.NewIter(sstable.NoTransforms, s.lo, s.hi, sstable.AssertNoBlobHandles)
	if err != nil {
		return fail(err)
	}
	n := 0
	lo := s.lo
	if lo == nil {
		lo = []byte{} // the smallest key
	}
	for kv := it.SeekGE(lo, 0); kv != nil; kv = it.Next() {
		if n++; n%4096 == 0 && ctx.Err() != nil {
			it.Close()
			return ctx.Err()
		}
		if s.hi != nil && bytes.Compare(kv.K.UserKey, s.hi) >= 0 {
			break
		}
		if err := add(kv.K.UserKey); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Error(); err != nil {
		it.Close()
		return fail(err)
	}
	if err := it.Close(); err != nil {
		return fail(err)
	}
	if dels == nil {
		return nil
	}
	ri, err := r.NewRawRangeDelIter(ctx, sstable.NoFragmentTransforms, sstable.NoReadEnv)
	if err != nil || ri == nil {
		if err != nil {
			return fail(err)
		}
		return nil
	}
	defer ri.Close()
	sp, err := ri.First()
	for ; sp != nil && err == nil; sp, err = ri.Next() {
		if c, ok := (span{sp.Start, sp.End}).clip(s); ok {
			*dels = append(*dels, span{slices.Clone(c.lo), slices.Clone(c.hi)})
		}
	}
	if err != nil {
		return fail(err)
	}
	return nil
}

// demote sends down the slow path every fast task whose extent overlaps
// another task's (a fast one before it in From, or any slow one whose
// keys are known): their files would shadow each other's keys in the new
// store. It reports whether it demoted any.
func demote(olds []*oldTask) bool {
	changed := false
	for i, a := range olds {
		if a.rewrite != "" {
			continue
		}
		for j, b := range olds {
			if i == j || !b.keyed || (b.rewrite == "" && j > i) {
				continue
			}
			if a.extent.overlaps(b.extent) {
				a.slow(fmt.Sprintf("its tables overlap those of task %s in the range", b.task))
				a.keyed = false
				changed = true
				break
			}
		}
	}
	return changed
}
