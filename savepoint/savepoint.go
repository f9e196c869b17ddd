// Package savepoint writes and reads savepoints: self-contained copies of
// a checkpoint (or of every task of a job-complete checkpoint) in storage
// of their own, which no retention or GC of the job ever touches.
//
// A savepoint at a storage URL holds, under the same keys as in the job's
// storage, every object the chosen manifests reference and the manifests
// themselves (byte for byte, so their checksums still hold), and, written
// last, its own record at Key:
//
//	savepoint.json                                      written last: the savepoint exists iff it does
//	<job>/shared/<hh>/<content id>                      copies of the shared objects
//	<job>/tasks/<task>/chk/<N:020>/manifest[.e<epoch>]  copies of the manifests
//	<job>/tasks/<task>/chk/<N:020>/private[.e<epoch>]/<name>
//	<job>/tasks/<task>/chk/<N:020>/wal[.e<epoch>]/...       with --with-wal: the checkpoint's WAL chain
//
// With WithWAL, the WAL a restore of the checkpoint to latest would use
// (wal.UsableChain: its owner's, up to where a newer owner resumed) is
// copied too, segments first, then its manifests byte for byte: a restore
// of the savepoint to latest applies it.
// No ownership record is copied: the savepoint holds one manifest per task,
// the one that was valid in the job when it was taken, so a restore reads it
// as the job's storage would have. Every object is verified by its SHA-256
// twice: as it is read from the job's storage (or, copied server-side, once
// read back), and read back from the savepoint's storage.
package savepoint

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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/wal"
)

// Key is where a savepoint's record lives in its storage.
const Key = "savepoint.json"

// FormatVersion is the format of the record this package writes.
const FormatVersion = 1

// maxRecordBytes bounds a record read from storage (it lists a manifest per
// task, at most manifests.MaxJobTasks).
const maxRecordBytes = 4 << 20

// ErrExists is returned when the target already holds a savepoint and
// Options.Overwrite is not set.
var ErrExists = errors.New("the target already holds a savepoint")

// Origin names what a savepoint was taken from.
type Origin struct {
	// Storage is the job's storage (a URL without secrets).
	Storage    string `json:"storage"`
	Job        string `json:"job"`
	Task       string `json:"task"`
	Checkpoint uint64 `json:"checkpoint"`
	// Created is when the checkpoint was committed.
	Created time.Time `json:"created"`
}

// Entry is one task's checkpoint in a savepoint.
type Entry struct {
	Task string `json:"task"`
	// Manifest is the manifest's key; ManifestSHA256 the SHA-256 of its
	// stored bytes, so that a savepoint whose manifest was replaced does
	// not verify.
	Manifest       string `json:"manifest"`
	ManifestSHA256 string `json:"manifest_sha256"`
	Files          int    `json:"files"`
	FullSize       int64  `json:"full_size"`
	// WALManifests is the number of WAL manifests saved with the
	// checkpoint (--with-wal), WALThroughUnixMs the last one's through
	// time.
	WALManifests     int   `json:"wal_manifests,omitempty"`
	WALThroughUnixMs int64 `json:"wal_through_unix_ms,omitempty"`
}

// Record is a savepoint's own manifest.
type Record struct {
	Origin Origin `json:"origin"`
	// Job and Checkpoint are the job and the checkpoint number of every
	// entry; JobConsistent is set when the entries are every task of a
	// job-complete checkpoint.
	Job           string    `json:"job"`
	Checkpoint    uint64    `json:"checkpoint"`
	JobConsistent bool      `json:"job_consistent,omitempty"`
	Tasks         []Entry   `json:"tasks"`
	Objects       int       `json:"objects"`
	Bytes         int64     `json:"bytes"`
	Taken         time.Time `json:"taken"`
}

