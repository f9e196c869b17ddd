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
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/internal/safefs"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/telemetry"

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
func Run(ctx context.Context, o Options) (*Result, error) {
	start := time.Now()
	if err := manifests.ValidName("job", o.Job); err != nil {
		return nil, err
	}
	if err := manifests.ValidName("task", o.Task); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(o.Target) {
		return nil, fmt.Errorf("restore target %q must be an absolute path", o.Target)
	}
	target := filepath.Clean(o.Target)
	base := filepath.Base(target)
	if o.Parallelism < 1 {
		o.Parallelism = 8
	}
	var empty bool
	var err error
	if o.TargetParent != nil {
		empty, err = isEmptyOrAbsentAt(o.TargetParent, base)
	} else {
		empty, err = isEmptyOrAbsent(target)
	}
	if err != nil {
		return nil, err
	}
	if !empty {
		if o.IfNotExists {
			return &Result{Restored: false, Reason: "target already holds a store: " + target}, nil
		}
		return nil, fmt.Errorf("%w: %s holds files (use --if-not-exists to keep an existing store)", ErrTargetNotEmpty, target)
	}

	n, err := pick(ctx, o)
	if err != nil {
		if errors.Is(err, ErrNoCheckpoint) && o.IfCheckpointExists {
			return &Result{Restored: false, Reason: err.Error()}, nil
		}
		return nil, err
	}
	// The manifest is checked (format, checksum, names that cannot escape
	// the target) before anything is written.
	m, encoded, err := manifests.LoadEncoded(ctx, o.Store, o.Job, o.Task, n)
	if err != nil {
		return nil, err
	}

	ctx, span := telemetry.Tracer().Start(ctx, "restore", trace.WithAttributes(
		attribute.String("ckpt.job", o.Job), attribute.String("ckpt.task", o.Task), attribute.Int64("ckpt.checkpoint", int64(n)),
		attribute.Int("ckpt.files", len(m.Files)), attribute.Int64("ckpt.full_size", m.FullSize)))
	defer span.End()
	var local *localrecovery.Local
	var ls *localrecovery.Store
	if o.LocalDir != "" {
		if ls, err = localrecovery.Open(o.LocalDir, o.Job); err != nil {
			return nil, err
		}
		local = ls.GetFor(o.Task, m, encoded)
	}

	parent := o.TargetParent
	if parent == nil {
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		if parent, err = safefs.OpenRoot(filepath.Dir(target)); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		defer parent.Close()
	}
	tmpDir, tmpName, err := makeTemp(parent, base)
	if err != nil {
		return nil, err
	}
	defer func() { tmpDir.Close() }()
	// tmp and placed name the temporary dir, before and after it becomes
	// the target, for the code that needs a path (lending and adopting the
	// local copy). With TargetParent, placed is the fd's own path in /proc,
	// so that no path the peer could swap is walked; without /proc it
	// stays "" and adoption into the local dir is skipped.
	tmp, placed := filepath.Join(filepath.Dir(target), tmpName), target
	if o.TargetParent != nil {
		placed, _ = safefs.ProcPath(tmpDir)
	}
	ok := false
	defer func() {
		if !ok {
			removeTemp(parent, tmpName)
		}
	}()

	res := &Result{Restored: true, Task: o.Task, Checkpoint: n, Files: len(m.Files), Bytes: m.FullSize, Target: target}
	// Lending moves the local copy to tmp by its path: only for a target
	// whose path is the caller's own (no TargetParent).
	if local != nil && o.TrustUnchangedLocal && o.TargetParent == nil && wholeAndUnchanged(local, m) && ls.Lend(o.Task, n, m, tmp) {
		// The local copy is the store: it became tmp in one rename. Its
		// private files get fsynced (an adopted copy never fsynced them);
		// its shared files are the app's own SSTs, durable already.
		for _, f := range m.Files {
			if f.Kind != manifests.Shared {
				if err := syncFile(filepath.Join(tmp, f.Name)); err != nil {
					return nil, fmt.Errorf("restore: fsync %s: %w", f.Name, err)
				}
			}
		}
		lent, err := safefs.OpenDirAt(parent, tmpName)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		tmpDir.Close()
		tmpDir = lent
		if err := place(parent, tmpDir, tmpName, base, target); err != nil {
			return nil, err
		}
		ok = true
		ls.Readopt(o.Task, m, encoded, target)
		res.wait = ls.Wait
		res.Moved = true
		res.LocalVerification = "identity"
		res.BytesLocal, res.FilesLocal = m.FullSize, len(m.Files)
		if o.Progress != nil {
			o.Progress(m.FullSize, m.FullSize)
		}
		span.SetAttributes(attribute.Int64("ckpt.bytes_local", m.FullSize), attribute.Bool("ckpt.moved", true))
		res.DurationMS = time.Since(start).Milliseconds()
		return res, nil
	}
	var ldir *os.File // the local copy's dir: files are linked only from it
	if local != nil {
		if ldir, err = safefs.OpenRoot(local.Dir); err != nil {
			local = nil // no local copy after all: everything from storage
		} else {
			defer ldir.Close()
		}
	}
	var done, bLocal, bRemote, fLocal, fRemote, fallbacks atomic.Int64
	progress := func(k int64) {
		if o.Progress != nil {
			o.Progress(done.Add(k), m.FullSize)
		} else {
			done.Add(k)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Parallelism)
	for _, f := range m.Files {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			if local != nil {
				used, err := fromLocal(local, ldir, tmpDir, f, o.TrustUnchangedLocal)
				if err != nil {
					return fmt.Errorf("restore %s: %w", f.Name, err)
				}
				if used {
					bLocal.Add(f.Size)
					fLocal.Add(1)
					progress(f.Size)
					return nil
				}
				fallbacks.Add(1)
			}
			if err := fromStorage(gctx, o.Store, tmpDir, f, progress); err != nil {
				return fmt.Errorf("restore %s of %s checkpoint %d: %w", f.Name, o.Task, n, err)
			}
			bRemote.Add(f.Size) // inline bytes came from storage too, in the manifest
			fRemote.Add(1)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	span.SetAttributes(attribute.Int64("ckpt.bytes_local", bLocal.Load()), attribute.Int64("ckpt.bytes_remote", bRemote.Load()),
		attribute.Int64("ckpt.local_fallbacks", fallbacks.Load()))
	if err := place(parent, tmpDir, tmpName, base, target); err != nil {
		return nil, err
	}
	ok = true
	if local != nil {
		res.LocalVerification = "sha256"
		if o.TrustUnchangedLocal {
			res.LocalVerification = "identity"
		}
	}
	if ls != nil && placed != "" && (local == nil || fallbacks.Load() > 0) {
		// Restore inherits: the agent on this local dir will know these
		// files (and their inodes) as checkpoint n and upload none of them.
		// (When every file came from the local copy of n, that copy already
		// says so, and its shared files are the target's inodes.)
		if _, err := ls.Adopt(o.Task, m, encoded, placed); err != nil {
			return nil, fmt.Errorf("restore: record the restored checkpoint in the local dir: %w", err)
		}
	}
	res.BytesLocal, res.BytesRemote = bLocal.Load(), bRemote.Load()
	res.FilesLocal, res.FilesRemote = int(fLocal.Load()), int(fRemote.Load())
	res.LocalFallbacks = int(fallbacks.Load())
	if local == nil && o.LocalDir != "" {
		res.LocalFallbacks = 0 // no local copy at all: not a fallback per file
	}
	res.DurationMS = time.Since(start).Milliseconds()
	return res, nil
}

// place makes the verified tree tmpDir (named tmpName in parent) the
// target base in parent: fsync tmpDir, renameat relative to parent, fsync
// parent. The target appears whole or not at all; an empty directory
// already there is replaced. target names it in messages.
func place(parent, tmpDir *os.File, tmpName, base, target string) error {
	if err := tmpDir.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("restore: fsync %s: %w", tmpDir.Name(), err)
	}
	if err := unix.Renameat(int(parent.Fd()), tmpName, int(parent.Fd()), base); err != nil {
		return fmt.Errorf("restore: move the verified store into place at %s: %w", target, err)
	}
	if err := parent.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
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

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
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

// isEmptyOrAbsentAt is isEmptyOrAbsent for the entry name of parent,
// which must not be a symlink.
func isEmptyOrAbsentAt(parent *os.File, name string) (bool, error) {
	d, err := safefs.OpenDirAt(parent, name)
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

// makeTemp creates and opens the temporary directory the restore fills,
// beside the target base in parent.
func makeTemp(parent *os.File, base string) (*os.File, string, error) {
	b := make([]byte, 6)
	rand.Read(b)
	name := "." + base + ".restore-" + hex.EncodeToString(b)
	if err := unix.Mkdirat(int(parent.Fd()), name, 0o755); err != nil {
		return nil, "", fmt.Errorf("restore: create %s: %w", name, err)
	}
	d, err := safefs.OpenDirAt(parent, name)
	if err != nil {
		unix.Unlinkat(int(parent.Fd()), name, unix.AT_REMOVEDIR)
		return nil, "", fmt.Errorf("restore: %w", err)
	}
	return d, name, nil
}

// removeTemp removes the temporary directory name of parent and the files
// in it, relative to parent.
func removeTemp(parent *os.File, name string) {
	d, err := safefs.OpenDirAt(parent, name)
	if err != nil {
		return
	}
	entries, _ := d.ReadDir(-1)
	for _, e := range entries {
		unix.Unlinkat(int(d.Fd()), e.Name(), 0)
	}
	d.Close()
	unix.Unlinkat(int(parent.Fd()), name, unix.AT_REMOVEDIR)
}

// fromLocal takes a file from the local copy if it is there and matches
// the manifest: its bytes hash to the manifest's SHA-256, or, with
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
		sum, err := hashReader(in)
		if err != nil || sum != f.SHA256 {
			return false, nil
		}
		if _, err := in.Seek(0, io.SeekStart); err != nil {
			return false, nil
		}
	}
	if f.Kind == manifests.Shared {
		err := unix.Linkat(int(ldir.Fd()), f.Name, int(tmp.Fd()), f.Name, 0)
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
			return false, err
		}
	}
	if err := writeVerified(tmp, f.Name, in, f, nil); err != nil {
		unix.Unlinkat(int(tmp.Fd()), f.Name, 0)
		return false, nil // changed under us: take it from storage
	}
	return true, nil
}

