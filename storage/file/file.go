// Package file is the file:// storage backend: objects are files under a
// root directory (a local disk or a network filesystem).
//
// Every write goes to a temporary file in the object's directory, is
// fsynced, then renamed (Put) or hard-linked (Create) into place, and the
// directory is fsynced: an object is either whole or absent after a crash.
// Temporary files left by a crash are invisible to List and removed by
// CleanIncomplete.
package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/storage"
)

func init() {
	storage.Register("file", func(_ context.Context, u *url.URL) (storage.Store, error) {
		if u.Host != "" && u.Host != "localhost" {
			return nil, storage.BadURL(fmt.Errorf("storage URL file://%s%s: a file URL needs an absolute path, as in file:///var/lib/ckpt", u.Host, u.Path))
		}
		return Open(u.Path)
	})
}

// tmpMarker is part of every temporary file name; List never shows such files.
const tmpMarker = ".ckpt-tmp-"

// Store keeps objects as files under Root.
type Store struct {
	root string
}

var (
	_ storage.Store             = (*Store)(nil)
	_ storage.IncompleteCleaner = (*Store)(nil)
	_ storage.RangeReader       = (*Store)(nil)
	_ storage.Locator           = (*Store)(nil)
)

// Open opens the store rooted at dir, which must be an absolute path to an
// existing directory: a storage URL with a typo must not turn into an empty
// store (a restore at pod start would then find "no checkpoint" and the app
// would start empty). Nothing is created. This is what file:// URLs open.
func Open(dir string) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("file storage %q: path must be absolute", dir)
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("file storage %s does not exist: check the storage URL for a typo, or create the directory first (ckpt agent --create-storage does)", dir)
	case err != nil:
		return nil, fmt.Errorf("file storage: %w (check the path and its permissions)", err)
	case !fi.IsDir():
		return nil, fmt.Errorf("file storage %s is not a directory: check the storage URL", dir)
	}
	return &Store{root: filepath.Clean(dir)}, nil
}

// New opens a store rooted at dir, which must be absolute, creating the
// directory if needed.
func New(dir string) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("file storage %q: path must be absolute", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("file storage: %w (check the path and its permissions)", err)
	}
	return &Store{root: filepath.Clean(dir)}, nil
}

// Root returns the directory the store keeps its objects in.
func (s *Store) Root() string { return s.root }

func (s *Store) String() string { return "file://" + s.root }

// Location returns file:// and the root's real path: a store reached
// through a symlink is located where its files are.
func (s *Store) Location() string {
	if r, err := filepath.EvalSymlinks(s.root); err == nil {
		return "file://" + r
	}
	return "file://" + s.root
}

func (s *Store) Close() error { return nil }

func (s *Store) path(key string) (string, error) {
	if err := storage.ValidKey(key); err != nil {
		return "", err
	}
	if strings.Contains(path.Base(key), tmpMarker) {
		return "", fmt.Errorf("key %q: reserved name", key)
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

// Put writes the object through a temporary file and a rename.
func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.write(ctx, key, body, size, false)
}

// copyBody writes body to f and returns how many bytes it had, reading at
// most size+1 of them (one more than size tells a longer body). A body in
// memory goes out in one write. A file is copied by the kernel
// (copy_file_range or splice, through os.File.ReadFrom) in chunks, and
// anything else through a buffer; ctx is checked between chunks.
func copyBody(ctx context.Context, f *os.File, body io.Reader, size int64) (int64, error) {
	if br, ok := body.(*bytes.Reader); ok && int64(br.Len()) <= size+1 {
		return br.WriteTo(f)
	}
	if src, ok := body.(*os.File); ok {
		const chunk = 64 << 20
		var n int64
		for n <= size {
			if err := ctx.Err(); err != nil {
				return n, err
			}
			m, err := f.ReadFrom(io.LimitReader(src, min(chunk, size+1-n)))
			n += m
			if err != nil || m == 0 {
				return n, err
			}
		}
		return n, nil
	}
	// Any other body (one that hashes what it hands over, say) goes
	// through a buffer of copyBufSize: a tenth of the system calls of
	// io.Copy's 32 KiB for a large object.
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{f}, storage.ContextReader(ctx, io.LimitReader(body, size+1)), *bp)
}

// copyBufSize is the buffer copyBody copies a body that is not a file
// through.
const copyBufSize = 1 << 20

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// Create writes the object through a temporary file and a hard link, which
// fails if the key exists: the link is the atomic create-if-absent.
func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.write(ctx, key, body, size, true)
}