// Entry returns the entry of task, or an error naming the tasks there are.
// An empty task picks the only one.
func (r *Record) Entry(task string) (Entry, error) {
	if task == "" {
		if len(r.Tasks) == 1 {
			return r.Tasks[0], nil
		}
		return Entry{}, fmt.Errorf("the savepoint holds %d tasks (%s): name one with --task", len(r.Tasks), r.taskNames())
	}
	for _, e := range r.Tasks {
		if e.Task == task {
			return e, nil
		}
	}
	return Entry{}, fmt.Errorf("the savepoint holds no task %s (it holds %s)", task, r.taskNames())
}

func (r *Record) taskNames() string {
	n := make([]string, len(r.Tasks))
	for i, e := range r.Tasks {
		n[i] = e.Task
	}
	return strings.Join(n, ", ")
}

// envelope is the stored form, checksummed like a manifest's.
type envelope struct {
	Format int             `json:"format"`
	Kind   string          `json:"kind"`
	SHA256 string          `json:"sha256"`
	Body   json.RawMessage `json:"body"`
}

const kind = "ckpt-savepoint"

func encode(r *Record) ([]byte, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	return json.Marshal(envelope{Format: FormatVersion, Kind: kind, SHA256: hex.EncodeToString(sum[:]), Body: body})
}

// decode parses and checks a stored record. Storage is not trusted: a
// record that fails any check is an error, never a panic.
func decode(data []byte) (*Record, error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("not a savepoint record: %w", err)
	}
	if env.Kind != kind {
		return nil, fmt.Errorf("not a savepoint record (kind %q)", env.Kind)
	}
	if env.Format != FormatVersion {
		return nil, fmt.Errorf("savepoint format %d: this ckpt reads format %d; use a ckpt that knows it", env.Format, FormatVersion)
	}
	sum := sha256.Sum256(env.Body)
	if hex.EncodeToString(sum[:]) != env.SHA256 {
		return nil, errors.New("savepoint record checksum mismatch: the record is damaged")
	}
	var r Record
	if err := json.Unmarshal(env.Body, &r); err != nil {
		return nil, fmt.Errorf("savepoint record body: %w", err)
	}
	if err := manifests.ValidName("job", r.Job); err != nil {
		return nil, fmt.Errorf("savepoint record: %w", err)
	}
	if r.Checkpoint == 0 || len(r.Tasks) == 0 || len(r.Tasks) > manifests.MaxJobTasks {
		return nil, fmt.Errorf("savepoint record: checkpoint %d with %d tasks is not a savepoint", r.Checkpoint, len(r.Tasks))
	}
	for _, e := range r.Tasks {
		if err := manifests.ValidName("task", e.Task); err != nil {
			return nil, fmt.Errorf("savepoint record: %w", err)
		}
		if !strings.HasPrefix(e.Manifest, manifests.CheckpointPrefix(r.Job, e.Task, r.Checkpoint)) || storage.ValidKey(e.Manifest) != nil {
			return nil, fmt.Errorf("savepoint record: task %s: manifest key %q is not checkpoint %d's", e.Task, e.Manifest, r.Checkpoint)
		}
	}
	return &r, nil
}

