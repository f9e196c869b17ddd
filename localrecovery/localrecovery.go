// Package localrecovery is the task-local store on the node: the sync phase
// hard-links a snapshot into it, and it keeps the newest complete checkpoint
// of each task (and those in flight) so that a restart on the same node
// restores without the network.
//
// Layout under <local-dir>/<job>/<task>/:
//
//	<N:020>/            hard links to the snapshot's files (copies across devices)
//	<N:020>.manifest    the committed manifest: present iff checkpoint N is complete
//
// Hard links cost no bytes and no time proportional to the state, but need
// the local dir on the same filesystem as the app's store; across devices
// the files are copied, which is slow, and the Snapshot says so (Copied) so
// the agent can warn. So are the files the kernel refuses to link because
// the agent runs as another user (CopiedNotPermitted). The sync phase works on the snapshot dir through the handle the
// agent opened under its allowed root (TakeDir), never through its path,
// and Inspect refuses files not owned by the snapshot dir's owner (the
// rule against hard links to other users' files; see Inspect for what it
// does and does not guarantee). Nothing here is fsynced: a local copy is a cache that every restore
// verifies against the manifest's checksums, never a source of truth.
package localrecovery

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/internal/safefs"
	"github.com/ckpt-io/ckpt/manifests"
)

// Store is the local store of one job.
type Store struct {
	root string
	// bg counts removals of discarded checkpoint dirs still running.
	bg sync.WaitGroup
	// trashSeq names discarded dirs uniquely.
	trashSeq atomic.Uint64
	// pending holds discarded dirs whose removal waits for
	// RemoveDiscarded (see CompleteInspected).
	pendingMu sync.Mutex
	pending   []string
}

// trashDir holds discarded checkpoint dirs while they are removed in the
// background. Task names start with a letter or digit, so it is no task's.
const trashDir = ".discarded"

// Open opens (creating if needed) the local store of job under dir.
func Open(dir, job string) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("local dir %q: must be an absolute path", dir)
	}
	if err := manifests.ValidName("job", job); err != nil {
		return nil, err
	}
	root := filepath.Join(dir, job)
	if err := os.MkdirAll(root, 0o750); err != nil {
		return nil, fmt.Errorf("local dir: %w (check --local-dir and its permissions)", err)
	}
	// Left by a process that stopped while removing discarded copies. The
	// removal is housekeeping: another Store open on the same dir (a
	// restore into the agent's local dir) may be discarding into it right
	// now, and what is left is removed by a later Open.
	os.RemoveAll(filepath.Join(root, trashDir))
	return &Store{root: root}, nil
}

// Wait waits for the removals of discarded checkpoint dirs that Discard
// left running in the background, starting those CompleteInspected left
// pending first.
func (s *Store) Wait() {
	s.RemoveDiscarded()
	s.bg.Wait()
}

// RemoveDiscarded starts, in the background, the removal of the copies
// that CompleteInspected discarded (Wait waits for it): the agent calls it
// once it has answered completed, so that thousands of unlinks do not
// compete with the end of the checkpoint for the CPU.
func (s *Store) RemoveDiscarded() {
	s.pendingMu.Lock()
	dirs := s.pending
	s.pending = nil
	s.pendingMu.Unlock()
	if len(dirs) == 0 {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		for _, d := range dirs {
			os.RemoveAll(d) // what fails here goes at the next Open
		}
	}()
}

// Root is the job's directory in the local store.
func (s *Store) Root() string { return s.root }

// File is one file of a snapshot in the local store, with the identity of
// its inode: same device, inode, size and mtime as a file held by the local
// copy of a complete checkpoint means the same immutable bytes.
type File struct {
	Name    string
	Size    int64
	Dev     uint64
	Ino     uint64
	ModTime int64 // nanoseconds
}

// Identity keys the inode-level identity of a file.
type Identity struct {
	Dev, Ino uint64
	Size     int64
	ModTime  int64
}

// ID returns the file's identity.
func (f File) ID() Identity { return Identity{f.Dev, f.Ino, f.Size, f.ModTime} }

// Snapshot is a checkpoint's files as linked into the local store.
type Snapshot struct {
	Task       string
	Checkpoint uint64
	Dir        string
	Files      []File // sorted by name
	// Copied counts files that had to be copied because the snapshot lives on
	// another device than the local store.
	Copied int
	// CopiedNotPermitted counts files copied because the kernel refused
	// to hard-link them (EPERM): the agent runs as another uid than the
	// app, does not own them and may not write them, and
	// fs.protected_hardlinks is on (see LinkNotPermittedError). They are
	// counted in Copied too.
	CopiedNotPermitted int
	// HandedOff is true when the snapshot directory itself was moved into
	// the store (Take with handoff).
	HandedOff bool
	names     []string
	// owner is the uid owning the snapshot dir; copied names the files
	// copied (their owner was checked on the source).
	owner  uint32
	copied map[string]bool
	// dirDev and dirIno identify Dir, the agent's directory: Inspect and
	// Open work only on that inode.
	dirDev, dirIno uint64
}

