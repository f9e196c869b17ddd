// Package workload drives a keyed-state workload on a real Pebble store and
// keeps a compact model of the state it wrote, so that a store restored from
// any past checkpoint can be verified key by key.
//
// The workload is deterministic from its seed: the same options produce the
// same sequence of puts and deletes, and every value is a pure function of
// (seed, key id, version). The model therefore stores only one version
// counter per key id ever allocated (4 bytes each), not the values: an
// Expected snapshot of a 64 MiB state with 1 KiB values costs about 256 KiB.
//
// Each Round overwrites a share of the live keys, deletes some and inserts
// new ones. By default the state behaves like keyed state with a time to
// live (sessions, windows): new keys arrive in key order, the most recent
// keys take most of the updates, and the oldest expire. With Scatter, keys
// are spread over the key space the way hash-partitioned state is, and
// updates and deletes hit any key alike, which makes every compaction touch
// the whole tree. With the small memtable and L0 thresholds PebbleOptions
// sets, a demo-sized run flushes and compacts for real, which is what makes
// incremental checkpoint sizes interesting.
package workload

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Options configures a workload. Zero values take the documented defaults.
type Options struct {
	// Seed makes the workload reproducible (default 1).
	Seed uint64
	// StateBytes is the live value bytes the workload keeps the store near
	// (default 48 MiB). The first Round loads it; later rounds hold it steady.
	StateBytes int64
	// ValueSize is the size of every value in bytes (default 1024, at least 16).
	ValueSize int
	// Churn is the fraction of live keys overwritten per round (default 0.04).
	Churn float64
	// DeleteFraction is the fraction of live keys deleted per round, each
	// replaced by a new key (default Churn/4). Deletes take the oldest keys,
	// or random ones with Scatter.
	DeleteFraction float64
	// HotFraction and HotShare skew the overwrites: HotShare of them go to
	// the newest HotFraction of the keys (defaults 0.1 and 0.9), the rest
	// to any live key. Ignored with Scatter.
	HotFraction, HotShare float64
	// Scatter spreads keys over the key space and picks keys to overwrite
	// and delete uniformly.
	Scatter bool
	// BatchSize is the number of operations per committed batch (default 256).
	BatchSize int
	// MemTableSize is Pebble's memtable size (default 4 MiB): small, so that
	// demo-sized rounds flush.
	MemTableSize uint64
}

func (o *Options) defaults() error {
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.StateBytes == 0 {
		o.StateBytes = 48 << 20
	}
	if o.ValueSize == 0 {
		o.ValueSize = 1024
	}
	if o.Churn == 0 {
		o.Churn = 0.04
	}
	if o.DeleteFraction == 0 {
		o.DeleteFraction = o.Churn / 4
	}
	if o.HotFraction == 0 {
		o.HotFraction = 0.1
	}
	if o.HotShare == 0 {
		o.HotShare = 0.9
	}
	if o.BatchSize == 0 {
		o.BatchSize = 256
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = 4 << 20
	}
	switch {
	case o.StateBytes < 0:
		return fmt.Errorf("state bytes must not be negative, got %d", o.StateBytes)
	case o.ValueSize < headerSize:
		return fmt.Errorf("value size must be at least %d bytes, got %d", headerSize, o.ValueSize)
	case o.Churn < 0 || o.Churn > 1:
		return fmt.Errorf("churn must be in [0, 1], got %g", o.Churn)
	case o.DeleteFraction < 0 || o.DeleteFraction > 1:
		return fmt.Errorf("delete fraction must be in [0, 1], got %g", o.DeleteFraction)
	case o.HotFraction < 0 || o.HotFraction > 1 || o.HotShare < 0 || o.HotShare > 1:
		return fmt.Errorf("hot fraction and hot share must be in [0, 1], got %g and %g", o.HotFraction, o.HotShare)
	case o.BatchSize < 1:
		return fmt.Errorf("batch size must be at least 1, got %d", o.BatchSize)
	}
	return nil
}