// Read reads the savepoint record in s and checks it and every manifest it
// names (the manifests' stored bytes against the record's SHA-256, then
// the manifests themselves). A target with no record holds no savepoint:
// the error wraps storage.ErrNotFound.
func Read(ctx context.Context, s storage.Store) (*Record, error) {
	data, err := readAll(ctx, s, Key, maxRecordBytes)
	if err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil, fmt.Errorf("%s holds no savepoint (no %s): %w", s, Key, err)
		}
		return nil, fmt.Errorf("read savepoint in %s: %w", s, err)
	}
	r, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("savepoint in %s: %w", s, err)
	}
	for _, e := range r.Tasks {
		b, err := readAll(ctx, s, e.Manifest, manifests.MaxManifestBytes)
		if err != nil {
			return nil, fmt.Errorf("savepoint in %s: task %s: %w", s, e.Task, err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != e.ManifestSHA256 {
			return nil, fmt.Errorf("savepoint in %s: task %s: manifest %s does not match the savepoint's record: it was replaced or damaged", s, e.Task, e.Manifest)
		}
		m, err := manifests.Decode(b)
		if err != nil {
			return nil, fmt.Errorf("savepoint in %s: task %s: %w", s, e.Task, err)
		}
		if m.Job != r.Job || m.Task != e.Task || m.Checkpoint != r.Checkpoint {
			return nil, fmt.Errorf("savepoint in %s: manifest %s is of %s/%s checkpoint %d, not of the record's task", s, e.Manifest, m.Job, m.Task, m.Checkpoint)
		}
	}
	return r, nil
}

// Options says what to save where.
type Options struct {
	// Source is the job's storage; Job and Task the checkpoint's.
	Source    storage.Store
	Job, Task string
	// Checkpoint picks the checkpoint (0: the newest complete one).
	Checkpoint uint64
	// JobConsistent saves every task of the newest job-complete checkpoint
	// of Task (not with Checkpoint).
	JobConsistent bool
	// Target is the savepoint's storage: another prefix, bucket or backend.
	Target storage.Store
	// Overwrite replaces a savepoint already in Target; without it, one
	// there is ErrExists and nothing is written.
	Overwrite bool
	// Concurrency bounds the objects copied at once (default 8).
	Concurrency int
	// TempDir holds the bodies streamed between backends (default: the
	// system temp dir).
	TempDir string
	// WithWAL copies the checkpoint's WAL chain with it (not with
	// JobConsistent: a WAL extends one task past the job-wide point).
	WithWAL bool
}

// Result is what Create did. Its JSON is `ckpt savepoint --json`'s.
type Result struct {
	Savepoint  string `json:"savepoint"`
	Job        string `json:"job"`
	Checkpoint uint64 `json:"checkpoint"`
	// Tasks is the number of tasks saved; TaskNames names them.
	Tasks     int      `json:"tasks"`
	TaskNames []string `json:"task_names"`
	// Files is the number of files of the saved checkpoints, Bytes their
	// size (what a restore of every task fetches).
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// Objects is the number of distinct objects copied; CopiedServerSide
	// how many of them the target's service copied itself, and Reused how
	// many were found in the target already, verified, and kept.
	Objects          int   `json:"objects"`
	CopiedServerSide int   `json:"copied_server_side"`
	Reused           int   `json:"reused"`
	DurationMS       int64 `json:"duration_ms"`
}

// object is one object a savepoint copies: key in the source, to (when
// not empty) its key in the target.
type object struct {
	key    string
	size   int64
	digest string // of the object's bytes, manifests.AlgOf says which hash
	to     string
}

// dst is the object's key in the target.
func (ob object) dst() string {
	if ob.to != "" {
		return ob.to
	}
	return ob.key
}

// Create writes a savepoint of a checkpoint of the job in o.Source to
// o.Target: every referenced object, copied and verified, then the
// manifests, then the record, last. A crash leaves no record (no
// savepoint); running Create again resumes, keeping objects already copied
// once they verify. The job's storage is only read.
func Create(ctx context.Context, o Options) (*Result, error) {
	start := time.Now()
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.Concurrency < 1 {
		o.Concurrency = 8
	}
	old, err := existing(ctx, o.Target)
	if err != nil {
		return nil, err
	}
	if old != nil && !o.Overwrite {
		what := "a savepoint whose record does not read"
		if old.Job != "" {
			what = fmt.Sprintf("a savepoint of %s/%s checkpoint %d taken %s", old.Job, old.Origin.Task, old.Checkpoint, old.Taken.Format(time.RFC3339))
		}
		return nil, fmt.Errorf("%w: %s holds %s; give --overwrite to replace it, or another target", ErrExists, o.Target, what)
	}

	n, tasks, err := choose(ctx, o)
	if err != nil {
		return nil, err
	}
	cat, err := manifests.Scan(ctx, o.Source, o.Job, "")
	if err != nil {
		return nil, err
	}
	rec := &Record{Job: o.Job, Checkpoint: n, JobConsistent: o.JobConsistent, Taken: time.Now().UTC(),
		Origin: Origin{Storage: o.Source.String(), Job: o.Job, Task: o.Task, Checkpoint: n}}
	res := &Result{Savepoint: o.Target.String(), Job: o.Job, Checkpoint: n, Tasks: len(tasks), TaskNames: tasks}
	var objs []object
	seen := map[string]bool{}
	encoded := map[string][]byte{}
	var walKeys []string // WAL manifests, copied after every object
	for _, task := range tasks {
		ref, err := cat.Find(task, n)
		if err != nil {
			return nil, fmt.Errorf("savepoint: task %s checkpoint %d: %w", task, n, err)
		}
		m, enc, err := manifests.LoadRefEncoded(ctx, o.Source, o.Job, ref)
		if err != nil {
			return nil, fmt.Errorf("savepoint: %w", err)
		}
		if task == o.Task {
			rec.Origin.Created = m.Created
		}
		sum := sha256.Sum256(enc)
		rec.Tasks = append(rec.Tasks, Entry{Task: task, Manifest: ref.Key, ManifestSHA256: hex.EncodeToString(sum[:]), Files: len(m.Files), FullSize: m.FullSize})
		encoded[ref.Key] = enc
		res.Files += len(m.Files)
		res.Bytes += m.FullSize
		for _, f := range m.Files {
			if f.Key == "" || seen[f.Key] {
				continue
			}
			seen[f.Key] = true
			objs = append(objs, object{key: f.Key, size: f.Size, digest: f.Digest()})
		}
		if o.WithWAL {
			if objs, walKeys, err = withWAL(ctx, o, task, n, ref.Epoch, &rec.Tasks[len(rec.Tasks)-1], seen, objs, walKeys); err != nil {
				return nil, err
			}
		}
	}
	slices.SortFunc(objs, func(a, b object) int { return strings.Compare(a.key, b.key) })

	// A savepoint being replaced stops being one first: a crash from here
	// on leaves no record, never one naming a mix of the two.
	if old != nil {
		if err := o.Target.Delete(ctx, Key); err != nil {
			return nil, fmt.Errorf("savepoint: remove the old record: %w", err)
		}
	}
	c := &copier{o: o}
	if err := c.copyAll(ctx, objs); err != nil {
		return nil, err
	}
	res.Objects, res.CopiedServerSide, res.Reused = len(objs), int(c.serverSide.Load()), int(c.reused.Load())
	for _, e := range rec.Tasks {
		if err := putVerified(ctx, o.Target, e.Manifest, encoded[e.Manifest]); err != nil {
			return nil, fmt.Errorf("savepoint: manifest of task %s: %w", e.Task, err)
		}
	}
	// The WAL manifests after their segments: as stored, checked again.
	for _, key := range walKeys {
		if err := copyWALManifest(ctx, o.Source, o.Target, key); err != nil {
			return nil, err
		}
	}
	rec.Objects, rec.Bytes = len(objs), sumSizes(objs)
	data, err := encode(rec)
	if err != nil {
		return nil, err
	}
	if err := o.Target.Create(ctx, Key, bytes.NewReader(data), int64(len(data))); err != nil {
		if errors.Is(err, storage.ErrExists) {
			return nil, fmt.Errorf("%w: another savepoint was written to %s meanwhile; nothing of it was changed", ErrExists, o.Target)
		}
		return nil, fmt.Errorf("savepoint: write the record: %w", err)
	}
	if old != nil {
		c.dropUnused(ctx, old, rec, objs)
	}
	res.DurationMS = time.Since(start).Milliseconds()
	return res, nil
}

// check refuses options Create cannot work with, naming the fix.
func (o *Options) check() error {
	if o.Source == nil || o.Target == nil {
		return errors.New("savepoint: a source and a target store are required")
	}
	if err := manifests.ValidName("job", o.Job); err != nil {
		return err
	}
	if err := manifests.ValidName("task", o.Task); err != nil {
		return err
	}
	if o.JobConsistent && o.Checkpoint != 0 {
		return errors.New("savepoint: --job-consistent picks the checkpoint; do not give --checkpoint too")
	}
	if o.JobConsistent && o.WithWAL {
		return errors.New("savepoint: --with-wal saves one task past its checkpoint; a job-consistent savepoint keeps every task at the job-wide checkpoint (leave one of them out)")
	}
	return checkApart(o.Source, o.Target)
}

// withWAL adds the usable WAL chain of task's checkpoint n (by epoch) to a
// savepoint: its segments to objs (once each, by seen), its manifests to
// walKeys (copied after every object), and the chain's extent to e.
func withWAL(ctx context.Context, o Options, task string, n, epoch uint64, e *Entry, seen map[string]bool, objs []object, walKeys []string) ([]object, []string, error) {
	chain, _, err := wal.UsableChain(ctx, o.Source, o.Job, task, n, epoch)
	if err != nil {
		return nil, nil, fmt.Errorf("savepoint: %w", err)
	}
	for _, wm := range chain {
		for _, r := range wm.Segments {
			if key := wm.SegmentKey(r); !seen[key] {
				seen[key] = true
				objs = append(objs, object{key: key, size: r.Size(), digest: r.SHA256})
			}
		}
		walKeys = append(walKeys, wm.Key())
	}
	if k := len(chain); k > 0 {
		e.WALManifests, e.WALThroughUnixMs = k, chain[k-1].ThroughUnixMs
	}
	return objs, walKeys, nil
}

// copyWALManifest copies the WAL manifest at key byte for byte, after
// checking that it decodes.
func copyWALManifest(ctx context.Context, src, dst storage.Store, key string) error {
	rc, err := src.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("savepoint: wal manifest %s: %w", key, err)
	}
	data, err := io.ReadAll(io.LimitReader(rc, wal.MaxManifestBytes+1))
	rc.Close()
	if err != nil {
		return fmt.Errorf("savepoint: wal manifest %s: %w", key, err)
	}
	if _, err := wal.Decode(data); err != nil {
		return fmt.Errorf("savepoint: wal manifest %s: %w", key, err)
	}
	if err := putVerified(ctx, dst, key, data); err != nil {
		return fmt.Errorf("savepoint: wal manifest %s: %w", key, err)
	}
	return nil
}