// Path returns the local path of a file of the snapshot.
func (sn *Snapshot) Path(name string) string { return filepath.Join(sn.Dir, name) }

// BadFileError says a snapshot dir holds something other than regular files.
type BadFileError struct {
	Name   string
	Reason string
}

func (e *BadFileError) Error() string {
	return fmt.Sprintf("snapshot file %q: %s (only regular files are checkpointed)", e.Name, e.Reason)
}

func (s *Store) taskDir(task string) string { return filepath.Join(s.root, task) }

func (s *Store) chkDir(task string, n uint64) string {
	return filepath.Join(s.taskDir(task), fmt.Sprintf("%020d", n))
}

func (s *Store) manifestPath(task string, n uint64) string { return s.chkDir(task, n) + ".manifest" }

// idsPath holds the inode identities of a complete checkpoint's local files
// as they were when it completed (see Local.UnchangedInfo).
func (s *Store) idsPath(task string, n uint64) string { return s.chkDir(task, n) + ".ids" }

// Take is TakeDir for a snapshot dir named by a path the caller trusts
// (its own): only its last component must not be a symlink.
func (s *Store) Take(task string, n uint64, src string, handoff bool) (*Snapshot, error) {
	d, err := safefs.Open(src)
	if err != nil {
		if errors.Is(err, safefs.ErrUnsafe) {
			return nil, &BadFileError{Name: src, Reason: "is not a directory or is a symlink"}
		}
		return nil, fmt.Errorf("open snapshot dir: %w", err)
	}
	defer d.Close()
	return s.TakeDir(task, n, d, handoff)
}

// TakeDir is the sync phase: it puts every file of src into the local store
// as checkpoint n of task, and does nothing else that costs per byte: no
// hashing, no fsync, no network.
//
// src is an open directory (see safefs), and every operation on its files
// goes through its fd: the entries are read from the fd, each file is
// hard-linked with linkat(src, name, dst, name, 0) (which never follows a
// symlink), and a copy (across devices, or where the kernel refuses the
// link: see LinkNotPermittedError) opens the file with
// openat(src, name, O_NOFOLLOW). A path the peer could swap is never
// walked again. This costs one link(2) per file, about 20 µs each on ext4.
// With handoff true the caller gives src up (it would delete it after
// synced anyway), and TakeDir renames the directory itself into the store
// with renameat from src's verified parent: one rename(2) whatever the
// number of files. It falls back to linking when the rename is impossible
// (another device, permissions, src opened as a root).
//
// src must hold only regular files, checked from the directory entries'
// types: anything else (symlink, directory, device, socket) fails the whole
// snapshot with a *BadFileError and leaves nothing behind. Inspect checks
// the files themselves afterwards, before any byte is read, including
// their owner (see Inspect).
func (s *Store) TakeDir(task string, n uint64, src *safefs.Dir, handoff bool) (*Snapshot, error) {
	var dirSt unix.Stat_t
	if err := unix.Fstat(src.Fd(), &dirSt); err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	names, err := listNames(src.Fd())
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, &BadFileError{Name: src.Path(), Reason: "snapshot dir is empty"}
	}
	dst := s.chkDir(task, n)
	if err := os.RemoveAll(dst); err != nil { // left by an aborted or crashed attempt
		return nil, fmt.Errorf("local store: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
		return nil, fmt.Errorf("local store: %w", err)
	}
	taskDir, err := safefs.OpenRoot(filepath.Dir(dst))
	if err != nil {
		return nil, fmt.Errorf("local store: %w", err)
	}
	defer taskDir.Close()
	sn := &Snapshot{Task: task, Checkpoint: n, Dir: dst, names: names, owner: dirSt.Uid}
	if parent, name := src.Parent(); handoff && parent != nil {
		if handOff(parent, name, taskDir, filepath.Base(dst), &dirSt) {
			sn.HandedOff = true
			sn.dirDev, sn.dirIno = uint64(dirSt.Dev), dirSt.Ino
			return sn, nil
		}
	}
	if err := unix.Mkdirat(int(taskDir.Fd()), filepath.Base(dst), 0o750); err != nil {
		return nil, fmt.Errorf("local store: %w", &os.PathError{Op: "mkdir", Path: dst, Err: err})
	}
	to, err := safefs.OpenDirAt(taskDir, filepath.Base(dst))
	if err != nil {
		os.RemoveAll(dst)
		return nil, fmt.Errorf("local store: %w", err)
	}
	defer to.Close()
	var toSt unix.Stat_t
	if err := unix.Fstat(int(to.Fd()), &toSt); err != nil {
		os.RemoveAll(dst)
		return nil, fmt.Errorf("local store: %w", err)
	}
	sn.dirDev, sn.dirIno = uint64(toSt.Dev), toSt.Ino
	sfd, dfd := src.Fd(), int(to.Fd())
	for _, name := range names {
		err := failpoint.Error(failpoint.LocalWrite)
		if err == nil {
			err = unix.Linkat(sfd, name, dfd, name, 0)
		}
		if err == nil {
			continue
		}
		notPermitted := errors.Is(err, unix.EPERM)
		if !errors.Is(err, unix.EXDEV) && !notPermitted {
			os.RemoveAll(dst)
			return nil, fmt.Errorf("link %s into the local store %s: %w", name, dst, err)
		}
		if err := copyAt(src.File(), to, name, dirSt.Uid); err != nil {
			os.RemoveAll(dst)
			var bad *BadFileError
			if errors.As(err, &bad) {
				return nil, err
			}
			if notPermitted {
				return nil, &LinkNotPermittedError{Name: name, LocalDir: dst, CopyErr: err}
			}
			return nil, fmt.Errorf("copy %s into the local store %s: %w", name, dst, err)
		}
		if notPermitted {
			sn.CopiedNotPermitted++
		}
		sn.Copied++
		if sn.copied == nil {
			sn.copied = map[string]bool{}
		}
		sn.copied[name] = true
	}
	return sn, nil
}

