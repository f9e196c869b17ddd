// Package lazy is a storage decorator for a store that may not be
// reachable yet: the agent starts, and serves its socket, while its bucket
// is down or its credentials are refused, and opens the store on first use.
//
// Until the open succeeds, every call fails at once with an
// *UnavailableError that wraps the open's error (the backend's explanation:
// which bucket, which endpoint, what to check) and says it is worth
// retrying (Temporary): callers answer unavailable, never treat it as a
// verdict about an object. A failed open is tried again on the next call,
// at most once per retry interval, so a burst of calls during an outage
// costs one probe. Once open, calls go straight to the store.
package lazy

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// Opener opens the store; it is asked again after it failed.
type Opener func(ctx context.Context) (storage.Store, error)

// UnavailableError is the error of every call made before the store could
// be opened: Err is the last open's error.
type UnavailableError struct {
	Name string
	Err  error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("storage %s is unavailable: %v", e.Name, e.Err)
}
func (e *UnavailableError) Unwrap() error   { return e.Err }
func (e *UnavailableError) Temporary() bool { return true }

// Store opens its backend on first use. See the package comment.
type Store struct {
	name  string
	open  Opener
	every time.Duration

	mu      sync.Mutex // held across an open: concurrent callers wait for it
	s       storage.Store
	lastErr error
	lastTry time.Time
}

var _ storage.Store = (*Store)(nil)

// DefaultRetryInterval is the least time between two opens.
const DefaultRetryInterval = 2 * time.Second

// New returns a Store named name (a URL without secrets) that opens with
// open. s, when not nil, is the store already opened (the caller tried at
// start and succeeded); err, when s is nil, is the error of that try (nil:
// none was made). every bounds how often a failed open is retried
// (0: DefaultRetryInterval).
func New(name string, s storage.Store, err error, open Opener, every time.Duration) *Store {
	if every <= 0 {
		every = DefaultRetryInterval
	}
	l := &Store{name: name, open: open, every: every, s: s, lastErr: err}
	if s == nil && err != nil {
		l.lastTry = time.Now()
	}
	return l
}

// store returns the open store, opening it if it is time to try again.
func (l *Store) store(ctx context.Context) (storage.Store, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s != nil {
		return l.s, nil
	}
	if l.lastErr == nil || time.Since(l.lastTry) >= l.every {
		s, err := l.open(ctx)
		l.lastTry = time.Now()
		if err == nil {
			l.s, l.lastErr = s, nil
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		l.lastErr = err
	}
	return nil, &UnavailableError{Name: l.name, Err: l.lastErr}
}

// Opened reports whether the store is open.
func (l *Store) Opened() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s != nil
}

func (l *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	s, err := l.store(ctx)
	if err != nil {
		return err
	}
	return s.Put(ctx, key, body, size)
}

func (l *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	s, err := l.store(ctx)
	if err != nil {
		return err
	}
	return s.Create(ctx, key, body, size)
}

func (l *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s, err := l.store(ctx)
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, key)
}

func (l *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	s, err := l.store(ctx)
	if err != nil {
		return storage.ObjectInfo{}, err
	}
	return s.Stat(ctx, key)
}

func (l *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	s, err := l.store(ctx)
	if err != nil {
		return err
	}
	return s.List(ctx, prefix, fn)
}

func (l *Store) Delete(ctx context.Context, keys ...string) error {
	s, err := l.store(ctx)
	if err != nil {
		return err
	}
	return s.Delete(ctx, keys...)
}

// String names the open store, or the URL it was given before.
func (l *Store) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s != nil {
		return l.s.String()
	}
	return l.name
}

// Close closes the store if it was opened.
func (l *Store) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s != nil {
		return l.s.Close()
	}
	return nil
}

// Unwrap returns the open store (nil before it is open), so callers reach
// its optional interfaces (storage.AsCleaner, AsRangeReader, AsCopier).
func (l *Store) Unwrap() storage.Store {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s
}