// PebbleOptions returns the Pebble options the workload opens its store
// with; open a restored copy with the same ones. The memtable is small
// (memTableSize, 4 MiB if 0), L0 compacts at a read amplification of 2,
// Lbase holds 4 MiB and every level aims at 1 MiB files, so a few tens of
// MiB already make a multi-level tree of many files, and a compaction
// rewrites only the files it touches: the proportions of a production store
// (64 MiB files, hundreds of GiB), scaled down. The MANIFEST is scaled down
// with them: 1 MiB files log 64 times as many version edits per byte written
// as 64 MiB ones, so Pebble's 128 MiB limit becomes 2 MiB. Unscaled, a few
// minutes of writes flat out grew it to several MB, which every Pebble
// checkpoint copies and fsyncs and every ckpt checkpoint ships (it is a
// private file). The logger is quiet: WAL replay and compaction lines never
// reach stderr.
func PebbleOptions(memTableSize uint64) *pebble.Options {
	if memTableSize == 0 {
		memTableSize = 4 << 20
	}
	o := &pebble.Options{
		MemTableSize:          memTableSize,
		L0CompactionThreshold: 2,
		L0StopWritesThreshold: 16,
		LBaseMaxBytes:         4 << 20,
		MaxManifestFileSize:   2 << 20,
		Logger:                quietLogger{},
	}
	for i := range o.TargetFileSizes {
		o.TargetFileSizes[i] = 1 << 20
	}
	return o
}

// quietLogger drops Pebble's informational and error lines; a fatal error
// panics rather than exiting the process, as Pebble's default logger would.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("pebble: "+format, args...))
}

// Stats counts what a workload has done so far.
type Stats struct {
	Rounds  int           // completed rounds
	Puts    int64         // inserts and overwrites
	Deletes int64         // point deletes
	Elapsed time.Duration // time spent inside Round
	Keys    int           // live keys now
	// StateBytes is the logical size of the live state: keys plus values.
	StateBytes int64
}

// Writes is the number of write operations (puts and deletes).
func (s Stats) Writes() int64 { return s.Puts + s.Deletes }

// WritesPerSecond is the write rate over the time spent in rounds.
func (s Stats) WritesPerSecond() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Writes()) / s.Elapsed.Seconds()
}

// RoundStats describes one round.
type RoundStats struct {
	Round      int
	Inserts    int
	Overwrites int
	Deletes    int
	Elapsed    time.Duration
}

// Writes is the number of write operations of the round.
func (r RoundStats) Writes() int { return r.Inserts + r.Overwrites + r.Deletes }

// Workload is a keyed-state workload on one open Pebble store. It is not
// safe for concurrent use; Snapshot handles are immutable and may be shared.
type Workload struct {
	opts Options
	dir  string
	db   *pebble.DB

	// versions[id] is the number of puts key id has seen; 0 means absent.
	// Ids are never reused, so a deleted key stays 0 for good.
	versions []uint32
	live     []uint32 // live ids, in no particular order
	pos      []int32  // pos[id] is id's index in live, or -1
	oldest   uint32   // no id below it is live
	stats    Stats
	val      []byte

	// stalls counts Pebble's write stalls (writes held back while flushes
	// or compactions catch up) and their total time in nanoseconds.
	stalls, stallNanos atomic.Int64
	stallBegan         atomic.Int64 // unix nanoseconds, 0 when not stalled
}

// Open creates a Pebble store in dir (which must not hold one already, or
// hold an empty one) and returns a workload on it.
func Open(dir string, opts Options) (*Workload, error) {
	if err := opts.defaults(); err != nil {
		return nil, fmt.Errorf("workload options: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("workload dir: %w", err)
	}
	w := &Workload{opts: opts, dir: dir, val: make([]byte, opts.ValueSize)}
	po := PebbleOptions(opts.MemTableSize)
	po.EventListener = &pebble.EventListener{
		WriteStallBegin: func(pebble.WriteStallBeginInfo) {
			w.stalls.Add(1)
			w.stallBegan.Store(time.Now().UnixNano())
		},
		WriteStallEnd: func() {
			if t := w.stallBegan.Swap(0); t != 0 {
				w.stallNanos.Add(time.Now().UnixNano() - t)
			}
		},
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("open pebble store %s: %w", dir, err)
	}
	it, err := db.NewIter(nil)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open pebble store %s: %w", dir, err)
	}
	nonEmpty := it.First()
	it.Close()
	if nonEmpty {
		db.Close()
		return nil, fmt.Errorf("pebble store %s is not empty: the workload needs a new store to model it", dir)
	}
	w.db = db
	return w, nil
}