// CheckApart refuses a target that is the source or inside it (or holds
// it): the job's GC and retention would reach into the savepoint, or the
// savepoint's overwrite into the job. Both are storage URLs (as given, or
// as storage.LocationOf gives them), compared by what they reach (see
// storage.Overlap): a file:// target that is the job's directory through
// a symlink, or an s3:// one that differs only in "//", "./", a trailing
// slash or the case of its scheme, is the job's storage.
func CheckApart(source, target string) error {
	if storage.Overlap(source, target) {
		return overlapError(source, target)
	}
	return nil
}

// checkApart is CheckApart on two open stores, located as their backends
// resolve them.
func checkApart(source, target storage.Store) error {
	if storage.Overlap(storage.LocationOf(source), storage.LocationOf(target)) {
		return overlapError(source.String(), target.String())
	}
	return nil
}

func overlapError(source, target string) error {
	return fmt.Errorf("savepoint target %s overlaps the job's storage %s: give a prefix, bucket or backend of its own, so that no retention or GC of the job can reach it", target, source)
}

// existing reads the savepoint in s, if any. A record that is there but
// does not read is an error: overwriting it takes --overwrite like any.
func existing(ctx context.Context, s storage.Store) (*Record, error) {
	if _, err := s.Stat(ctx, Key); errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("savepoint: look for a savepoint in %s: %w", s, err)
	}
	data, err := readAll(ctx, s, Key, maxRecordBytes)
	if err != nil {
		return nil, fmt.Errorf("savepoint: read the savepoint in %s: %w", s, err)
	}
	r, err := decode(data)
	if err != nil {
		return &Record{}, nil // unreadable: still a savepoint, replaced only on purpose (and naming nothing to drop)
	}
	return r, nil
}