// LinkNotPermittedError says the kernel refused to hard-link a snapshot
// file into the local store (EPERM) and the copy that replaces the link
// failed too. Linux refuses link(2) to a file the caller neither owns nor
// may read and write when fs.protected_hardlinks is 1 (the default): an
// agent running as another uid than the app that made the snapshot.
type LinkNotPermittedError struct {
	Name     string // the snapshot file
	LocalDir string // where it was to be linked
	CopyErr  error  // why the copy failed
}

func (e *LinkNotPermittedError) Error() string {
	return fmt.Sprintf("link %s into the local store %s: operation not permitted: the agent runs as another user than the one owning the file, "+
		"and the kernel refuses hard links to files it may not both read and write (fs.protected_hardlinks); "+
		"copying it instead failed too: %v; run the agent as the app's uid, or let the agent read the snapshot files "+
		"(e.g. a group both share, and files created group-readable), or make the agent's uid the owner",
		e.Name, e.LocalDir, e.CopyErr)
}

func (e *LinkNotPermittedError) Unwrap() error { return unix.EPERM }

// handOff renames the snapshot dir name in parent to to/chk, and keeps it
// there only if it is the directory that was opened and listed (dir): a
// peer that swapped the name in between gets its entry back.
//
// A directory kept is then made the agent's (see seize) before TakeDir
// returns, so before "synced": from then on the peer, which may still hold
// a handle to it, can no longer add, remove or swap its entries, and what
// Inspect checks stays what is read. Where the agent cannot take it over
// (it runs unprivileged, and the peer is another user), the directory goes
// back and its files are linked instead.
func handOff(parent *os.File, name string, to *os.File, chk string, dir *unix.Stat_t) bool {
	if failpoint.Error(failpoint.LocalRename) != nil {
		return false
	}
	if unix.Renameat(int(parent.Fd()), name, int(to.Fd()), chk) != nil {
		return false
	}
	if d, err := safefs.OpenDirAt(to, chk); err == nil {
		var st unix.Stat_t
		ok := unix.Fstat(int(d.Fd()), &st) == nil && st.Dev == dir.Dev && st.Ino == dir.Ino && seize(d, dir)
		d.Close()
		if ok {
			return true
		}
	}
	unix.Renameat2(int(to.Fd()), chk, int(parent.Fd()), name, unix.RENAME_NOREPLACE)
	return false
}

// seize makes the handed-off directory d the agent's: owned by its uid and
// gid, mode 0750 (as the directories the store makes). Write and search
// permission are checked at each operation, also through a handle opened
// before, so the peer that made d can change nothing in it afterwards
// (unless it runs as the agent's own uid, which reads what the agent reads
// anyway). It is false, d as it was, when the agent may not: then the
// directory is given back.
func seize(d *os.File, was *unix.Stat_t) bool {
	fd := int(d.Fd())
	if unix.Fchown(fd, os.Geteuid(), os.Getegid()) != nil {
		return false
	}
	if unix.Fchmod(fd, 0o750) != nil {
		unix.Fchown(fd, int(was.Uid), int(was.Gid))
		return false
	}
	return true
}