// Stalls returns how many write stalls Pebble has had and their total time
// (a stall in progress counts up to now).
func (w *Workload) Stalls() (int64, time.Duration) {
	d := w.stallNanos.Load()
	if t := w.stallBegan.Load(); t != 0 {
		d += time.Now().UnixNano() - t
	}
	return w.stalls.Load(), time.Duration(d)
}

// Close closes the store. The model stays usable through earlier snapshots.
func (w *Workload) Close() error {
	if w.db == nil {
		return nil
	}
	err := w.db.Close()
	w.db = nil
	if err != nil {
		return fmt.Errorf("close pebble store: %w", err)
	}
	return nil
}

// DB returns the open store (nil after Close).
func (w *Workload) DB() *pebble.DB { return w.db }

// Dir returns the store's directory.
func (w *Workload) Dir() string { return w.dir }

// Options returns the options in effect, defaults filled in.
func (w *Workload) Options() Options { return w.opts }

// Stats returns the counts so far.
func (w *Workload) Stats() Stats {
	s := w.stats
	s.Keys = len(w.live)
	s.StateBytes = int64(len(w.live)) * int64(keySize+w.opts.ValueSize)
	return s
}

// targetKeys is the number of live keys StateBytes calls for.
func (w *Workload) targetKeys() int {
	n := w.opts.StateBytes / int64(w.opts.ValueSize)
	if n < 1 {
		n = 1
	}
	return int(n)
}