// choose picks the checkpoint number and the tasks to save.
func choose(ctx context.Context, o Options) (uint64, []string, error) {
	if o.JobConsistent {
		n, err := manifests.NewestJobComplete(ctx, o.Source, o.Job, o.Task)
		if err != nil {
			return 0, nil, err
		}
		if n == 0 {
			return 0, nil, fmt.Errorf("savepoint: %s holds no job-complete checkpoint of task %s in job %s (see ckpt list)", o.Source, o.Task, o.Job)
		}
		m, err := manifests.Load(ctx, o.Source, o.Job, o.Task, n)
		if err != nil {
			return 0, nil, err
		}
		return n, m.Tasks, nil
	}
	cat, err := manifests.Scan(ctx, o.Source, o.Job, o.Task)
	if err != nil {
		return 0, nil, err
	}
	refs := cat.Retained(o.Task)
	if len(refs) == 0 {
		return 0, nil, fmt.Errorf("savepoint: %s holds no checkpoint of task %s in job %s (see ckpt list)", o.Source, o.Task, o.Job)
	}
	if o.Checkpoint == 0 {
		return refs[len(refs)-1].Checkpoint, []string{o.Task}, nil
	}
	for _, r := range refs {
		if r.Checkpoint == o.Checkpoint {
			return r.Checkpoint, []string{o.Task}, nil
		}
	}
	return 0, nil, fmt.Errorf("savepoint: checkpoint %d of task %s is not a complete retained checkpoint in %s (see ckpt list)", o.Checkpoint, o.Task, o.Source)
}