// copyAt copies the regular file name of dir into to, opened without
// following a symlink. The copy is a new inode of the agent's, so the
// owner rule of Inspect is applied here, to the file that was opened.
func copyAt(dir, to *os.File, name string, owner uint32) error {
	in, err := safefs.OpenFileAt(dir, name)
	if err != nil {
		if errors.Is(err, safefs.ErrUnsafe) || errors.Is(err, safefs.ErrNotRegular) {
			return &BadFileError{Name: name, Reason: "changed into a non-regular file while being taken"}
		}
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if reason := foreign(fi, owner); reason != "" {
		return &BadFileError{Name: name, Reason: reason}
	}
	fd, err := unix.Openat(int(to.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(fd), name)
	return writeAndClose(out, in)
}

// foreign applies the owner rule to a snapshot file: it returns why the
// file is refused, or "" (see Snapshot.Inspect).
func foreign(fi fs.FileInfo, owner uint32) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == owner {
		return ""
	}
	return foreignUID(st.Uid, owner)
}

func foreignUID(uid, owner uint32) string {
	return fmt.Sprintf("is owned by uid %d, not by uid %d that owns the snapshot dir (a hard link to another user's file?)", uid, owner)
}

// Inspect stats every file of a snapshot taken into the store and fills
// Files with their sizes and inode identities. It checks what is in the
// store, not what was listed: an entry swapped for a symlink in between
// (linkat(2) without AT_SYMLINK_FOLLOW does not follow one) fails here
// with a *BadFileError, before anything is read or uploaded.
//
// It also refuses, with a *BadFileError, a file whose owner (uid) is not
// the owner of the snapshot dir. This is the rule against hard links: a
// snapshot file may be a hard link to an inode that has other names
// outside the allowed roots, and those names cannot be found cheaply
// (st_nlink is no help: engine checkpoints are hard links by design, and
// the count changes as the app deletes its snapshot after synced). What
// the rule guarantees: every file shipped belongs to the uid that owns the
// snapshot dir, so a peer that made its snapshot dir can ship only inodes
// its own uid owns, which it could read (or chmod and read) anyway;
// another user's file (root's, another tenant's) hard-linked into a
// snapshot is refused, whether or not fs.protected_hardlinks let the link
// be made. What it cannot guarantee: that a file owned by that uid has no
// name outside the roots (one of the peer's own files elsewhere passes);
// and a snapshot dir owned by root admits root's files, so a peer that can
// make root-owned directories inside a root is not confined by it. The
// owner is read from the inode itself (fstat, and for a copy the opened
// source), so a swap of the name in between cannot dodge it.
func (sn *Snapshot) Inspect() error {
	// One directory handle and fstatat(2) per name: no path to resolve and
	// no FileInfo to allocate per file (a checkpoint of 100,000 files
	// inspects each one).
	d, err := sn.openDir()
	if err != nil {
		return err
	}
	defer d.Close()
	fd := int(d.Fd())
	// In name order: the manifest's order, and for an engine's sequential
	// file numbers close to inode order.
	names := slices.Clone(sn.names)
	slices.Sort(names)
	files := make([]File, len(names))
	// Large snapshots are stat'ed by a few threads, each a run of names:
	// the stats are system calls, and the files of a state of 100,000
	// make most of an incremental checkpoint's time.
	workers := 1
	if len(names) >= inspectSplit {
		workers = min(runtime.GOMAXPROCS(0), inspectWorkers)
	}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*len(names)/workers, (w+1)*len(names)/workers
		wg.Go(func() { errs[w] = sn.inspect(fd, names[lo:hi], files[lo:hi]) })
	}
	wg.Wait()
	for _, err := range errs { // the first file's error, in name order
		if err != nil {
			return err
		}
	}
	if n, err := countDirents(fd); err != nil || n != len(names) {
		return &BadFileError{Name: sn.Dir, Reason: "the snapshot changed while being taken"}
	}
	sn.Files = files
	return nil
}

// openDir opens the snapshot's directory in the store, the inode TakeDir
// made or took over, without following a symlink.
func (sn *Snapshot) openDir() (*os.File, error) {
	fd, err := unix.Open(sn.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", &os.PathError{Op: "open", Path: sn.Dir, Err: err})
	}
	d := os.NewFile(uintptr(fd), sn.Dir)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		d.Close()
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	if sn.dirIno != 0 && (uint64(st.Dev) != sn.dirDev || st.Ino != sn.dirIno) {
		d.Close()
		return nil, &BadFileError{Name: sn.Dir, Reason: "the snapshot dir in the local store was replaced"}
	}
	return d, nil
}

// Open opens the file f of the snapshot, as Inspect listed it in Files,
// for reading: through the snapshot's directory handle, without following
// a symlink, and only if it is still the very inode Inspect checked (same
// device and inode). Every read of a snapshot's bytes goes through Open,
// so a name swapped after the inspection (for a symlink, or for another
// file) is never read; the error says so without saying anything about
// what the name now holds.
func (sn *Snapshot) Open(f File) (*os.File, error) {
	d, err := sn.openDir()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	r, err := safefs.OpenFileAt(d, f.Name)
	if errors.Is(err, safefs.ErrUnsafe) || errors.Is(err, safefs.ErrNotRegular) {
		return nil, &BadFileError{Name: f.Name, Reason: "was replaced after it was inspected (snapshot files must not change until completed)"}
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot file %s: %w", f.Name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(r.Fd()), &st); err != nil {
		r.Close()
		return nil, fmt.Errorf("snapshot file %s: %w", f.Name, err)
	}
	if uint64(st.Dev) != f.Dev || st.Ino != f.Ino {
		r.Close()
		return nil, &BadFileError{Name: f.Name, Reason: "was replaced after it was inspected (snapshot files must not change until completed)"}
	}
	return r, nil
}