// Round applies one round of changes: it overwrites Churn of the live keys,
// deletes DeleteFraction of them, and inserts as many new keys as it deleted
// plus whatever the state lacks of StateBytes (so the first round is the
// initial load). Writes go in batches without fsync: durability is the
// checkpoint's business. The model is updated batch by batch, after each
// batch commits, so a cancelled round leaves model and store in agreement.
func (w *Workload) Round(ctx context.Context) (RoundStats, error) {
	if w.db == nil {
		return RoundStats{}, errors.New("workload: store is closed")
	}
	start := time.Now()
	round := w.stats.Rounds + 1
	rs := RoundStats{Round: round}
	rng := rand.New(rand.NewPCG(w.opts.Seed, uint64(round)))

	n := len(w.live)
	overwrites := int(float64(n) * w.opts.Churn)
	deletes := int(float64(n) * w.opts.DeleteFraction)
	inserts := deletes
	if t := w.targetKeys(); n < t {
		inserts += t - n
	}

	// Interleave the three kinds the way a stream of updates would.
	ops := make([]byte, 0, overwrites+deletes+inserts)
	for range overwrites {
		ops = append(ops, 'o')
	}
	for range deletes {
		ops = append(ops, 'd')
	}
	for range inserts {
		ops = append(ops, 'i')
	}
	rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })

	type change struct {
		id      uint32
		version uint32 // 0: delete
	}
	b := w.db.NewBatch()
	defer func() { b.Close() }()
	var pending []change
	// next holds versions written in this batch but not yet committed, so
	// that two puts of one key in one batch get distinct versions.
	next := map[uint32]uint32{}
	key := make([]byte, keySize)
	commit := func() error {
		if b.Empty() {
			return nil
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return fmt.Errorf("commit batch: %w", err)
		}
		for _, c := range pending {
			w.apply(c.id, c.version)
		}
		pending = pending[:0]
		clear(next)
		b.Close()
		b = w.db.NewBatch()
		return nil
	}
	// pick returns a live id to overwrite or delete, seeing this batch's
	// deletes as done.
	deleted := map[uint32]bool{}
	pick := func(forDelete bool) (uint32, bool) {
		if len(w.live) == 0 {
			return 0, false
		}
		if forDelete && !w.opts.Scatter {
			id := w.oldest
			for int(id) < len(w.versions) && (w.versions[id] == 0 || deleted[id]) {
				id++
			}
			return id, int(id) < len(w.versions)
		}
		for range 16 {
			id := w.live[rng.IntN(len(w.live))]
			if !forDelete && !w.opts.Scatter && rng.Float64() < w.opts.HotShare {
				hot := max(1, int(float64(len(w.live))*w.opts.HotFraction))
				id = uint32(len(w.versions) - 1 - rng.IntN(hot))
			}
			if w.versions[id] != 0 && !deleted[id] {
				return id, true
			}
		}
		return 0, false
	}
	for i, op := range ops {
		if i%w.opts.BatchSize == 0 {
			if err := ctx.Err(); err != nil {
				return rs, err
			}
		}
		switch op {
		case 'i':
			id := w.alloc()
			w.keys().encode(key, id)
			value(w.val, w.opts.Seed, id, 1)
			if err := b.Set(key, w.val, nil); err != nil {
				return rs, fmt.Errorf("put: %w", err)
			}
			pending = append(pending, change{id, 1})
			next[id] = 1
			rs.Inserts++
		case 'o':
			id, ok := pick(false)
			if !ok {
				continue
			}
			v, seen := next[id]
			if !seen {
				v = w.versions[id]
			}
			v++
			w.keys().encode(key, id)
			value(w.val, w.opts.Seed, id, v)
			if err := b.Set(key, w.val, nil); err != nil {
				return rs, fmt.Errorf("put: %w", err)
			}
			pending = append(pending, change{id, v})
			next[id] = v
			rs.Overwrites++
		case 'd':
			id, ok := pick(true)
			if !ok {
				continue
			}
			w.keys().encode(key, id)
			if err := b.Delete(key, nil); err != nil {
				return rs, fmt.Errorf("delete: %w", err)
			}
			pending = append(pending, change{id, 0})
			deleted[id] = true
			rs.Deletes++
		}
		if len(pending) >= w.opts.BatchSize {
			if err := commit(); err != nil {
				return rs, err
			}
			clear(deleted)
		}
	}
	if err := commit(); err != nil {
		return rs, err
	}
	rs.Elapsed = time.Since(start)
	w.stats.Rounds++
	w.stats.Puts += int64(rs.Inserts + rs.Overwrites)
	w.stats.Deletes += int64(rs.Deletes)
	w.stats.Elapsed += rs.Elapsed
	return rs, nil
}

// alloc reserves a new key id; it becomes live when its put commits.
func (w *Workload) alloc() uint32 {
	id := uint32(len(w.versions))
	w.versions = append(w.versions, 0)
	w.pos = append(w.pos, -1)
	return id
}

// apply records a committed put (version > 0) or delete (version 0).
func (w *Workload) apply(id, version uint32) {
	w.versions[id] = version
	p := w.pos[id]
	switch {
	case version > 0 && p < 0:
		w.pos[id] = int32(len(w.live))
		w.live = append(w.live, id)
	case version == 0 && p >= 0:
		if id == w.oldest {
			w.oldest++
		}
		last := w.live[len(w.live)-1]
		w.live[p] = last
		w.pos[last] = p
		w.live = w.live[:len(w.live)-1]
		w.pos[id] = -1
	}
}

// Snapshot returns the expected state as of now: an immutable handle that
// Verify checks a store against. It copies one counter per key id ever
// allocated (4 bytes each).
func (w *Workload) Snapshot() *Expected {
	return &Expected{
		seed:      w.opts.Seed,
		keyer:     w.keys(),
		valueSize: w.opts.ValueSize,
		versions:  append([]uint32(nil), w.versions...),
		keys:      len(w.live),
		round:     w.stats.Rounds,
	}
}

// Expected is the state a store must hold at one moment of the workload.
type Expected struct {
	seed      uint64
	keyer     keyer
	valueSize int
	versions  []uint32
	keys      int
	round     int
}

