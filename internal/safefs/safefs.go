// Package safefs opens directories that a peer names, once, without
// following a path string that the peer could swap afterwards: the
// directory is opened below an allowed root component by component, no
// component may be a symlink, and every later operation on it goes through
// the handle (its file descriptor), never through its path again.
//
// Symlinks are refused rather than followed: a caller that accepts
// symlinked request paths resolves them once (filepath.EvalSymlinks),
// checks the result lexically, and opens the resolved path here. If a
// component was swapped in between, the open fails; it never lands outside
// the root, because each step is relative to the directory the step before
// opened.
package safefs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Dir is a directory opened under a root through no symlink.
type Dir struct {
	f      *os.File
	parent *os.File // nil when the directory is the root itself
	name   string
	path   string
}

// File is the open directory. Its fd is what names it from now on.
func (d *Dir) File() *os.File { return d.f }

// Fd is the directory's file descriptor.
func (d *Dir) Fd() int { return int(d.f.Fd()) }

// Parent is the directory's parent, opened the same way, and Name its name
// there: what renameat needs to move the directory itself. Parent is nil
// when the directory is the root it was opened under.
func (d *Dir) Parent() (*os.File, string) { return d.parent, d.name }

// Path is the path the directory was opened by: for messages only.
func (d *Dir) Path() string { return d.path }

// Close closes the directory and its parent.
func (d *Dir) Close() error {
	err := d.f.Close()
	if d.parent != nil {
		d.parent.Close()
	}
	return err
}

// OpenRoot opens an allowed root. Its own path is the operator's and is
// followed as given; it must be a directory.
func OpenRoot(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Open opens the directory path whose own parent path is trusted (the
// caller's, followed as given); only the last component must not be a
// symlink. It is Beneath for callers without a root.
func Open(path string) (*Dir, error) {
	path = filepath.Clean(path)
	parent, err := OpenRoot(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	name := filepath.Base(path)
	f, err := OpenDirAt(parent, name)
	if err != nil {
		parent.Close()
		return nil, err
	}
	return &Dir{f: f, parent: parent, name: name, path: path}, nil
}

// Beneath opens rel, a relative path, below root (opened by OpenRoot,
// rootPath its path, for messages). No component of rel may be a symlink
// or "..": such a path fails with an error wrapping ErrUnsafe. It uses
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) where the kernel has it and
// an openat(O_NOFOLLOW|O_DIRECTORY) per component elsewhere; both resolve
// every step relative to the directory the step before opened.
func Beneath(root *os.File, rootPath, rel string) (*Dir, error) {
	rel = filepath.Clean(rel)
	full := filepath.Join(rootPath, rel)
	if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s: %w: not below %s", full, ErrUnsafe, rootPath)
	}
	if rel == "." {
		f, err := OpenDirAt(root, ".")
		if err != nil {
			return nil, err
		}
		return &Dir{f: f, path: full}, nil
	}
	parentRel, name := filepath.Dir(rel), filepath.Base(rel)
	parent, err := openPath(root, parentRel)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", full, err)
	}
	f, err := OpenDirAt(parent, name)
	if err != nil {
		parent.Close()
		return nil, fmt.Errorf("%s: %w", full, err)
	}
	return &Dir{f: f, parent: parent, name: name, path: full}, nil
}

// ErrUnsafe says a path has a symlink or ".." component, or a component
// that is not a directory: it cannot be opened without leaving the root.
var ErrUnsafe = errors.New("a path component is a symlink or not a directory")

// noOpenat2 is set once openat2(2) turned out to be missing.
var noOpenat2 atomic.Bool

// openPath opens the directory rel (clean, relative, no "..") below dir.
func openPath(dir *os.File, rel string) (*os.File, error) {
	if rel == "." {
		return OpenDirAt(dir, ".")
	}
	if !noOpenat2.Load() {
		fd, err := unix.Openat2(int(dir.Fd()), rel, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch {
		case err == nil:
			return os.NewFile(uintptr(fd), rel), nil
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
			noOpenat2.Store(true) // old kernel, or a seccomp filter that forbids it
		default:
			return nil, unsafe(rel, err)
		}
	}
	cur := dir
	for _, c := range strings.Split(rel, "/") {
		next, err := OpenDirAt(cur, c)
		if cur != dir {
			cur.Close()
		}
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

// OpenDirAt opens the directory name (one component, or ".") in dir
// without following a symlink: O_NOFOLLOW|O_DIRECTORY.
func OpenDirAt(dir *os.File, name string) (*os.File, error) {
	if name != "." && (name == ".." || strings.ContainsRune(name, '/')) {
		return nil, unsafe(name, unix.EINVAL)
	}
	for {
		fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, unsafe(name, err)
		}
		return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name)), nil
	}
}

// OpenFileAt opens the file name in dir for reading without following a
// symlink (and without blocking on a FIFO); it fails unless the file is
// regular.
func OpenFileAt(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, unsafe(name, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name))
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, ErrNotRegular)
	}
	return f, nil
}

// ErrNotRegular says a file is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// unsafe names the symlink and not-a-directory failures of an open as
// ErrUnsafe, and keeps the others (not found, permission) as they are.
func unsafe(name string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%s: %w (%v)", name, ErrUnsafe, err)
	}
	return &os.PathError{Op: "open", Path: name, Err: err}
}

// ProcPath is a path that names the open directory d itself, whatever
// happens to the path it was opened by (/proc/self/fd/N), for code that
// needs a path string; ok is false where /proc does not show it.
func ProcPath(d *os.File) (string, bool) {
	p := fmt.Sprintf("/proc/self/fd/%d", d.Fd())
	a, err1 := os.Stat(p)
	b, err2 := d.Stat()
	if err1 != nil || err2 != nil || !os.SameFile(a, b) {
		return "", false
	}
	return p, true
}