// inspectSplit is the fewest files Inspect splits among threads, and
// inspectWorkers the most threads it uses.
const (
	inspectSplit   = 4096
	inspectWorkers = 4
)

// inspect stats names in the directory fd into files (same index), and
// checks each one: a regular file, of the snapshot dir's owner.
func (sn *Snapshot) inspect(fd int, names []string, files []File) error {
	for i, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("snapshot file %s: %w", name, &os.PathError{Op: "lstat", Path: filepath.Join(sn.Dir, name), Err: err})
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return &BadFileError{Name: name, Reason: "changed into a non-regular file while being taken"}
		}
		if st.Uid != sn.owner && !sn.copied[name] {
			return &BadFileError{Name: name, Reason: foreignUID(st.Uid, sn.owner)}
		}
		files[i] = File{Name: name, Size: st.Size, Dev: uint64(st.Dev), Ino: st.Ino, ModTime: st.Mtim.Nano()}
	}
	return nil
}

// listNames reads the names of the snapshot dir fd and checks each entry:
// a plain file name, a regular file by its directory entry's type (an
// fstatat(2) where the filesystem does not say). The names share one
// allocation; the first entry that fails, in the order read, is the error.
func listNames(fd int) ([]string, error) {
	var arena []byte
	var ends []int
	bad, badReason := -1, ""
	err := readDirents(fd, func(name []byte, typ uint8) error {
		if bad < 0 {
			reason := direntKind(typ)
			if typ == unix.DT_UNKNOWN {
				var st unix.Stat_t
				if err := unix.Fstatat(fd, string(name), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return fmt.Errorf("snapshot file %s: %w", name, err)
				}
				reason = modeKind(st.Mode)
			}
			if reason != "" {
				bad, badReason = len(ends), reason
			}
		}
		arena = append(arena, name...)
		ends = append(ends, len(arena))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read snapshot dir: %w", err)
	}
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, fmt.Errorf("read snapshot dir: %w", err)
	}
	all := string(arena)
	names := make([]string, len(ends))
	start := 0
	for i, end := range ends {
		names[i] = all[start:end]
		start = end
		if err := manifests.ValidFileName(names[i]); err != nil {
			return nil, &BadFileError{Name: names[i], Reason: "unsafe name"}
		}
		if i == bad {
			return nil, &BadFileError{Name: names[i], Reason: badReason}
		}
	}
	return names, nil
}

// stat returns the identity of a regular file, nil if it is not regular.
func stat(p string) (*File, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	return fileOf(fi), nil
}

// fileOf is the identity of the regular file fi describes, nil if it is
// not regular.
func fileOf(fi fs.FileInfo) *File {
	if !fi.Mode().IsRegular() {
		return nil
	}
	f := &File{Name: fi.Name(), Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		f.Dev, f.Ino = uint64(st.Dev), uint64(st.Ino)
	}
	return f
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return err
	}
	return writeAndClose(out, in)
}

// Complete records checkpoint n of task as complete (m, and its encoded
// bytes as committed, beside its files) and removes the task's older local
// checkpoints. Checkpoints newer than n (in flight) are kept. It returns
// the complete local checkpoint.
func (s *Store) Complete(task string, n uint64, m *manifests.Manifest, manifest []byte) (*Local, error) {
	defer s.RemoveDiscarded()
	return s.CompleteInspected(task, n, m, manifest, nil)
}

