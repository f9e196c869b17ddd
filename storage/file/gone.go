package file

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrRootGone is wrapped by the error of every operation on a store whose
// root directory no longer exists: it was removed, renamed or unmounted
// after the store was opened. The store never re-creates its root: a new
// empty directory would look like a store without checkpoints (a restore
// would find none, and GC would see no live set). It is an outage, as a
// bucket that does not answer is: the error says it is worth retrying
// (Temporary), and work resumes once the directory is back.
var ErrRootGone = errors.New("file storage root is gone")

// rootGoneError is the error for a vanished root.
type rootGoneError struct{ root string }

func (e *rootGoneError) Error() string {
	return fmt.Sprintf("file storage %s is gone (removed, renamed or unmounted after ckpt opened it): ckpt does not re-create it; put the directory back or remount it", e.root)
}
func (e *rootGoneError) Unwrap() error   { return ErrRootGone }
func (e *rootGoneError) Temporary() bool { return true }

// rootGone returns a *rootGoneError when the root does not exist (or is no
// longer a directory), nil otherwise. It is asked after a not-found, so a
// missing object and a missing store are told apart.
func (s *Store) rootGone() error {
	fi, err := os.Stat(s.root)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || (err == nil && !fi.IsDir()) {
		return &rootGoneError{root: s.root}
	}
	return nil
}

// mkdirBelow creates dir and its missing parents below the root, one
// component at a time with Mkdir, never the root itself: when the root is
// gone the first Mkdir fails, where MkdirAll would quietly make a new,
// empty store.
func (s *Store) mkdirBelow(dir string) error {
	rel, err := filepath.Rel(s.root, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Errorf("directory %s is outside the store %s", dir, s.root)
	}
	if rel == "." {
		return s.rootGone()
	}
	p := s.root
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		p = filepath.Join(p, c)
		err := os.Mkdir(p, 0o755)
		switch {
		case err == nil, errors.Is(err, fs.ErrExist):
		case errors.Is(err, fs.ErrNotExist):
			if gone := s.rootGone(); gone != nil {
				return gone
			}
			return err // a parent removed at once by a Delete: the caller retries
		default:
			return err
		}
	}
	return nil
}
