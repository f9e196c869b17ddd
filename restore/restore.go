// Package restore rebuilds a task's store from a complete checkpoint: from
// the task-local copy where it is present and verifies, from storage for
// every other file. Every file is checked against the manifest's size and
// SHA-256 before the restore succeeds, and the target appears whole or not
// at all: files land in a temporary directory beside it, are fsynced, and
// the directory is renamed into place only when every file verified.
package restore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"

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
	// Checkpoint picks a retained checkpoint; 0 means the newest.
	Checkpoint uint64
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
}

// Result is what a restore did; its JSON is `ckpt restore --json`.
type Result struct {
	Restored    bool   `json:"restored"`
	Reason      string `json:"reason,omitempty"`
	Task        string `json:"task,omitempty"`
	Checkpoint  uint64 `json:"checkpoint,omitempty"`
	Files       int    `json:"files"`
	Bytes       int64  `json:"bytes"`
	BytesLocal  int64  `json:"bytes_local"`
	BytesRemote int64  `json:"bytes_remote"`
	FilesLocal  int    `json:"files_local"`
	FilesRemote int    `json:"files_remote"`
	// LocalFallbacks counts local files that were missing or corrupt and
	// came from storage instead.
	LocalFallbacks int `json:"local_fallbacks"`
	// LocalVerification says how local files were checked: "sha256" (every
	// byte hashed) or "identity" (TrustUnchangedLocal: unchanged inodes
	// trusted, the others hashed).
	LocalVerification string `json:"local_verification,omitempty"`
	// Moved is set when the local copy, whole and unchanged, was moved into
	// place in one rename (identity mode); the local dir then re-creates
	// its copy from the target in the background (Wait).
	Moved      bool   `json:"moved,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	Target     string `json:"target,omitempty"`

	wait func()
}

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
	if skip, err := checkTarget(target, o.IfNotExists); skip != nil || err != nil {
		return skip, err
	}
	r := &restorer{o: o, target: target}
	if err := r.choose(ctx); err != nil {
		if errors.Is(err, ErrNoCheckpoint) && o.IfCheckpointExists {
			return &Result{Restored: false, Reason: err.Error()}, nil
		}
		return nil, err
	}
	ctx, r.span = otel.Tracer("ckpt").Start(ctx, "restore", trace.WithAttributes(
		attribute.String("ckpt.job", o.Job), attribute.String("ckpt.task", o.Task), attribute.Int64("ckpt.checkpoint", int64(r.n)),
		attribute.Int("ckpt.files", len(r.m.Files)), attribute.Int64("ckpt.full_size", r.m.FullSize)))
	defer r.span.End()
	if o.LocalDir != "" {
		if r.ls, err = localrecovery.Open(o.LocalDir, o.Job); err != nil {
			return nil, err
		}
		r.local = r.ls.GetFor(o.Task, r.m, r.encoded)
	}
	if r.tmp, err = makeTemp(target); err != nil {
		return nil, err
	}
	res := &Result{Restored: true, Task: o.Task, Checkpoint: r.n, Files: len(r.m.Files), Bytes: r.m.FullSize, Target: target}
	if r.lend() {
		err = r.move(res)
	} else {
		err = r.fetch(ctx, res)
	}
	if err != nil {
		os.RemoveAll(r.tmp) // gone already if the store was placed
		return nil, err
	}
	res.DurationMS = time.Since(start).Milliseconds()
	return res, nil
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
// returns the result of a restore that does nothing.
func checkTarget(target string, ifNotExists bool) (*Result, error) {
	empty, err := isEmptyOrAbsent(target)
	if err != nil {
		return nil, err
	}
	if empty {
		return nil, nil
	}
	if ifNotExists {
		return &Result{Restored: false, Reason: "target already holds a store: " + target}, nil
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
	local   *localrecovery.Local // the local copy of n, if any
	tmp     string               // where files land before the target
	span    trace.Span
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
// still the inode it completed with.
func (r *restorer) lend() bool {
	return r.local != nil && r.o.TrustUnchangedLocal && wholeAndUnchanged(r.local, r.m) && r.ls.Lend(r.o.Task, r.n, r.m, r.tmp)
}

// move is the strategy for a lent local copy: the local copy is the store.
// Its private files get fsynced (an adopted copy never fsynced them); its
// shared files are the app's own SSTs, durable already. Once the store is
// in place the local dir re-creates its copy from it in the background.
func (r *restorer) move(res *Result) error {
	m := r.m
	for _, f := range m.Files {
		if f.Kind != manifests.Shared {
			if err := fsutil.SyncFile(filepath.Join(r.tmp, f.Name)); err != nil {
				return fmt.Errorf("restore: fsync %s: %w", f.Name, err)
			}
		}
	}
	if err := place(r.tmp, r.target); err != nil {
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
	if err := g.Wait(); err != nil {
		r.span.SetStatus(codes.Error, err.Error())
		return err
	}
	r.span.SetAttributes(attribute.Int64("ckpt.bytes_local", c.bLocal.Load()), attribute.Int64("ckpt.bytes_remote", c.bRemote.Load()),
		attribute.Int64("ckpt.local_fallbacks", c.fallbacks.Load()))
	if err := place(r.tmp, r.target); err != nil {
		return err
	}
	if r.local != nil {
		res.LocalVerification = "sha256"
		if o.TrustUnchangedLocal {
			res.LocalVerification = "identity"
		}
	}
	if r.ls != nil && (r.local == nil || c.fallbacks.Load() > 0) {
		// Restore inherits: the agent on this local dir will know these
		// files (and their inodes) as checkpoint n and upload none of them.
		// (When every file came from the local copy of n, that copy already
		// says so, and its shared files are the target's inodes.)
		if _, err := r.ls.Adopt(o.Task, m, r.encoded, r.target); err != nil {
			return fmt.Errorf("restore: record the restored checkpoint in the local dir: %w", err)
		}
	}
	res.BytesLocal, res.BytesRemote = c.bLocal.Load(), c.bRemote.Load()
	res.FilesLocal, res.FilesRemote = int(c.fLocal.Load()), int(c.fRemote.Load())
	res.LocalFallbacks = int(c.fallbacks.Load())
	if r.local == nil && o.LocalDir != "" {
		res.LocalFallbacks = 0 // no local copy at all: not a fallback per file
	}
	return nil
}

// fetchFile restores one file into tmp: from the local copy if it verifies
// there (else counted as a fallback), from storage otherwise.
func (r *restorer) fetchFile(ctx context.Context, f manifests.File, c *counts, progress func(int64)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dst := filepath.Join(r.tmp, f.Name)
	if r.local != nil {
		used, err := fromLocal(r.local, dst, f, r.o.TrustUnchangedLocal)
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
	if err := fromStorage(ctx, r.o.Store, dst, f, progress); err != nil {
		return fmt.Errorf("restore %s of %s checkpoint %d: %w", f.Name, r.o.Task, r.n, err)
	}
	c.bRemote.Add(f.Size) // inline bytes came from storage too, in the manifest
	c.fRemote.Add(1)
	return nil
}

// place makes the verified tree tmp the target: fsync tmp, rename, fsync
// the parent. The target appears whole or not at all.
func place(tmp, target string) error {
	if err := fsutil.SyncDir(tmp); err != nil {
		return fmt.Errorf("restore: fsync %s: %w", tmp, err)
	}
	failpoint.Hit(failpoint.BeforeRename) // every file verified and synced in tmp, target not yet there
	if err := os.Rename(tmp, target); err != nil {
		return fmt.Errorf("restore: move the verified store into place: %w", err)
	}
	if err := fsutil.SyncDir(filepath.Dir(target)); err != nil {
		return fmt.Errorf("restore: fsync %s: %w", filepath.Dir(target), err)
	}
	return nil
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

// pick chooses the checkpoint: the requested one if it is complete and
// retained, else the newest.
func pick(ctx context.Context, o Options) (uint64, error) {
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
		return 0, fmt.Errorf("%w: storage %s holds no checkpoint of task %s in job %s", ErrNoCheckpoint, o.Store, o.Task, o.Job)
	}
	return refs[len(refs)-1].Checkpoint, nil
}

func isEmptyOrAbsent(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("restore target: %w", err)
	}
	return len(entries) == 0, nil
}

func makeTemp(target string) (string, error) {
	parent := filepath.Dir(target)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	tmp := filepath.Join(parent, "."+filepath.Base(target)+".restore-"+hex.EncodeToString(b))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	return tmp, nil
}

// fromLocal takes a file from the local copy if it is there and matches
// the manifest: its bytes hash to the manifest's SHA-256, or, with
// trustUnchanged, it is still the inode its checkpoint completed with.
// Shared files are hard-linked (copied across devices); private files are
// copied, since the engine may append to them.
func fromLocal(local *localrecovery.Local, dst string, f manifests.File, trustUnchanged bool) (bool, error) {
	src := local.Path(f.Name)
	fi, err := os.Lstat(src)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != f.Size {
		return false, nil
	}
	if !trustUnchanged || !local.UnchangedInfo(f.Name, fi) {
		sum, _, err := fsutil.HashFile(context.Background(), src)
		if err != nil || sum != f.SHA256 {
			return false, nil
		}
	}
	if f.Kind == manifests.Shared {
		err := os.Link(src, dst)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, syscall.EXDEV) {
			return false, err
		}
	}
	in, err := os.Open(src)
	if err != nil {
		return false, nil
	}
	defer in.Close()
	if err := writeVerified(dst, in, f, nil); err != nil {
		os.Remove(dst)
		return false, nil // changed under us: take it from storage
	}
	return true, nil
}

// fromStorage writes a file from its inline bytes or its object, verifying
// size and hash; a mismatch fails the restore loudly.
func fromStorage(ctx context.Context, s storage.Store, dst string, f manifests.File, progress func(int64)) error {
	if f.Inline != nil {
		if err := writeVerified(dst, &sliceReader{b: f.Inline}, f, progress); err != nil {
			return err
		}
		return nil
	}
	rc, err := s.Get(ctx, f.Key)
	if err != nil {
		return err
	}
	defer rc.Close()
	return writeVerified(dst, rc, f, progress)
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

// writeVerified streams r into a new file dst while hashing, then checks
// size and SHA-256 and fsyncs.
func writeVerified(dst string, r io.Reader, f manifests.File, progress func(int64)) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	h := sha256.New()
	w := io.MultiWriter(out, h)
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
	if n != f.Size {
		return fmt.Errorf("got %d bytes, the manifest says %d", n, f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return fmt.Errorf("sha256 %s does not match the manifest's %s: the stored object is corrupt", got, f.SHA256)
	}
	// Each file is made durable by its own worker, in parallel. (One
	// syncfs(2) for the whole tree would wait for every dirty page of the
	// filesystem, the app's included: measured twice as slow on a busy node.)
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}
