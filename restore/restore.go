// Package restore rebuilds a task's store from a complete checkpoint: from
// the task-local copy where it is present and verifies, from storage for
// every other file. Every file is checked against the manifest's size and
// content hash (SHA-256 in format 1 manifests, BLAKE3 for files format 2
// added) before the restore succeeds, and the target appears whole or not
// at all: files land in a temporary directory beside it, are fsynced, and
// the directory is renamed into place only when every file verified.
package restore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/ckpt-io/ckpt/protocol"
	"go.opentelemetry.io/otel"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/internal/safefs"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/wal"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Options says what to restore where.
type Options struct {
	Store     storage.Store
	Job, Task string
	// Target is the directory to create; it must be absent or empty.
	Target string
	// TargetParent, when set, is Target's parent directory, already open
	// (the agent opens it under an allowed root): the restore then checks,
	// creates, fills and places Target only relative to it and to the
	// directories it creates there, never through Target's path, whose
	// parent part is then only a name for messages. Without it, Target's
	// parent is created if needed and opened by its path, once.
	TargetParent *os.File
	// Checkpoint picks a retained checkpoint; 0 means the newest.
	Checkpoint uint64
	// JobConsistent picks the task's newest job-complete checkpoint: the
	// newest N for which every task of the job has a complete checkpoint N
	// (manifests.JobReader). Not with Checkpoint.
	JobConsistent bool
	// LocalDir is the agent's local dir: files are taken from the local copy
	// when present and intact, and the restore is recorded there so that the
	// agent does not upload restored files again. "" restores from storage.
	LocalDir string
	// IfNotExists makes a target that already holds files a success that
	// does nothing.
	IfNotExists bool
	// IfCheckpointExists makes "no checkpoint in storage" a success that
	// does nothing.
	IfCheckpointExists bool
	// Parallelism bounds concurrent file restores (default 8).
	Parallelism int
	// TrustUnchangedLocal skips hashing a local file that is still the very
	// inode its checkpoint completed with, unwritten since (same device,
	// inode, size and mtime; see localrecovery.Local.Unchanged). It makes a
	// same-node restore cost a hard link per file instead of a SHA-256 pass
	// over the state, and gives up detecting corruption by the disk itself.
	// Off by default: every restored byte is verified. Remote bytes are
	// always verified.
	TrustUnchangedLocal bool
	// Progress, when set, is called as bytes land (total is the full size).
	Progress func(done, total int64)
	// Standby marks the refresh of a warm standby's local copy (see
	// Refresh): the restore is recorded in LocalDir, but not as the task's
	// move to this node, which only a restore for the app does.
	Standby bool
	// To is ToLatest (the checkpoint extended with the write-ahead log
	// shipped after it, as far as it is usable: see wal.UsableChain and
	// wal.Apply) or ToCheckpoint (the checkpoint alone); "" is
	// ToCheckpoint. Not ToLatest with JobConsistent or Standby: a WAL
	// extends one task past the job-wide point.
	To string
}

// DefaultTo is the point a restore request goes to when it names none
// (to ""): latest, except for a restore that names its checkpoint (n > 0),
// which gets that checkpoint as it was taken, and a job-consistent
// restore, which goes to the job-wide checkpoint. `--checkpoint N --to
// latest` restores N extended with its WAL.
func DefaultTo(to string, n uint64, jobConsistent bool) string {
	switch {
	case to != "":
		return to
	case jobConsistent, n > 0:
		return ToCheckpoint
	}
	return ToLatest
}

// The points a restore can go to (Options.To).
const (
	ToLatest     = "latest"
	ToCheckpoint = "checkpoint"
)

// Result is what a restore did; its JSON is `ckpt restore --json`, the
// same fields as the socket's restored event (protocol.Restored).
type Result struct {
	outcome // its fields are Result's, and its JSON

	wait func()
}

// outcome names protocol.Restored as Result's embedded field, so that
// Result.Restored is the boolean, not the struct.
type outcome = protocol.Restored

// Outcome is the result as the socket's restored event carries it.
func (r *Result) Outcome() *protocol.Restored { return &r.outcome }

// Wait waits for the work a restore leaves running after it returned: the
// local copy being re-created after a move. Call it before the process
// exits, or the local dir keeps no copy of the checkpoint (it is then
// restored from storage next time).
func (r *Result) Wait() {
	if r != nil && r.wait != nil {
		r.wait()
	}
}

// ErrNoCheckpoint is returned (wrapped) when storage holds no complete
// checkpoint to restore.
var ErrNoCheckpoint = errors.New("no checkpoint to restore")

// ErrTargetNotEmpty is returned (wrapped) when the target holds files.
var ErrTargetNotEmpty = errors.New("restore target is not empty")