// CompleteInspected is Complete for a snapshot whose files were inspected
// (Snapshot.Files) before they were hashed and uploaded: their identities
// then are the ones recorded, without a stat of every file again. A file
// written since has another mtime, so it can only fail the identity check
// later and be hashed, never pass it. The older copies leave the task at
// once, but their files are removed only from RemoveDiscarded (or Wait)
// on.
func (s *Store) CompleteInspected(task string, n uint64, m *manifests.Manifest, manifest []byte, inspected []File) (*Local, error) {
	if m.Task != task || m.Checkpoint != n {
		return nil, fmt.Errorf("local store: manifest of %s checkpoint %d recorded as %s checkpoint %d", m.Task, m.Checkpoint, task, n)
	}
	// The identities the files had when their hashes went into the manifest:
	// what Local.UnchangedInfo compares against. The inspected files are in
	// the manifest's order when the manifest is the snapshot's (no lookup
	// by name then).
	ids := make([]Identity, len(m.Files))
	var known map[string]Identity
	for i, f := range m.Files {
		var id Identity
		ok := false
		if len(inspected) == len(m.Files) && inspected[i].Name == f.Name {
			id, ok = inspected[i].ID(), true
		} else if len(inspected) > 0 {
			if known == nil {
				known = make(map[string]Identity, len(inspected))
				for _, f := range inspected {
					known[f.Name] = f.ID()
				}
			}
			id, ok = known[f.Name]
		}
		if ok && id.Size == f.Size {
			ids[i] = id
		} else if st, err := stat(filepath.Join(s.chkDir(task, n), f.Name)); err == nil && st != nil && st.Size == f.Size {
			ids[i] = st.ID()
		}
	}
	if err := failpoint.Error(failpoint.LocalWrite); err != nil {
		return nil, fmt.Errorf("local store: %w", &os.PathError{Op: "write", Path: s.idsPath(task, n), Err: err})
	}
	if err := os.WriteFile(s.idsPath(task, n), encodeIDs(ids), 0o640); err != nil {
		return nil, fmt.Errorf("local store: %w", err)
	}
	p := s.manifestPath(task, n)
	tmp := p + ".tmp"
	if err := failpoint.Error(failpoint.LocalWrite); err != nil {
		return nil, fmt.Errorf("local store: %w", &os.PathError{Op: "write", Path: tmp, Err: err})
	}
	if err := os.WriteFile(tmp, manifest, 0o640); err != nil {
		os.Remove(tmp) // a partial record, which no later run would remove
		return nil, fmt.Errorf("local store: %w", err)
	}
	if err := failpoint.Error(failpoint.LocalRename); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("local store: %w", &os.LinkError{Op: "rename", Old: tmp, New: p, Err: err})
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("local store: %w", err)
	}
	nums, err := s.checkpoints(task)
	if err != nil {
		return nil, err
	}
	for _, old := range nums {
		if old < n {
			if err := s.discard(task, old, true); err != nil {
				return nil, err
			}
		}
	}
	return &Local{Checkpoint: n, Dir: s.chkDir(task, n), Manifest: m, ids: ids}, nil
}

// Lend moves the local copy of checkpoint n of task, described by m, into
// dir (an empty directory on the same filesystem) with one rename: a
// restore that trusts the copy then needs no per-file work. The store keeps
// no complete copy of n from then on, until Readopt records it again; Lend
// starts that by copying m's private files from dir into a new copy of n
// at once, before the engine that opens dir can append to them. It returns
// false, having changed nothing, when the copy cannot be moved (another
// filesystem, say): the caller then restores file by file.
func (s *Store) Lend(task string, n uint64, m *manifests.Manifest, dir string) bool {
	src := s.chkDir(task, n)
	// rename(2) replaces an empty directory; os.Rename refuses to.
	if err := syscall.Rename(src, dir); err != nil {
		return false
	}
	// The copy is gone from the store: so is its record.
	os.Remove(s.manifestPath(task, n))
	os.Remove(s.idsPath(task, n))
	if err := os.Mkdir(src, 0o750); err != nil {
		return true // Readopt finds no dir to fill, and records nothing
	}
	fill(src, dir, m, false, true)
	return true
}

// Readopt finishes what Lend started once the lent files are in their final
// place dir: in the background (Wait waits for it), it hard-links m's
// shared files from dir back into the copy of checkpoint m.Checkpoint and
// records the checkpoint complete again, with the identities its files
// have then. A file dir no longer holds (the engine compacted it away
// meanwhile) is left out; a later restore fetches it from storage.
func (s *Store) Readopt(task string, m *manifests.Manifest, encoded []byte, dir string) {
	dst := s.chkDir(task, m.Checkpoint)
	if fi, err := os.Stat(dst); err != nil || !fi.IsDir() {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		fill(dst, dir, m, true, false)
		s.Complete(task, m.Checkpoint, m, encoded)
	}()
}

// Discard removes checkpoint n of task from the local store. Its dir
// leaves the task at once (one rename); the thousands of unlinks of its
// files run in the background (Wait waits for them), off the path of the
// checkpoint that completed.
func (s *Store) Discard(task string, n uint64) error { return s.discard(task, n, false) }

