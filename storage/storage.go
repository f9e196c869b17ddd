// Package storage defines the object store every ckpt backend implements
// (file://, s3://, gs:// built in; az:// and others through storage
// plugins) and the URL registry that opens them.
//
// The interface is deliberately small. Cross-cutting concerns (retries,
// bandwidth limits, metrics, fault injection) are decorators that wrap a
// Store; backends do not grow flags for them.
package storage

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotFound is returned (wrapped) by Get and Stat when the key does not exist.
var ErrNotFound = errors.New("object not found")

// ErrExists is returned (wrapped) by Create when the key already exists.
var ErrExists = errors.New("object already exists")

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time // time of the last successful write of the object
}

// Store is a flat namespace of immutable-once-written objects addressed by
// slash-separated keys. Keys never start with "/" and never contain "//",
// "." or ".." segments; backends may refuse such keys.
//
// Contract every backend holds (and storagetest.Run checks):
//
//   - Put writes size bytes from body under key, replacing any object there.
//     It is idempotent: repeating it with the same bytes is harmless. The
//     object is durable and visible to Get, Stat and List once Put returns
//     nil; a failed Put leaves either the old object or none, never a
//     partial one. Put may rewind body with Seek(0, io.SeekStart) to retry,
//     so callers pass a re-readable body (an *os.File, a *bytes.Reader).
//     Put fails if body does not hold exactly size bytes.
//   - Create is Put that succeeds only if key does not exist yet; otherwise
//     it returns an error wrapping ErrExists and leaves the object intact.
//     Of two concurrent Creates of one key, at most one succeeds.
//   - Get returns a reader of the whole object; the caller closes it. A
//     missing key returns an error wrapping ErrNotFound.
//   - Stat returns the object's info or an error wrapping ErrNotFound.
//   - List calls fn for every object whose key starts with prefix, in
//     lexical key order, paging internally. Objects being written (temporary
//     files, incomplete multipart uploads) are not listed. An error from fn
//     stops the listing and is returned.
//   - Delete removes the given keys; a key that does not exist is not an
//     error. Backends batch where they can.
//
// All methods honour ctx cancellation. Errors are wrapped with the key and
// never contain credentials.
//
// Errors are classified by what the caller should do (storagetest.Errors
// checks each backend against a relay that fails requests; errors.go has
// the functions). A backend returns:
//
//   - a missing key: an error wrapping ErrNotFound (Get, Stat), never
//     transient; a missing bucket or container is not ErrNotFound;
//   - a refused conditional create (key exists, precondition failed):
//     an error wrapping ErrExists, never transient;
//   - a failure the same call may survive later (5xx, 408, a refused,
//     reset or timed-out connection): one IsTransient reports, by its
//     chain (HTTPStatusCode, ErrorCode, Temporary, net errors) or marked
//     with ErrTransient; the retry decorator retries exactly these;
//   - a request to slow down (429, SlowDown, ServerBusy): one IsThrottled
//     (and so IsTransient) reports, or marked with ErrThrottled;
//   - a refusal of the credentials or permissions (401, 403, EACCES): one
//     IsPermissionDenied reports, naming what to grant; never transient;
//   - a cancelled or expired ctx: an error wrapping ctx.Err().
//
// An SDK error that carries its status only in a field is wrapped in
// HTTPError. The classes survive the plugin boundary.
type Store interface {
	Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error
	Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
	Delete(ctx context.Context, keys ...string) error
	// String names the store for logs and errors (a URL without secrets).
	String() string
	Close() error
}

// IncompleteCleaner is implemented by stores that can leave incomplete
// writes behind after a crash (temporary files, multipart uploads).
// CleanIncomplete removes those of keys under prefix that were started
// before olderThan, and reports how many it removed and how many bytes
// they held (best effort for bytes). Writes under other prefixes (another
// job's uploads) are never touched.
type IncompleteCleaner interface {
	CleanIncomplete(ctx context.Context, prefix string, olderThan time.Time) (n int, bytes int64, err error)
}

// OpenError is the one-line error a backend returns when it cannot use its
// bucket at start: Error() is written for a person (bucket, endpoint, what
// to check, never a secret); Unwrap gives the underlying error to programs.
type OpenError struct {
	Msg string
	Err error
}

func (e *OpenError) Error() string { return e.Msg }
func (e *OpenError) Unwrap() error { return e.Err }

// Unwrapper is implemented by decorators so callers can reach optional
// interfaces (such as IncompleteCleaner) of the store they wrap.
type Unwrapper interface {
	Unwrap() Store
}

// AsCleaner finds an IncompleteCleaner in s or the stores it wraps.
func AsCleaner(s Store) (IncompleteCleaner, bool) { return find[IncompleteCleaner](s) }

// find returns the first of s and the stores it wraps that implements T.
func find[T any](s Store) (T, bool) {
	for s != nil {
		if c, ok := s.(T); ok {
			return c, true
		}
		u, ok := s.(Unwrapper)
		if !ok {
			break
		}
		s = u.Unwrap()
	}
	var zero T
	return zero, false
}

// Copier is implemented by stores that can copy an object of another
// store into themselves without its bytes passing through ckpt (S3's
// CopyObject, GCS's rewrite). CopyFrom copies srcKey of src (which may be
// wrapped in decorators; see Innermost) to key, replacing any object
// there, with the durability of Put. copied is false, and nothing is
// written, when src is not a store the backend can copy from (another
// backend, another endpoint, an object too large for one copy call): the
// caller then streams the bytes itself. The caller verifies the copy.
type Copier interface {
	CopyFrom(ctx context.Context, src Store, srcKey, key string, size int64) (copied bool, err error)
}

// AsCopier finds a Copier in s or the stores it wraps.
func AsCopier(s Store) (Copier, bool) { return find[Copier](s) }

// Innermost returns the store that s's decorators wrap: the backend.
func Innermost(s Store) Store {
	for {
		u, ok := s.(Unwrapper)
		if !ok {
			return s
		}
		s = u.Unwrap()
	}
}

// ContextReader returns a reader of r that fails with ctx's error once ctx
// is done, so that a long copy from a body stops on cancellation.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return &ctxReader{ctx, r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