// Run restores a task. See Options for the guards and sources.
//
// Run checks the request, picks the checkpoint and reads its manifest, then
// builds the store in a temporary directory beside the target with one of
// two strategies: move, when the local copy is whole and unchanged and
// trusted as it is, or fetch, file by file from the local copy or storage.
func Run(ctx context.Context, o Options) (*Result, error) {
	start := time.Now()
	target, err := prepare(&o)
	if err != nil {
		return nil, err
	}
	if skip, err := checkTarget(o.TargetParent, target, o.IfNotExists); skip != nil || err != nil {
		return skip, err
	}
	r := &restorer{o: o, target: target}
	switch {
	case o.To != "" && o.To != ToLatest && o.To != ToCheckpoint:
		return nil, fmt.Errorf("restore: --to %q: want latest or checkpoint", o.To)
	case o.To == ToLatest && (o.JobConsistent || o.Standby):
		return nil, errors.New("restore: a job-consistent or standby restore goes to the checkpoint, not to latest (leave --to out)")
	}
	if err := r.choose(ctx); err != nil {
		if errors.Is(err, ErrNoCheckpoint) && o.IfCheckpointExists {
			return &Result{outcome: outcome{Restored: false, Reason: err.Error()}}, nil
		}
		return nil, err
	}
	ctx, r.span = otel.Tracer("ckpt").Start(ctx, "restore", trace.WithAttributes(
		attribute.String("ckpt.job", o.Job), attribute.String("ckpt.task", o.Task), attribute.Int64("ckpt.checkpoint", int64(r.n)),
		attribute.Int("ckpt.files", len(r.m.Files)), attribute.Int64("ckpt.full_size", r.m.FullSize)))
	defer r.span.End()
	var owner uint64 // the task's newest ownership epoch before this restore
	if o.LocalDir != "" {
		if r.ls, err = localrecovery.Open(o.LocalDir, o.Job); err != nil {
			return nil, err
		}
		r.local = r.ls.GetFor(o.Task, r.m, r.encoded)
		if r.local == nil {
			// An older local copy still holds most of the files (an LSM
			// store's SSTs outlive many checkpoints): each is taken from
			// it if the manifest names the same content under its name.
			if l, err := r.ls.Latest(o.Task); err == nil && l != nil && l.Checkpoint < r.n {
				r.local, r.older = l, true
			}
		}
		owners, err := manifests.ListOwners(ctx, o.Store, o.Job, o.Task, ^uint64(0))
		if err != nil {
			return nil, err
		}
		owner = owners.Latest()
	}
	defer r.close()
	if err := r.makeTemp(); err != nil {
		return nil, err
	}
	if o.To == ToLatest {
		// The WAL is read before anything is written, and a store that
		// gets one is built by fetch: a lent local copy would be lost with
		// the restore if a segment turned out bad.
		if r.chain, r.chainWhy, err = wal.UsableChain(ctx, o.Store, o.Job, o.Task, r.n, r.m.Epoch); err != nil {
			return nil, fmt.Errorf("restore %s checkpoint %d to latest: %w", o.Task, r.n, err)
		}
	}
	res := &Result{outcome: outcome{Restored: true, Task: o.Task, Checkpoint: r.n, Files: len(r.m.Files), Bytes: r.m.FullSize, Target: target}}
	if r.lend() {
		err = r.move(ctx, res)
	} else {
		err = r.fetch(ctx, res)
	}
	if err != nil {
		r.removeTemp()
		return nil, err
	}
	if r.ls != nil && !o.Standby {
		// The task's new home: an agent on this local dir may take the
		// task over from the owner this restore saw (and from no later one).
		if err := r.ls.RecordTakeover(o.Task, owner); err != nil && res.LocalRecordError == "" {
			res.LocalRecordError = err.Error()
		}
		// And where its WAL ended, for the taker's ownership record.
		var resumed *manifests.WALResumed
		if p := res.WALPosition; p != nil && p.Seq > 0 {
			resumed = &manifests.WALResumed{Checkpoint: p.Checkpoint, Epoch: p.Epoch, Seq: p.Seq}
		}
		if err := r.ls.RecordWALResumed(o.Task, resumed); err != nil && res.LocalRecordError == "" {
			res.LocalRecordError = err.Error()
		}
	}
	res.DurationMS = time.Since(start).Milliseconds()
	newest := r.m.Created.UnixMilli()
	if r.through > 0 {
		newest = r.through
	}
	res.RecoveredWriteAgeMS = max(0, time.Now().UnixMilli()-newest)
	return res, nil
}

// applyWAL extends the verified store in tmpDir with the checkpoint's
// write-ahead log, for a restore to latest. It runs before the store is
// placed: the target appears whole, checkpoint and WAL, or not at all. A
// bad segment fails the restore (see wal.Apply); a hole, a missing
// manifest or a newer owner that did not resume from this WAL stops the
// WAL short, and the result says where and why.
func (r *restorer) applyWAL(ctx context.Context, res *Result) error {
	res.To = ToCheckpoint
	if r.o.To != ToLatest {
		return nil
	}
	res.To = ToLatest
	a, err := wal.Apply(ctx, r.o.Store, r.tmpDir, r.chain)
	if err != nil {
		return fmt.Errorf("restore %s checkpoint %d to latest: %w", r.o.Task, r.n, err)
	}
	p := a.Position
	res.WALPosition = &protocol.WALPosition{Checkpoint: r.n, Epoch: r.m.Epoch, Seq: p.Seq, Log: p.Log, Offset: p.Offset}
	res.WALSegments, res.WALBytes = a.Segments, a.Bytes
	res.WALStopped = r.chainWhy
	if a.Stopped != "" {
		res.WALStopped = a.Stopped
	}
	r.through, r.walChanged = a.ThroughUnixMs, a.Changed
	r.span.SetAttributes(attribute.Int("ckpt.wal_segments", a.Segments), attribute.Int64("ckpt.wal_bytes", a.Bytes), attribute.Int64("ckpt.wal_seq", int64(p.Seq)))
	return nil
}