// copier copies objects from o.Source to o.Target.
type copier struct {
	o          Options
	serverSide atomic.Int64
	reused     atomic.Int64
}

// copyAll copies every object, o.Concurrency at once; the first error
// stops the rest.
func (c *copier) copyAll(ctx context.Context, objs []object) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan object)
	var wg sync.WaitGroup
	for range min(c.o.Concurrency, max(len(objs), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ob := range work {
				if err := c.copyOne(ctx, ob); err != nil {
					cancel(err)
				}
			}
		}()
	}
feed:
	for _, ob := range objs {
		select {
		case work <- ob:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return context.Cause(ctx) // the first copy's error, or the caller's cancellation
}

// copyOne makes the target hold ob, verified: kept if already there and
// whole, else copied server-side when the target can, else streamed.
func (c *copier) copyOne(ctx context.Context, ob object) error {
	if info, err := c.o.Target.Stat(ctx, ob.dst()); err == nil && info.Size == ob.size {
		if verify(ctx, c.o.Target, ob) == nil {
			c.reused.Add(1)
			return nil
		}
	}
	if cp, ok := storage.AsCopier(c.o.Target); ok {
		copied, err := cp.CopyFrom(ctx, c.o.Source, ob.key, ob.dst(), ob.size)
		if err == nil && copied {
			if err := verify(ctx, c.o.Target, ob); err != nil {
				return fmt.Errorf("savepoint: server-side copy of %s: %w", ob.key, err)
			}
			c.serverSide.Add(1)
			return nil
		}
		// Not possible between these two (or refused): stream it.
	}
	return c.stream(ctx, ob)
}

// stream copies ob through a temporary file: read from the source and
// checked against its SHA-256, written to the target, read back and
// checked again.
func (c *copier) stream(ctx context.Context, ob object) error {
	tmp, err := os.CreateTemp(c.o.TempDir, "ckpt-savepoint-*")
	if err != nil {
		return fmt.Errorf("savepoint: temporary file: %w (set TMPDIR to a disk with room)", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	r, err := c.o.Source.Get(ctx, ob.key)
	if err != nil {
		return fmt.Errorf("savepoint: read %s from %s: %w", ob.key, c.o.Source, err)
	}
	h := manifests.NewHasher(manifests.AlgOf(ob.digest))
	buf := fsutil.GetBuf()
	n, err := io.CopyBuffer(io.MultiWriter(tmp, h), storage.ContextReader(ctx, r), *buf)
	fsutil.PutBuf(buf)
	r.Close()
	if err != nil {
		return fmt.Errorf("savepoint: read %s from %s: %w", ob.key, c.o.Source, err)
	}
	if n != ob.size || h.Digest() != ob.digest {
		return fmt.Errorf("savepoint: %s in the job's storage %s is damaged (%d bytes, checksum mismatch: %v): the checkpoint cannot be saved; run ckpt verify on the job",
			ob.key, c.o.Source, n, h.Digest() != ob.digest)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := c.o.Target.Put(ctx, ob.dst(), tmp, ob.size); err != nil {
		return fmt.Errorf("savepoint: write %s to %s: %w", ob.dst(), c.o.Target, err)
	}
	if err := verify(ctx, c.o.Target, ob); err != nil {
		return fmt.Errorf("savepoint: %s after writing it: %w", ob.dst(), err)
	}
	return nil
}

// verify reads ob back from s (the target) and checks its size and
// hash.
func verify(ctx context.Context, s storage.Store, ob object) error {
	r, err := s.Get(ctx, ob.dst())
	if err != nil {
		return err
	}
	defer r.Close()
	sum, n, err := manifests.HashReader(ctx, r, manifests.AlgOf(ob.digest))
	if err != nil {
		return err
	}
	if n != ob.size || sum != ob.digest {
		return fmt.Errorf("%s in %s holds %d bytes with %s %.15s…, want %d bytes with %.15s…", ob.dst(), s, n, manifests.AlgOf(ob.digest), sum, ob.size, ob.digest)
	}
	return nil
}

// putVerified writes data under key and reads it back.
func putVerified(ctx context.Context, s storage.Store, key string, data []byte) error {
	if err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
		return err
	}
	back, err := readAll(ctx, s, key, int64(len(data))+1)
	if err != nil {
		return err
	}
	if !bytes.Equal(back, data) {
		return fmt.Errorf("%s in %s does not read back as written", key, s)
	}
	return nil
}

// dropUnused deletes, once the new record is written, the objects and
// manifests of the replaced savepoint that the new one does not use. It
// deletes only what the old record's manifests named: nothing else in
// the target is touched. Failures leave garbage, never a broken savepoint.
func (c *copier) dropUnused(ctx context.Context, old, rec *Record, objs []object) {
	keep := map[string]bool{Key: true}
	for _, ob := range objs {
		keep[ob.key] = true
	}
	for _, e := range rec.Tasks {
		keep[e.Manifest] = true
	}
	var drop []string
	for _, e := range old.Tasks {
		if !keep[e.Manifest] {
			drop = append(drop, e.Manifest)
		}
		b, err := readAll(ctx, c.o.Target, e.Manifest, manifests.MaxManifestBytes)
		if err != nil {
			continue
		}
		m, err := manifests.Decode(b)
		if err != nil {
			continue
		}
		for _, f := range m.Files {
			if f.Key != "" && !keep[f.Key] {
				keep[f.Key] = true // once
				drop = append(drop, f.Key)
			}
		}
	}
	if len(drop) > 0 {
		_ = c.o.Target.Delete(ctx, drop...)
	}
}

func sumSizes(objs []object) int64 {
	var n int64
	for _, ob := range objs {
		n += ob.size
	}
	return n
}

// readAll reads a whole object of at most limit bytes.
func readAll(ctx context.Context, s storage.Store, key string, limit int64) ([]byte, error) {
	r, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(storage.ContextReader(ctx, r), limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", key, limit)
	}
	return b, nil
}

// SeedOptions says which task of a savepoint starts which job.
type SeedOptions struct {
	// Savepoint is the savepoint's storage, Task the task to seed ("" for
	// the only one).
	Savepoint storage.Store
	Task      string
	// Target is the new job's storage and Job its name. The job must hold
	// no checkpoint of the task yet.
	Target      storage.Store
	Job         string
	Concurrency int
	TempDir     string
}

// Seed starts a job from a savepoint: it copies the task's objects into
// the job's storage (server-side where the backend can), verified, and
// commits the savepoint's checkpoint as the task's checkpoint of the same
// number in that job, last. A restore of the task from the job then
// records its local copy there, and the job's next checkpoint uploads only
// what changed since, as after any restore. The savepoint is only read,
// and the job's retention and GC never reach it.
func Seed(ctx context.Context, o SeedOptions) (*manifests.Manifest, error) {
	if err := manifests.ValidName("job", o.Job); err != nil {
		return nil, err
	}
	if err := checkApart(o.Savepoint, o.Target); err != nil {
		return nil, err
	}
	rec, err := Read(ctx, o.Savepoint)
	if err != nil {
		return nil, err
	}
	e, err := rec.Entry(o.Task)
	if err != nil {
		return nil, err
	}
	cat, err := manifests.Scan(ctx, o.Target, o.Job, e.Task)
	if err != nil {
		return nil, err
	}
	if refs := cat.Retained(e.Task); len(refs) > 0 {
		return nil, fmt.Errorf("job %s in %s already holds checkpoint %d of task %s: a savepoint seeds only a job that has none of the task; restore without --job and --storage, or name a new job",
			o.Job, o.Target, refs[len(refs)-1].Checkpoint, e.Task)
	}
	b, err := readAll(ctx, o.Savepoint, e.Manifest, manifests.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	m, err := manifests.Decode(b)
	if err != nil {
		return nil, err
	}
	seeded := *m
	seeded.Job, seeded.Epoch, seeded.Node, seeded.AgentID, seeded.Parent = o.Job, 0, "", "", 0
	seeded.Created = time.Now().UTC()
	seeded.Files = make([]manifests.File, len(m.Files))
	seeded.FilesUploaded, seeded.FilesReused = 0, 0
	var objs []object
	var written int64
	for i, f := range m.Files {
		g := f
		switch {
		case f.Key == "":
		case f.Kind == manifests.Shared:
			g.Key = manifests.SharedKey(o.Job, f.Digest(), f.Size)
		default:
			g.Key = manifests.PrivateKey(o.Job, e.Task, m.Checkpoint, f.Name)
		}
		g.Uploaded = true
		if g.Key != "" {
			objs = append(objs, object{key: f.Key, size: f.Size, digest: f.Digest(), to: g.Key})
			written += f.Size
		}
		seeded.Files[i] = g
		seeded.FilesUploaded++
	}
	if o.Concurrency < 1 {
		o.Concurrency = 8
	}
	c := &copier{o: Options{Source: o.Savepoint, Target: o.Target, Concurrency: o.Concurrency, TempDir: o.TempDir}}
	if err := c.copyAll(ctx, objs); err != nil {
		return nil, err
	}
	enc, err := seeded.Encode(written)
	if err != nil {
		return nil, err
	}
	if err := manifests.Commit(ctx, o.Target, &seeded, enc); err != nil {
		return nil, fmt.Errorf("seed job %s: %w", o.Job, err)
	}
	return &seeded, nil
}