// fromStorage writes a file from its inline bytes or its object, verifying
// size and hash; a mismatch fails the restore loudly.
func fromStorage(ctx context.Context, s storage.Store, dir *os.File, f manifests.File, progress func(int64)) error {
	if f.Inline != nil {
		if err := writeVerified(dir, f.Name, &sliceReader{b: f.Inline}, f, progress); err != nil {
			return err
		}
		return nil
	}
	rc, err := s.Get(ctx, f.Key)
	if err != nil {
		return err
	}
	defer rc.Close()
	return writeVerified(dir, f.Name, rc, f, progress)
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

// writeVerified streams r into a new file name of dir while hashing, then
// checks size and SHA-256 and fsyncs.
func writeVerified(dir *os.File, name string, r io.Reader, f manifests.File, progress func(int64)) error {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return &os.PathError{Op: "create", Path: name, Err: err}
	}
	out := os.NewFile(uintptr(fd), name)
	defer out.Close()
	h := sha256.New()
	w := io.MultiWriter(out, h)
	var n int64
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
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

// bufs holds the 1 MiB copy buffers of the workers: one per file would be
// a gigabyte of garbage per gigabyte restored.
var bufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func hashReader(f io.Reader) (string, error) {
	h := sha256.New()
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	if _, err := io.CopyBuffer(h, f, *bp); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