// discard is Discard; with later, the removal of the files waits for
// RemoveDiscarded.
func (s *Store) discard(task string, n uint64, later bool) error {
	// The manifest goes first: without it the directory is only debris.
	if err := os.Remove(s.manifestPath(task, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local store: %w", err)
	}
	if err := os.Remove(s.idsPath(task, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local store: %w", err)
	}
	dir := s.chkDir(task, n)
	trash := filepath.Join(s.root, trashDir)
	gone := filepath.Join(trash, fmt.Sprintf("%s-%d-%d", task, n, s.trashSeq.Add(1)))
	err := os.Mkdir(trash, 0o750)
	if err == nil || errors.Is(err, fs.ErrExist) {
		err = os.Rename(dir, gone)
	}
	switch {
	case err == nil && later:
		s.pendingMu.Lock()
		s.pending = append(s.pending, gone)
		s.pendingMu.Unlock()
		return nil
	case err == nil:
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			os.RemoveAll(gone) // what fails here goes at the next Open
		}()
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("local store: %w", err)
	}
	return nil
}

// checkpoints lists the checkpoint numbers with a directory or manifest.
func (s *Store) checkpoints(task string) ([]uint64, error) {
	entries, err := os.ReadDir(s.taskDir(task))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local store: %w", err)
	}
	seen := map[uint64]bool{}
	var out []uint64
	for _, e := range entries {
		name := strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".manifest"), ".ids")
		if len(name) != 20 {
			continue
		}
		n, err := strconv.ParseUint(name, 10, 64)
		if err != nil || n == 0 || seen[n] {
			continue
		}
		seen[n] = true
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

// Local is a complete checkpoint kept in the local store.
type Local struct {
	Checkpoint uint64
	Dir        string
	Manifest   *manifests.Manifest
	// ids holds the identity of each file of Manifest.Files (same index)
	// when the checkpoint completed; the zero Identity when unknown.
	ids []Identity

	byNameOnce sync.Once
	byName     map[string]int // index in Manifest.Files
}