// prepare checks the names and the target of o, sets its defaults, and
// returns the cleaned target.
func prepare(o *Options) (string, error) {
	if err := manifests.ValidName("job", o.Job); err != nil {
		return "", err
	}
	if err := manifests.ValidName("task", o.Task); err != nil {
		return "", err
	}
	if !filepath.IsAbs(o.Target) {
		return "", fmt.Errorf("restore target %q must be an absolute path", o.Target)
	}
	if o.Parallelism < 1 {
		o.Parallelism = 8
	}
	return filepath.Clean(o.Target), nil
}

// checkTarget refuses a target that holds files, or, with ifNotExists,
// returns the result of a restore that does nothing. With parent (the
// open TargetParent) the target is looked at relative to it only.
func checkTarget(parent *os.File, target string, ifNotExists bool) (*Result, error) {
	empty, err := isEmptyOrAbsent(parent, target)
	if err != nil {
		return nil, err
	}
	if empty {
		return nil, nil
	}
	if ifNotExists {
		return &Result{outcome: outcome{Restored: false, Reason: "target already holds a store: " + target}}, nil
	}
	return nil, fmt.Errorf("%w: %s holds files (use --if-not-exists to keep an existing store)", ErrTargetNotEmpty, target)
}

// restorer is one restore in progress.
type restorer struct {
	o       Options
	target  string
	n       uint64              // the checkpoint restored
	m       *manifests.Manifest // its manifest
	encoded []byte              // the manifest as stored
	ls      *localrecovery.Store
	local   *localrecovery.Local // the local copy of n, if any; else of an older checkpoint (older)
	older   bool                 // local is an older checkpoint's copy: only files whose content n names too are taken from it
	span    trace.Span

	// parent is the target's parent directory, open: o.TargetParent, or
	// opened here by its path (ownParent: closed by close). The target is
	// created, filled and placed relative to it, under the name base.
	parent    *os.File
	ownParent bool
	base      string
	tmpName   string   // the temporary directory's name in parent
	tmpDir    *os.File // the temporary directory, open: files land in it
	tmp       string   // its path, for lending only (no TargetParent)
	ldir      *os.File // the local copy's directory, open: files come only from it
	placed    bool     // the store is the target now

	chain      []*wal.Manifest // the WAL a restore to latest applies (wal.UsableChain)
	chainWhy   string          // why that chain is short or empty, when it is
	through    int64           // the applied WAL's through time (Unix ms; 0: none applied)
	walChanged []string        // log files the WAL changed: not the checkpoint's files any more

	mu       sync.Mutex
	unsynced []string // files written from storage, their writeback started: syncAll waits for it
}

// syncParallel is how many fdatasyncs syncAll has in flight: the
// filesystem commits concurrent syncs together, so many at once cost
// little more than one.
const syncParallel = 32