// Keys is the number of keys the state holds.
func (e *Expected) Keys() int { return e.keys }

// Round is the number of rounds applied when the snapshot was taken.
func (e *Expected) Round() int { return e.round }

// Bytes is the logical size of the state: keys plus values.
func (e *Expected) Bytes() int64 { return int64(e.keys) * int64(keySize+e.valueSize) }

// Keys look like "k/" followed by 16 hex digits: the key id, so that new
// keys sort last, or with Scatter a bijective scramble of it, so that new
// keys land all over the key space.
const (
	keyPrefix = "k/"
	keySize   = len(keyPrefix) + 16
	scrambleK = 0x9e3779b97f4a7c15 // odd, so multiplication by it is invertible
)

// scrambleInv is the inverse of scrambleK modulo 2^64 (Newton's iteration).
var scrambleInv = func() uint64 {
	x := uint64(scrambleK)
	for range 6 {
		x *= 2 - scrambleK*x
	}
	return x
}()

func mask(seed uint64) uint64 { return mix(seed ^ 0x5bd1e9955bd1e995) }

const hexDigits = "0123456789abcdef"

// keyer maps key ids to keys and back.
type keyer struct {
	seed    uint64
	scatter bool
}

func (w *Workload) keys() keyer { return keyer{w.opts.Seed, w.opts.Scatter} }

// encode writes the key of id into key (keySize bytes).
func (k keyer) encode(key []byte, id uint32) {
	s := uint64(id)
	if k.scatter {
		s = s*scrambleK ^ mask(k.seed)
	}
	copy(key, keyPrefix)
	for i := 15; i >= 0; i-- {
		key[len(keyPrefix)+i] = hexDigits[s&15]
		s >>= 4
	}
}

// decode returns the id a key names, or false if it is not a workload key.
func (k keyer) decode(key []byte) (uint32, bool) {
	if len(key) != keySize || string(key[:len(keyPrefix)]) != keyPrefix {
		return 0, false
	}
	var s uint64
	for _, c := range key[len(keyPrefix):] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		default:
			return 0, false
		}
		s = s<<4 | uint64(d)
	}
	id := s
	if k.scatter {
		id = (s ^ mask(k.seed)) * scrambleInv
	}
	if id > 1<<32-1 {
		return 0, false
	}
	return uint32(id), true
}

// A value starts with a header (key id, version) that makes a wrong value
// easy to explain, followed by bytes derived from (seed, id, version).
const headerSize = 12

// value fills v with the value of version of key id.
func value(v []byte, seed uint64, id, version uint32) {
	binary.LittleEndian.PutUint64(v, uint64(id))
	binary.LittleEndian.PutUint32(v[8:], version)
	s := mix(seed ^ uint64(id)<<32 ^ uint64(version))
	rest := v[headerSize:]
	for len(rest) >= 8 {
		s += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(rest, mix(s))
		rest = rest[8:]
	}
	if len(rest) > 0 {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], mix(s+0x9e3779b97f4a7c15))
		copy(rest, tail[:])
	}
}

// mix is splitmix64's finalizer.
func mix(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// LSMStats are Pebble's running totals of background work on the store.
type LSMStats struct {
	Flushes        int64  // memtable flushes
	Compactions    int64  // compactions of every kind
	FlushedBytes   uint64 // sstable bytes written by flushes
	CompactedBytes uint64 // sstable bytes written by compactions (rewrites)
	Tables         int64  // live sstables
	TablesBytes    int64  // live sstable bytes
}

// LSM returns the store's flush and compaction totals (zero after Close).
func (w *Workload) LSM() LSMStats {
	if w.db == nil {
		return LSMStats{}
	}
	m := w.db.Metrics()
	s := LSMStats{Flushes: m.Flush.Count, Compactions: m.Compact.Count}
	for _, l := range m.Levels {
		s.FlushedBytes += l.TableBytesFlushed
		s.CompactedBytes += l.TableBytesCompacted
		s.Tables += l.TablesCount
		s.TablesBytes += l.TablesSize
	}
	return s
}