func (s *Store) write(ctx context.Context, key string, body io.ReadSeeker, size int64, exclusive bool) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir := filepath.Dir(p)
	tmp, err := s.createTemp(dir, filepath.Base(p))
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	tmpName := tmp.Name()
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmpName)
		}
	}()
	n, err := copyBody(ctx, tmp, body, size)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if n != size {
		return fmt.Errorf("put %s: body has %d bytes, want %d", key, n, size)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("put %s: fsync: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if exclusive {
		if err := os.Link(tmpName, p); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("create %s: %w", key, storage.ErrExists)
			}
			return fmt.Errorf("create %s: %w", key, err)
		}
		os.Remove(tmpName)
	} else if err := os.Rename(tmpName, p); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	committed = true
	if err := fsutil.SyncDir(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// Only an empty directory is removed: a concurrent Delete of
			// this key came after the rename, and the object is gone as
			// that Delete says.
			return nil
		}
		return fmt.Errorf("put %s: fsync directory: %w", key, err)
	}
	return nil
}

// createTemp makes the directory and a temporary file in it, retrying when
// a concurrent Delete removes a just-created empty directory (the file
// itself, or a parent between MkdirAll's steps).
func (s *Store) createTemp(dir, base string) (*os.File, error) {
	var err error
	for range 20 {
		if err = s.mkdirBelow(dir); err != nil {
			if errors.Is(err, ErrRootGone) {
				return nil, err
			}
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrExist) {
				continue // a step of it removed, or made, by another at once
			}
			return nil, err
		}
		var f *os.File
		f, err = os.CreateTemp(dir, "."+base+tmpMarker+"*")
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return nil, err
}

func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	p, err := s.path(key)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			if gone := s.rootGone(); gone != nil {
				return nil, fmt.Errorf("get %s: %w", key, gone)
			}
			return nil, fmt.Errorf("get %s: %w", key, storage.ErrNotFound)
		}
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("get %s: %w", key, storage.ErrNotFound)
	}
	return f, nil
}

// GetRange returns length bytes of the object from off, read with ReadAt
// (pread) from the file, which several ranges may share.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	f := rc.(*os.File)
	return &fileRange{SectionReader: io.NewSectionReader(f, off, length), f: f}, nil
}

// fileRange is a section of an open file that closes the file.
type fileRange struct {
	*io.SectionReader
	f *os.File
}

func (r *fileRange) Close() error { return r.f.Close() }

func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	p, err := s.path(key)
	if err != nil {
		return storage.ObjectInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return storage.ObjectInfo{}, err
	}
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() {
		if err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			if gone := s.rootGone(); gone != nil {
				return storage.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, gone)
			}
			return storage.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, storage.ErrNotFound)
		}
		return storage.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	return storage.ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// List walks the directory that holds prefix and reports the regular files
// whose keys start with prefix, skipping temporary files.
func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	dir := s.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		if err := storage.ValidKey(prefix[:i]); err != nil {
			return fmt.Errorf("list %s: %w", prefix, err)
		}
		dir = filepath.Join(s.root, filepath.FromSlash(prefix[:i]))
	}
	// A gone root lists as an outage, never as an empty store.
	if gone := s.rootGone(); gone != nil {
		return fmt.Errorf("list %s: %w", prefix, gone)
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking, or no such prefix
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(s.root, p)
		key := filepath.ToSlash(rel)
		if d.IsDir() {
			if p != dir && !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || strings.Contains(d.Name(), tmpMarker) || !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		return fn(storage.ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
	})
	if err != nil {
		return fmt.Errorf("list %s: %w", prefix, err)
	}
	return nil
}

// Delete removes the keys' files and then any directories left empty.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		p, err := s.path(key)
		if err != nil {
			return err
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete %s: %w", key, err)
		}
		s.pruneDirs(filepath.Dir(p))
	}
	return nil
}

// pruneDirs removes empty directories from dir up to (not including) the root.
func (s *Store) pruneDirs(dir string) {
	for dir != s.root && strings.HasPrefix(dir, s.root+string(filepath.Separator)) {
		if os.Remove(dir) != nil {
			return
		}
		dir = filepath.Dir(dir)
	}
}

// CleanIncomplete removes temporary files of keys under prefix that are
// older than olderThan: writes that a crash interrupted.
func (s *Store) CleanIncomplete(ctx context.Context, prefix string, olderThan time.Time) (int, int64, error) {
	var n int
	var bytes int64
	dir := s.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		if err := storage.ValidKey(prefix[:i]); err != nil {
			return 0, 0, fmt.Errorf("clean %s: %w", prefix, err)
		}
		dir = filepath.Join(s.root, filepath.FromSlash(prefix[:i]))
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() || !strings.Contains(d.Name(), tmpMarker) {
			return nil
		}
		// The key the temporary file was writing: ".<base>.ckpt-tmp-<rand>".
		rel, _ := filepath.Rel(s.root, filepath.Join(filepath.Dir(p), strings.TrimPrefix(d.Name()[:strings.Index(d.Name(), tmpMarker)], ".")))
		if !strings.HasPrefix(filepath.ToSlash(rel), prefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil || !fi.ModTime().Before(olderThan) {
			return nil
		}
		if os.Remove(p) == nil {
			n++
			bytes += fi.Size()
		}
		return nil
	})
	return n, bytes, err
}