// UnchangedInfo reports whether the local file name, as fi (an os.Lstat or
// Fstat of it) describes it, is the very inode the checkpoint completed
// with, unwritten since: same device, inode, size and mtime as recorded
// then. Such a file holds the bytes whose SHA-256 the manifest names,
// unless the disk itself corrupted them (which mtime does not show): a
// restore that trusts it instead of hashing trades that check for speed,
// and must say so.
func (l *Local) UnchangedInfo(name string, fi fs.FileInfo) bool {
	l.byNameOnce.Do(func() {
		l.byName = make(map[string]int, len(l.ids))
		for i, f := range l.Manifest.Files {
			if i < len(l.ids) && l.ids[i] != (Identity{}) {
				l.byName[f.Name] = i
			}
		}
	})
	i, ok := l.byName[name]
	if !ok || !fi.Mode().IsRegular() {
		return false
	}
	f := File{Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	f.Dev, f.Ino = uint64(st.Dev), uint64(st.Ino)
	return f.ID() == l.ids[i]
}

// Path returns the local path of a file of the checkpoint.
func (l *Local) Path(name string) string { return filepath.Join(l.Dir, name) }

// IDs returns the identity each file of l.Manifest.Files had when the
// checkpoint completed, by index (the zero Identity when unknown; nil
// when none is known). The slice is l's: not to be changed.
func (l *Local) IDs() []Identity { return l.ids }

// Latest returns the newest complete checkpoint of task kept locally, or
// nil when there is none. A local manifest that fails its checks is
// treated as absent (the local store is a cache, not a source of truth).
func (s *Store) Latest(task string) (*Local, error) {
	nums, err := s.checkpoints(task)
	if err != nil {
		return nil, err
	}
	for i := len(nums) - 1; i >= 0; i-- {
		if l := s.load(task, nums[i]); l != nil {
			return l, nil
		}
	}
	return nil, nil
}

// GetFor returns the complete local copy of checkpoint m.Checkpoint of task
// if the manifest recorded with it is, byte for byte, encoded (the one
// storage holds, which m decodes): a copy left by another incarnation of
// the task under the same number is not it. Nil otherwise.
func (s *Store) GetFor(task string, m *manifests.Manifest, encoded []byte) *Local {
	n := m.Checkpoint
	data, err := os.ReadFile(s.manifestPath(task, n))
	if err != nil || m.Task != task || !bytes.Equal(data, encoded) {
		return nil
	}
	return s.withIDs(task, m)
}

func (s *Store) load(task string, n uint64) *Local {
	data, err := os.ReadFile(s.manifestPath(task, n))
	if err != nil {
		return nil
	}
	m, err := manifests.Decode(data)
	if err != nil || m.Task != task || m.Checkpoint != n {
		return nil
	}
	return s.withIDs(task, m)
}

// withIDs is the local checkpoint m describes, with the identities recorded
// at its completion.
func (s *Store) withIDs(task string, m *manifests.Manifest) *Local {
	l := &Local{Checkpoint: m.Checkpoint, Dir: s.chkDir(task, m.Checkpoint), Manifest: m}
	if b, err := os.ReadFile(s.idsPath(task, m.Checkpoint)); err == nil {
		l.ids = decodeIDs(b, m) // unreadable: nothing counts as unchanged
	}
	return l
}

// Recover tidies a task's local store after a restart: it keeps the newest
// complete checkpoint and removes everything else (attempts that were in
// flight when the previous agent stopped, and older copies).
func (s *Store) Recover(task string) (*Local, error) {
	latest, err := s.Latest(task)
	if err != nil {
		return nil, err
	}
	nums, err := s.checkpoints(task)
	if err != nil {
		return nil, err
	}
	for _, n := range nums {
		if latest == nil || n != latest.Checkpoint {
			if err := s.Discard(task, n); err != nil {
				return nil, err
			}
		}
	}
	return latest, nil
}

// Hashes is HashIndex for a checkpoint that just completed: the identities
// recorded at completion, without a stat of every file.
func (l *Local) Hashes() map[Identity]string {
	idx := make(map[Identity]string, len(l.ids))
	for i, mf := range l.Manifest.Files {
		if i < len(l.ids) && l.ids[i] != (Identity{}) {
			idx[l.ids[i]] = mf.Digest()
		}
	}
	return idx
}

// HashIndex maps the inode identity of each file the local copy l holds to
// its SHA-256 from l's manifest. Because l holds a hard link to each of
// those inodes, no inode in the index can be freed and reused while l
// exists: a snapshot file with the same identity is the same bytes, and its
// hash need not be computed again.
func HashIndex(l *Local) map[Identity]string {
	idx := map[Identity]string{}
	if l == nil {
		return idx
	}
	for _, mf := range l.Manifest.Files {
		f, err := stat(l.Path(mf.Name))
		if err != nil || f == nil || f.Size != mf.Size {
			continue
		}
		idx[f.ID()] = mf.Digest()
	}
	return idx
}

// fill puts m's files from src into the local copy dst: the shared ones
// (immutable) as hard links, the private ones (the engine may append to
// them) as copies, each kind only if asked. It counts the files it put; a
// file it cannot put (another device, gone) is left out.
func fill(dst, src string, m *manifests.Manifest, shared, private bool) int {
	n := 0
	for _, f := range m.Files {
		from, to := filepath.Join(src, f.Name), filepath.Join(dst, f.Name)
		var err error
		switch {
		case f.Kind == manifests.Shared && shared:
			if err = failpoint.Error(failpoint.LocalWrite); err == nil {
				err = os.Link(from, to)
			}
		case f.Kind != manifests.Shared && private:
			err = copyFile(from, to)
		default:
			continue
		}
		if err == nil {
			n++
			failpoint.Hit(failpoint.MidAdopt) // Adopt, Lend, Readopt: n files put, the record not yet written
		}
	}
	return n
}

// Adopt records files already in place (a restored store in dir) as the
// complete local checkpoint of task described by m, and m itself. Shared
// files are hard-linked (they are immutable, and the shared inode is what
// lets the next checkpoint skip hashing them); private files are copied,
// since the engine that opens dir may append to them. A file that cannot be
// linked (another device, missing) is left out: a later restore falls back
// to storage for it. Adopt reports how many files it kept.
func (s *Store) Adopt(task string, m *manifests.Manifest, encoded []byte, dir string) (int, error) {
	dst := s.chkDir(task, m.Checkpoint)
	if err := os.RemoveAll(dst); err != nil {
		return 0, fmt.Errorf("local store: %w", err)
	}
	if err := os.MkdirAll(dst, 0o750); err != nil {
		return 0, fmt.Errorf("local store: %w", err)
	}
	linked := fill(dst, dir, m, true, true)
	if _, err := s.Complete(task, m.Checkpoint, m, encoded); err != nil {
		return linked, err
	}
	return linked, nil
}

// takeoverPath records, for task, the newest ownership epoch in storage
// when a restore from storage filled this local dir (see RecordTakeover).
func (s *Store) takeoverPath(task string) string {
	return filepath.Join(s.root, "."+task+".takeover-epoch")
}

// RecordTakeover notes that a restore of task into this node saw epoch as
// the newest ownership record in storage (0: none). An agent on this local
// dir may then take the task over from that owner, even one on another
// node: the restore is how a task moves to a new home. A later takeover by
// anyone else raises the newest epoch, and the note no longer matches.
func (s *Store) RecordTakeover(task string, epoch uint64) error {
	if err := manifests.ValidName("task", task); err != nil {
		return err
	}
	p := s.takeoverPath(task)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(epoch, 10)+"\n"), 0o644); err != nil {
		return fmt.Errorf("local dir: record the restore of task %s: %w", task, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("local dir: record the restore of task %s: %w", task, err)
	}
	return nil
}

// TakeoverEpoch returns the epoch RecordTakeover noted for task; ok is
// false when no restore noted one.
func (s *Store) TakeoverEpoch(task string) (epoch uint64, ok bool) {
	data, err := os.ReadFile(s.takeoverPath(task))
	if err != nil {
		return 0, false
	}
	e, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	return e, err == nil
}

// writeAndClose copies in into the new file out and closes it (the copy's write
// step, where the disk-fault suite fails writes).
func writeAndClose(out *os.File, in io.Reader) error {
	if err := failpoint.Error(failpoint.LocalWrite); err != nil {
		out.Close()
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
