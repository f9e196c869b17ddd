// Package ratelimit is a storage.Store decorator that caps the bandwidth of
// all transfers through a store: one token bucket for uploads (Put and
// Create bodies) and one for downloads (Get bodies), each shared by every
// concurrent transfer, so N parallel uploads together stay under the
// upload limit.
//
// Bytes are charged as the wrapped store reads them from the body (or the
// caller reads them from a Get), so a retry that rewinds the body pays
// again, as the bytes cross the network again. Metadata calls (Stat, List,
// Delete) are not limited.
package ratelimit

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/time/rate"

	"github.com/ckpt-io/ckpt/storage"
)

// Limits are in bytes per second; zero or negative means unlimited.
type Limits struct {
	Upload   int64
	Download int64
}

// Store limits the bandwidth of the store it wraps.
type Store struct {
	inner    storage.Store
	up, down *rate.Limiter // nil: unlimited
}

var (
	_ storage.Store       = (*Store)(nil)
	_ storage.Unwrapper   = (*Store)(nil)
	_ storage.RangeReader = (*Store)(nil)
)

// New wraps inner with the given limits. With both limits unlimited the
// decorator only passes calls through.
func New(inner storage.Store, l Limits) *Store {
	return &Store{inner: inner, up: limiter(l.Upload), down: limiter(l.Download)}
}

// limiter returns a token bucket for bps bytes/s whose burst (the largest
// chunk charged at once) is a quarter second of traffic, between 1 byte
// and 1 MiB.
func limiter(bps int64) *rate.Limiter {
	if bps <= 0 {
		return nil
	}
	burst := min(max(bps/4, 1), 1<<20)
	if bps < 4096 {
		burst = max(bps, 1)
	}
	return rate.NewLimiter(rate.Limit(bps), int(burst))
}

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() storage.Store { return s.inner }

// String names the wrapped store.
func (s *Store) String() string { return s.inner.String() }

// Close closes the wrapped store.
func (s *Store) Close() error { return s.inner.Close() }

// Put uploads body at no more than the upload limit.
func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if s.up == nil {
		return s.inner.Put(ctx, key, body, size)
	}
	return s.inner.Put(ctx, key, &seeker{reader{ctx, body, s.up}, body}, size)
}

// Create uploads body at no more than the upload limit.
func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if s.up == nil {
		return s.inner.Create(ctx, key, body, size)
	}
	return s.inner.Create(ctx, key, &seeker{reader{ctx, body, s.up}, body}, size)
}

// Get returns a reader that delivers at no more than the download limit.
// The reader honours ctx while it waits.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := s.inner.Get(ctx, key)
	if err != nil || s.down == nil {
		return rc, err
	}
	return struct {
		io.Reader
		io.Closer
	}{&reader{ctx, rc, s.down}, rc}, nil
}

// GetRange is Get's limit on a range of the object.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	rc, err := storage.Range(ctx, s.inner, key, off, length)
	if err != nil || s.down == nil {
		return rc, err
	}
	return struct {
		io.Reader
		io.Closer
	}{&reader{ctx, rc, s.down}, rc}, nil
}

// Stat is not limited.
func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	return s.inner.Stat(ctx, key)
}

// List is not limited.
func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	return s.inner.List(ctx, prefix, fn)
}

// Delete is not limited.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	return s.inner.Delete(ctx, keys...)
}

// reader charges every byte read to a shared limiter.
type reader struct {
	ctx context.Context
	r   io.Reader
	l   *rate.Limiter
}

func (r *reader) Read(p []byte) (int, error) {
	if b := r.l.Burst(); len(p) > b {
		p = p[:b]
	}
	n, err := r.r.Read(p)
	if n > 0 {
		if werr := r.l.WaitN(r.ctx, n); werr != nil {
			if cerr := r.ctx.Err(); cerr != nil {
				return n, cerr
			}
			// The limiter refuses to wait past the deadline it sees coming.
			return n, fmt.Errorf("bandwidth limit: %w", context.DeadlineExceeded)
		}
	}
	return n, err
}

// seeker is a limited reader that keeps the body seekable for retries.
type seeker struct {
	reader
	s io.Seeker
}

func (s *seeker) Seek(off int64, whence int) (int64, error) { return s.s.Seek(off, whence) }