// syncAll makes the files fetched from storage durable before the store
// is placed: an fdatasync of each, many at once. Their writeback started
// as each was written (sync_file_range), so the workers that fetched them
// went on to the next file instead of waiting for the disk file by file,
// and these syncs wait for what is left. (One syncfs(2) for the whole
// tree would also wait for every dirty page of the filesystem, the app's
// included: measured twice as slow on a busy node.)
func (r *restorer) syncAll(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(syncParallel)
	for _, name := range r.unsynced {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			full := filepath.Join(r.tmp, name)
			if err := failpoint.Error(failpoint.LocalSync); err != nil {
				return fmt.Errorf("restore: fsync %s: %w", full, err)
			}
			fd, err := unix.Openat(int(r.tmpDir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == nil {
				err = unix.Fdatasync(fd)
				unix.Close(fd)
			}
			if err != nil {
				return fmt.Errorf("restore: fsync %s: %w", full, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// choose picks the checkpoint and reads its manifest, which is checked
// (format, checksum, names that cannot escape the target) before anything
// is written.
func (r *restorer) choose(ctx context.Context) error {
	n, err := pick(ctx, r.o)
	if err != nil {
		return err
	}
	r.n = n
	r.m, r.encoded, err = manifests.LoadEncoded(ctx, r.o.Store, r.o.Job, r.o.Task, n)
	return err
}

// lend reports whether the move strategy applies, and if so has the local
// copy become tmp in one rename: the local copy is trusted as it is
// (TrustUnchangedLocal), holds exactly the manifest's files and each is
// still the inode it completed with. Lending moves the local copy to tmp
// by its path, so it applies only to a target whose path is the caller's
// own (no TargetParent), and only when no WAL is applied (a bad segment
// would fail the restore and take the lent copy with it).
func (r *restorer) lend() bool {
	return r.local != nil && !r.older && len(r.chain) == 0 && r.o.TrustUnchangedLocal && r.o.TargetParent == nil && wholeAndUnchanged(r.local, r.m) && r.ls.Lend(r.o.Task, r.n, r.m, r.tmp)
}

// move is the strategy for a lent local copy: the local copy is the store.
// Its private files get fsynced (an adopted copy never fsynced them); its
// shared files are the app's own SSTs, durable already. Once the store is
// in place the local dir re-creates its copy from it in the background.
func (r *restorer) move(ctx context.Context, res *Result) error {
	m := r.m
	// The lent copy replaced the empty directory tmpDir had open.
	lent, err := safefs.OpenDirAt(r.parent, r.tmpName)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	r.tmpDir.Close()
	r.tmpDir = lent
	for _, f := range m.Files {
		if f.Kind != manifests.Shared {
			if err := failpoint.Error(failpoint.LocalSync); err != nil {
				return fmt.Errorf("restore: fsync %s: %w", filepath.Join(r.tmp, f.Name), err)
			}
			if err := fsutil.SyncFile(filepath.Join(r.tmp, f.Name)); err != nil {
				return fmt.Errorf("restore: fsync %s: %w", filepath.Join(r.tmp, f.Name), err)
			}
		}
	}
	if err := r.applyWAL(ctx, res); err != nil {
		return err
	}
	if err := r.place(); err != nil {
		return err
	}
	r.ls.Readopt(r.o.Task, m, r.encoded, r.target)
	res.wait = r.ls.Wait
	res.Moved = true
	res.LocalVerification = "identity"
	res.BytesLocal, res.FilesLocal = m.FullSize, len(m.Files)
	if r.o.Progress != nil {
		r.o.Progress(m.FullSize, m.FullSize)
	}
	r.span.SetAttributes(attribute.Int64("ckpt.bytes_local", m.FullSize), attribute.Bool("ckpt.moved", true))
	return nil
}

// counts are the per-file tallies of a fetch.
type counts struct {
	done, bLocal, bRemote, fLocal, fRemote, fallbacks atomic.Int64
}

// fetch is the per-file strategy: each file comes from the local copy when
// it is there and verifies, else from storage, with up to Parallelism at
// once. Then the store is placed and recorded in the local dir.
func (r *restorer) fetch(ctx context.Context, res *Result) error {
	o, m := r.o, r.m
	r.openLocal()
	var c counts
	progress := func(k int64) {
		if o.Progress != nil {
			o.Progress(c.done.Add(k), m.FullSize)
		} else {
			c.done.Add(k)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Parallelism)
	for _, f := range m.Files {
		g.Go(func() error { return r.fetchFile(gctx, f, &c, progress) })
	}
	err := g.Wait()
	if err == nil {
		err = r.syncAll(ctx)
	}
	if err != nil {
		r.span.SetStatus(codes.Error, err.Error())
		return err
	}
	r.span.SetAttributes(attribute.Int64("ckpt.bytes_local", c.bLocal.Load()), attribute.Int64("ckpt.bytes_remote", c.bRemote.Load()),
		attribute.Int64("ckpt.local_fallbacks", c.fallbacks.Load()))
	if err := r.applyWAL(ctx, res); err != nil {
		r.span.SetStatus(codes.Error, err.Error())
		return err
	}
	if err := r.place(); err != nil {
		return err
	}
	if r.local != nil {
		res.LocalVerification = "sha256"
		if o.TrustUnchangedLocal {
			res.LocalVerification = "identity"
		}
	}
	if r.ls != nil && (r.local == nil || r.older || c.fallbacks.Load() > 0) {
		// Restore inherits: the agent on this local dir will know these
		// files (and their inodes) as checkpoint n and upload none of them.
		// (When every file came from the local copy of n, that copy already
		// says so, and its shared files are the target's inodes.) Without a
		// path to the placed target (see placedPath) nothing is recorded.
		// The store is in place by now: a local dir that cannot record it
		// (full, read-only) costs the next checkpoint a hash of every file,
		// not the restore, and is reported beside the result.
		if p := r.placedPath(); p != "" {
			if _, err := r.ls.Adopt(o.Task, m, r.encoded, p); err != nil {
				res.LocalRecordError = fmt.Sprintf("the restore was not recorded in the local dir %s: %v", o.LocalDir, err)
			}
			r.dropChanged()
		}
	}
	res.BytesLocal, res.BytesRemote = c.bLocal.Load(), c.bRemote.Load()
	res.FilesLocal, res.FilesRemote = int(c.fLocal.Load()), int(c.fRemote.Load())
	res.LocalFallbacks = int(c.fallbacks.Load())
	if (r.local == nil && o.LocalDir != "") || r.older {
		res.LocalFallbacks = 0 // no local copy of n: a file not found locally is not a fallback
	}
	return nil
}

// dropChanged removes from the local copy of n the log files the WAL
// changed after they were verified: Adopt copied them from the placed
// store, so they are not n's files, and a later restore of n must take
// them from storage.
func (r *restorer) dropChanged() {
	if len(r.walChanged) == 0 {
		return
	}
	l := r.ls.GetFor(r.o.Task, r.m, r.encoded)
	if l == nil {
		return
	}
	for _, name := range r.walChanged {
		os.Remove(l.Path(name))
	}
}

// fetchFile restores one file into tmp: from the local copy if it verifies
// there (else counted as a fallback), from storage otherwise.
func (r *restorer) fetchFile(ctx context.Context, f manifests.File, c *counts, progress func(int64)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.local != nil {
		// An older copy's record of a file's inode vouches for the content
		// that copy's manifest names: trusted only if n names the same.
		trust := r.o.TrustUnchangedLocal && (!r.older || sameContent(r.local.Manifest, f))
		used, err := fromLocal(r.local, r.ldir, r.tmpDir, f, trust)
		if err != nil {
			return fmt.Errorf("restore %s: %w", f.Name, err)
		}
		if used {
			c.bLocal.Add(f.Size)
			c.fLocal.Add(1)
			progress(f.Size)
			return nil
		}
		c.fallbacks.Add(1)
	}
	if err := fromStorage(ctx, r.o.Store, r.tmpDir, f, progress); err != nil {
		return fmt.Errorf("restore %s of %s checkpoint %d: %w", f.Name, r.o.Task, r.n, err)
	}
	r.mu.Lock()
	r.unsynced = append(r.unsynced, f.Name)
	r.mu.Unlock()
	c.bRemote.Add(f.Size) // inline bytes came from storage too, in the manifest
	c.fRemote.Add(1)
	return nil
}

// sameContent reports whether m names f's content under f's name.
func sameContent(m *manifests.Manifest, f manifests.File) bool {
	if m == nil {
		return false
	}
	for _, g := range m.Files {
		if g.Name == f.Name {
			return g.Digest() == f.Digest() && g.Size == f.Size
		}
	}
	return false
}

// openLocal opens the local copy's directory, if there is a local copy:
// fetchFile takes local files only relative to it. A copy that cannot be
// opened is no local copy after all: everything comes from storage.
func (r *restorer) openLocal() {
	if r.local == nil {
		return
	}
	d, err := safefs.OpenRoot(r.local.Dir)
	if err != nil {
		r.local = nil
		return
	}
	r.ldir = d
}

// makeTemp opens the target's parent (without TargetParent, creating it
// by its path first) and creates and opens the temporary directory the
// restore fills, beside the target.
func (r *restorer) makeTemp() error {
	r.parent = r.o.TargetParent
	if r.parent == nil {
		dir := filepath.Dir(r.target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		p, err := safefs.OpenRoot(dir)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		r.parent, r.ownParent = p, true
	}
	b := make([]byte, 6)
	rand.Read(b)
	r.base = filepath.Base(r.target)
	r.sweepStale()
	r.tmpName = tempPrefix(r.base) + hex.EncodeToString(b)
	r.tmp = filepath.Join(filepath.Dir(r.target), r.tmpName)
	if err := unix.Mkdirat(int(r.parent.Fd()), r.tmpName, 0o755); err != nil {
		return fmt.Errorf("restore: %w", &os.PathError{Op: "mkdir", Path: r.tmp, Err: err})
	}
	d, err := safefs.OpenDirAt(r.parent, r.tmpName)
	if err != nil {
		unix.Unlinkat(int(r.parent.Fd()), r.tmpName, unix.AT_REMOVEDIR)
		return fmt.Errorf("restore: %w", err)
	}
	// The lock says "in use" to sweepStale of later restores, for as long
	// as this restore runs (the kernel drops it if the process dies).
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		d.Close()
		unix.Unlinkat(int(r.parent.Fd()), r.tmpName, unix.AT_REMOVEDIR)
		return fmt.Errorf("restore: lock %s: %w", r.tmp, err)
	}
	r.tmpDir = d
	return nil
}

// tempPrefix starts the name of every temporary directory a restore of
// the target base makes beside it.
func tempPrefix(base string) string { return "." + base + ".restore-" }

// staleAfter is how long a temporary directory must have been left
// unchanged before a later restore of the same target removes it.
const staleAfter = time.Minute

// sweepStale removes the temporary directories that restores of the same
// target left when they were killed (each can hold a whole verified copy
// of the store, and its name is random, so nothing else would ever remove
// it). A directory is stale when no process holds its lock (a restore
// holds it while it runs; the kernel drops it when the process dies) and
// it has not changed for staleAfter. Everything is relative to the parent
// as opened; failures leave the directory for the next restore.
func (r *restorer) sweepStale() {
	entries, err := r.parent.ReadDir(-1)
	r.parent.Seek(0, io.SeekStart) // the parent is read again by later steps
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), tempPrefix(r.base)) {
			continue
		}
		d, err := safefs.OpenDirAt(r.parent, e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil || unix.Fstat(int(d.Fd()), &st) != nil ||
			time.Since(time.Unix(st.Mtim.Unix())) < staleAfter {
			d.Close()
			continue
		}
		files, _ := d.ReadDir(-1)
		for _, f := range files {
			unix.Unlinkat(int(d.Fd()), f.Name(), 0)
		}
		d.Close()
		unix.Unlinkat(int(r.parent.Fd()), e.Name(), unix.AT_REMOVEDIR)
	}
}

// place makes the verified tree tmpDir the target: fsync it, rename it
// to the target's name relative to parent, fsync parent. The target
// appears whole or not at all; an empty directory already there is
// replaced.
func (r *restorer) place() error {
	if err := failpoint.Error(failpoint.LocalSync); err != nil {
		return fmt.Errorf("restore: fsync %s: %w", r.tmp, err)
	}
	if err := fsutil.SyncOpenDir(r.tmpDir); err != nil {
		return fmt.Errorf("restore: fsync %s: %w", r.tmp, err)
	}
	failpoint.Hit(failpoint.BeforeRename) // every file verified and synced in tmp, target not yet there
	err := failpoint.Error(failpoint.LocalRename)
	if err == nil {
		err = unix.Renameat(int(r.parent.Fd()), r.tmpName, int(r.parent.Fd()), r.base)
	}
	if err != nil {
		return fmt.Errorf("restore: move the verified store into place at %s: %w", r.target, err)
	}
	r.placed = true
	err = failpoint.Error(failpoint.LocalSync)
	if err == nil {
		err = fsutil.SyncOpenDir(r.parent)
	}
	if err != nil {
		// The rename may not be durable, and the caller is told the
		// restore failed: take the target back rather than leave a store
		// that a crash may or may not keep.
		if unix.Renameat2(int(r.parent.Fd()), r.base, int(r.parent.Fd()), r.tmpName, unix.RENAME_NOREPLACE) == nil {
			r.placed = false
		}
		return fmt.Errorf("restore: fsync %s: %w", filepath.Dir(r.target), err)
	}
	return nil
}

// placedPath names the placed target for the code that needs a path
// (adoption into the local dir): the target's own path when it is the
// caller's, else, with TargetParent, the open directory's path in /proc,
// so that no path a peer could swap is walked; "" where /proc does not
// show it.
func (r *restorer) placedPath() string {
	if r.o.TargetParent == nil {
		return r.target
	}
	p, _ := safefs.ProcPath(r.tmpDir)
	return p
}

// removeTemp removes the temporary directory and the files in it,
// relative to parent, unless the store was placed (there is none then).
func (r *restorer) removeTemp() {
	if r.placed {
		return
	}
	d, err := safefs.OpenDirAt(r.parent, r.tmpName)
	if err != nil {
		return
	}
	entries, _ := d.ReadDir(-1)
	for _, e := range entries {
		unix.Unlinkat(int(d.Fd()), e.Name(), 0)
	}
	d.Close()
	unix.Unlinkat(int(r.parent.Fd()), r.tmpName, unix.AT_REMOVEDIR)
}

// close closes the directories the restore opened.
func (r *restorer) close() {
	for _, f := range []*os.File{r.tmpDir, r.ldir} {
		if f != nil {
			f.Close()
		}
	}
	if r.ownParent {
		r.parent.Close()
	}
}

// wholeAndUnchanged reports whether the local copy l holds exactly m's
// files, each still the inode it completed with: then it can be moved into
// place as it is.
func wholeAndUnchanged(l *localrecovery.Local, m *manifests.Manifest) bool {
	entries, err := os.ReadDir(l.Dir)
	if err != nil || len(entries) != len(m.Files) {
		return false
	}
	for _, f := range m.Files {
		fi, err := os.Lstat(l.Path(f.Name))
		if err != nil || fi.Size() != f.Size || !l.UnchangedInfo(f.Name, fi) {
			return false
		}
	}
	return true
}

// Pick returns the checkpoint a restore with o would restore (o's Store,
// Job, Task, Checkpoint and JobConsistent), reading only storage: an
// error wrapping ErrNoCheckpoint when there is none. The agent's restore
// op asks it before it takes the task's ownership, so that naming a task
// that has no checkpoint writes nothing.
func Pick(ctx context.Context, o Options) (uint64, error) {
	if err := manifests.ValidName("job", o.Job); err != nil {
		return 0, err
	}
	if err := manifests.ValidName("task", o.Task); err != nil {
		return 0, err
	}
	return pick(ctx, o)
}

// pick chooses the checkpoint: the requested one if it is complete and
// retained, else the newest.
func pick(ctx context.Context, o Options) (uint64, error) {
	if o.JobConsistent {
		if o.Checkpoint != 0 {
			return 0, errors.New("restore: a job-consistent restore picks the checkpoint itself; do not name one")
		}
		n, err := manifests.NewestJobComplete(ctx, o.Store, o.Job, o.Task)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, fmt.Errorf("%w: storage %s holds no job-complete checkpoint of task %s in job %s (see ckpt list)", ErrNoCheckpoint, o.Store, o.Task, o.Job)
		}
		return n, nil
	}
	cat, err := manifests.Scan(ctx, o.Store, o.Job, o.Task)
	if err != nil {
		return 0, err
	}
	refs := cat.Retained(o.Task)
	if o.Checkpoint != 0 {
		for _, r := range refs {
			if r.Checkpoint == o.Checkpoint {
				return r.Checkpoint, nil
			}
		}
		return 0, fmt.Errorf("%w: checkpoint %d of task %s is not a complete retained checkpoint in %s (see ckpt list)", ErrNoCheckpoint, o.Checkpoint, o.Task, o.Store)
	}
	if len(refs) == 0 {
		return 0, noneUsable(cat, o)
	}
	return refs[len(refs)-1].Checkpoint, nil
}

// noneUsable is pick's error when the task has no retained checkpoint.
// Only a task whose storage holds no complete checkpoint at all (or
// fenced ones only: a superseded owner's late commits, which its
// successor never resumed from) has nothing to restore, ErrNoCheckpoint.
// Checkpoints that exist but cannot be used (retired, ownership records
// that do not decode) fail loudly: starting the app empty would lose its
// state (`restore --if-checkpoint-exists` passes over ErrNoCheckpoint).
func noneUsable(cat *manifests.Catalog, o Options) error {
	if err := cat.OwnerProblems[o.Task]; err != nil {
		return fmt.Errorf("restore of task %s: storage %s holds checkpoints of it, but none can be used: %w", o.Task, o.Store, err)
	}
	var valid, fenced int
	for _, r := range cat.Refs {
		if r.Task == o.Task {
			valid++
		}
	}
	for _, r := range cat.Fenced {
		if r.Task == o.Task {
			fenced++
		}
	}
	if valid > 0 {
		return fmt.Errorf("restore of task %s: storage %s holds %d complete checkpoints of it, but every one is retired: refusing to report no checkpoint (to restore one, remove its retired markers, chk/<N>/retired*, in storage)", o.Task, o.Store, valid)
	}
	if fenced > 0 {
		return fmt.Errorf("%w: storage %s holds no checkpoint of task %s in job %s (only %d fenced ones, committed by a superseded owner after a takeover)", ErrNoCheckpoint, o.Store, o.Task, o.Job, fenced)
	}
	return fmt.Errorf("%w: storage %s holds no checkpoint of task %s in job %s", ErrNoCheckpoint, o.Store, o.Task, o.Job)
}

// isEmptyOrAbsent reports whether target is absent or an empty directory.
// With parent, target's name is looked up in it, not followed if a
// symlink; without, target's path is.
func isEmptyOrAbsent(parent *os.File, target string) (bool, error) {
	var d *os.File
	var err error
	if parent != nil {
		d, err = safefs.OpenDirAt(parent, filepath.Base(target))
	} else {
		d, err = os.Open(target)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("restore target: %w", err)
	}
	defer d.Close()
	entries, err := d.ReadDir(1)
	if err != nil && err != io.EOF {
		return false, fmt.Errorf("restore target: %w", err)
	}
	return len(entries) == 0, nil
}

// fromLocal takes a file from the local copy if it is there and matches
// the manifest: its bytes hash to the manifest's hash, or, with
// trustUnchanged, it is still the inode its checkpoint completed with.
// Shared files are hard-linked (copied across devices); private files are
// copied, since the engine may append to them. Everything is relative to
// ldir, the local copy's directory as opened, and tmp: the file is opened
// without following a symlink, checked through that open file, and a hard
// link is kept only if it is that very inode, so nothing from outside the
// local dir (a name swapped meanwhile) is ever linked into the target.
func fromLocal(local *localrecovery.Local, ldir, tmp *os.File, f manifests.File, trustUnchanged bool) (bool, error) {
	in, err := safefs.OpenFileAt(ldir, f.Name)
	if err != nil {
		return false, nil
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != f.Size {
		return false, nil
	}
	if !trustUnchanged || !local.UnchangedInfo(f.Name, fi) {
		sum, _, err := manifests.HashReader(context.Background(), in, f.Alg())
		if err != nil || f.Check(sum) != nil {
			return false, nil
		}
		if _, err := in.Seek(0, io.SeekStart); err != nil {
			return false, nil
		}
	}
	if f.Kind == manifests.Shared {
		err := failpoint.Error(failpoint.LocalWrite)
		if err == nil {
			err = unix.Linkat(int(ldir.Fd()), f.Name, int(tmp.Fd()), f.Name, 0)
		}
		if err == nil {
			var st unix.Stat_t
			want := fi.Sys().(*syscall.Stat_t)
			if unix.Fstatat(int(tmp.Fd()), f.Name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
				return true, nil
			}
			// Not the inode checked: the name changed meanwhile.
			unix.Unlinkat(int(tmp.Fd()), f.Name, 0)
			return false, nil
		}
		if !errors.Is(err, syscall.EXDEV) {
			return false, &os.LinkError{Op: "link", Old: filepath.Join(ldir.Name(), f.Name), New: filepath.Join(tmp.Name(), f.Name), Err: err}
		}
	}
	if err := writeVerified(tmp, f.Name, in, f, nil, true); err != nil {
		unix.Unlinkat(int(tmp.Fd()), f.Name, 0)
		return false, nil // changed under us: take it from storage
	}
	return true, nil
}

// fromStorage writes a file from its inline bytes or its object, verifying
// size and hash; a mismatch fails the restore loudly. The file's writeback
// is started, not waited for: the caller makes it durable (syncAll).
func fromStorage(ctx context.Context, s storage.Store, dir *os.File, f manifests.File, progress func(int64)) error {
	if f.Inline != nil {
		if err := writeVerified(dir, f.Name, &sliceReader{b: f.Inline}, f, progress, false); err != nil {
			return err
		}
		return nil
	}
	if rr, ok := ranged(s, f); ok {
		return fetchRanged(ctx, rr, dir, f, progress)
	}
	rc, err := s.Get(ctx, f.Key)
	if err != nil {
		return err
	}
	defer rc.Close()
	return writeVerified(dir, f.Name, rc, f, progress, false)
}

type sliceReader struct{ b []byte }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// writeVerified streams r into a new file name of dir (created, never
// through a symlink) while hashing, then checks size and SHA-256 and, with
// syncNow, fsyncs; without, it starts the writeback and leaves the wait
// for it to syncAll.
func writeVerified(dir *os.File, name string, r io.Reader, f manifests.File, progress func(int64), syncNow bool) error {
	full := filepath.Join(dir.Name(), name) // for messages: a write error names the directory
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return &os.PathError{Op: "create", Path: full, Err: err}
	}
	out := os.NewFile(uintptr(fd), full)
	defer out.Close()
	v := newVerifier(f)
	w := io.MultiWriter(out, v)
	var n int64
	bp := fsutil.GetBuf()
	defer fsutil.PutBuf(bp)
	buf := *bp
	for {
		k, rerr := r.Read(buf)
		if k > 0 {
			if n+int64(k) > f.Size {
				return fmt.Errorf("object is larger than the %d bytes the manifest says", f.Size)
			}
			if err := failpoint.Error(failpoint.LocalWrite); err != nil {
				return &os.PathError{Op: "write", Path: full, Err: err}
			}
			if _, err := w.Write(buf[:k]); err != nil {
				return err
			}
			n += int64(k)
			if progress != nil {
				progress(int64(k))
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if err := v.check(); err != nil {
		return err
	}
	if !syncNow {
		// Only a hint: an error here surfaces in syncAll's fdatasync.
		unix.SyncFileRange(int(out.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		return out.Close()
	}
	if err := failpoint.Error(failpoint.LocalSync); err != nil {
		return &os.PathError{Op: "sync", Path: full, Err: err}
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}

// verifier checks a file's bytes against the manifest: its size and its
// content hash (SHA-256 or BLAKE3, as the manifest says). Every restored byte, local or remote, whole or
// in pieces, goes through one; it is the one place that knows the hash.
type verifier struct {
	f manifests.File
	h *manifests.Hasher
	n int64
}

func newVerifier(f manifests.File) *verifier { return &verifier{f: f, h: f.NewHasher()} }

// Write hashes p, the next bytes of the file in order.
func (v *verifier) Write(p []byte) (int, error) {
	v.n += int64(len(p))
	return v.h.Write(p)
}

// check reports whether the bytes written were the manifest's file.
func (v *verifier) check() error {
	if v.n != v.f.Size {
		return fmt.Errorf("got %d bytes, the manifest says %d", v.n, v.f.Size)
	}
	if err := v.f.Check(v.h.Digest()); err != nil {
		return fmt.Errorf("%w: the stored object is corrupt", err)
	}
	return nil
}

// ResumePoint returns where in the write-ahead log a restore with o (its
// Store, Job, Task, Checkpoint, JobConsistent and To) would end: the
// checkpoint it picks, the epoch that wrote it and the last WAL manifest
// of the usable chain; nil when it would apply no WAL. A restore op takes
// the task over with it in the new ownership record (wal_resumed), so that
// the WAL the restore applies stays usable under the new owner, and what
// the old owner ships after it never is.
func ResumePoint(ctx context.Context, o Options) (*manifests.WALResumed, error) {
	if DefaultTo(o.To, o.Checkpoint, o.JobConsistent) != ToLatest {
		return nil, nil
	}
	n, err := pick(ctx, o)
	if err != nil {
		return nil, err
	}
	cat, err := manifests.Scan(ctx, o.Store, o.Job, o.Task)
	if err != nil {
		return nil, err
	}
	for _, r := range cat.Retained(o.Task) {
		if r.Checkpoint != n {
			continue
		}
		chain, _, err := wal.UsableChain(ctx, o.Store, o.Job, o.Task, n, r.Epoch)
		if err != nil || len(chain) == 0 {
			return nil, err
		}
		return &manifests.WALResumed{Checkpoint: n, Epoch: r.Epoch, Seq: chain[len(chain)-1].Seq}, nil
	}
	return nil, nil
}
