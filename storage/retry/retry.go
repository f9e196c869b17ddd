// Package retry is a storage.Store decorator that retries transient
// failures with capped exponential backoff and full jitter.
//
// What is retried is decided by the classification of the storage.Store
// contract (storage.IsTransient): network errors, timeouts, HTTP 408, 429
// and 5xx responses, and errors that say so themselves (storage.ErrTransient,
// Temporary() bool). Never retried: storage.ErrNotFound, storage.ErrExists,
// context cancellation or expiry, other 4xx responses, invalid keys and
// errors returned by a List callback. A throttling answer (HTTP 429, S3
// SlowDown, see storage.IsThrottled) multiplies the next backoff by
// ThrottleFactor, so a store that asks us to slow down gets fewer requests.
//
// Per method:
//
//   - Put rewinds the body with Seek(0, io.SeekStart) before each retry,
//     which the storage.Store contract allows; Put is idempotent.
//   - Create is retried like Put. A retry after a failure whose outcome is
//     unknown (a lost response) may find the object it wrote itself and get
//     ErrExists. Create then reads the object back and compares it with the
//     body: equal bytes count as success, anything else returns the
//     ErrExists. Consequently, if a concurrent writer created the same key
//     with byte-identical content during the retry, both see success; since
//     the contents are the same, no reader can tell them apart. A first
//     attempt that gets ErrExists is never compared.
//   - Get retries opening the object and, if reading the body fails with a
//     transient error, opens it again and skips the bytes already returned.
//     This assumes the object does not change between attempts, which holds
//     for ckpt's write-once keys (a Put replacing a key with different bytes
//     while it is being read is outside the contract of this decorator).
//   - GetRange retries opening the range and, after a transient error in
//     its body, opens the rest of the range (never re-reads what it
//     returned).
//   - List retries and skips the keys it already passed to fn (List is in
//     lexical key order), so fn sees every key once.
//   - Stat and Delete are retried as they are (Delete ignores missing keys,
//     so repeating it is harmless).
//
// The number of attempts is bounded (Options.MaxAttempts); the error of the
// last attempt is returned, wrapped with the attempt count.
package retry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// Options tunes a retrying store. Zero values select the defaults.
type Options struct {
	// MaxAttempts bounds the attempts per call, the first included.
	// Default 6.
	MaxAttempts int
	// BaseDelay is the backoff before the second attempt; each further
	// attempt doubles it. Default 100ms.
	BaseDelay time.Duration
	// MaxDelay caps one backoff. Default 20s.
	MaxDelay time.Duration
	// ThrottleFactor multiplies the backoff after a throttling error.
	// Default 4.
	ThrottleFactor float64
	// Sleep waits for d or until ctx is done; tests replace it. The default
	// uses a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// OnRetry, if set, is called before each retry with the failed attempt
	// number (1-based), the error and the chosen delay (for logs, metrics).
	OnRetry func(op, key string, attempt int, err error, delay time.Duration)
}

func (o *Options) defaults() {
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 6
	}
	if o.BaseDelay <= 0 {
		o.BaseDelay = 100 * time.Millisecond
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = 20 * time.Second
	}
	if o.ThrottleFactor < 1 {
		o.ThrottleFactor = 4
	}
	if o.Sleep == nil {
		o.Sleep = sleep
	}
}

// Store retries the calls of the store it wraps; see the package comment.
type Store struct {
	inner storage.Store
	opts  Options
}

var (
	_ storage.Store       = (*Store)(nil)
	_ storage.Unwrapper   = (*Store)(nil)
	_ storage.RangeReader = (*Store)(nil)
)

// New wraps inner so that transient failures are retried.
func New(inner storage.Store, opts Options) *Store {
	opts.defaults()
	return &Store{inner: inner, opts: opts}
}

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() storage.Store { return s.inner }

// String names the wrapped store.
func (s *Store) String() string { return s.inner.String() }

// Close closes the wrapped store.
func (s *Store) Close() error { return s.inner.Close() }

// do runs fn until it succeeds, fails permanently or runs out of attempts.
// fn gets the 1-based attempt number.
func (s *Store) do(ctx context.Context, op, key string, fn func(attempt int) error) error {
	var err error
	throttled := false
	for attempt := 1; ; attempt++ {
		err = fn(attempt)
		if err == nil || !Transient(err) || ctx.Err() != nil {
			return err
		}
		if attempt >= s.opts.MaxAttempts {
			return fmt.Errorf("%w (gave up after %d attempts)", err, attempt)
		}
		throttled = throttled || Throttled(err)
		d := s.delay(attempt, throttled)
		if s.opts.OnRetry != nil {
			s.opts.OnRetry(op, key, attempt, err, d)
		}
		if serr := s.opts.Sleep(ctx, d); serr != nil {
			return fmt.Errorf("%s %s: %w (while backing off after: %v)", op, key, serr, err)
		}
	}
}

// delay is full jitter over a capped exponential: uniform in [0, cap).
func (s *Store) delay(attempt int, throttled bool) time.Duration {
	d := float64(s.opts.BaseDelay) * float64(uint64(1)<<min(attempt-1, 30))
	if throttled {
		d *= s.opts.ThrottleFactor
	}
	d = min(d, float64(s.opts.MaxDelay))
	return time.Duration(rand.Float64() * d)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func rewind(body io.Seeker) error {
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("rewind body: %w", err)
	}
	return nil
}

// Put writes the object, rewinding body before each retry.
func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.do(ctx, "put", key, func(attempt int) error {
		if attempt > 1 {
			if err := rewind(body); err != nil {
				return err
			}
		}
		return s.inner.Put(ctx, key, body, size)
	})
}

// Create writes the object if the key is absent. After a retry that finds
// the key taken, it compares the stored bytes with body: equal means our
// own earlier attempt succeeded and Create returns nil.
func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.do(ctx, "create", key, func(attempt int) error {
		if attempt > 1 {
			if err := rewind(body); err != nil {
				return err
			}
		}
		err := s.inner.Create(ctx, key, body, size)
		if attempt == 1 || !errors.Is(err, storage.ErrExists) {
			return err
		}
		same, cerr := s.sameContent(ctx, key, body, size)
		if cerr != nil {
			return fmt.Errorf("create %s: check whether an earlier attempt wrote it: %w", key, cerr)
		}
		if same {
			return nil
		}
		return err
	})
}

// sameContent reports whether the object at key holds exactly the size
// bytes of body. It rewinds body first.
func (s *Store) sameContent(ctx context.Context, key string, body io.ReadSeeker, size int64) (bool, error) {
	if err := rewind(body); err != nil {
		return false, err
	}
	info, err := s.inner.Stat(ctx, key)
	if err != nil {
		return false, err
	}
	if info.Size != size {
		return false, nil
	}
	rc, err := s.inner.Get(ctx, key)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	a := make([]byte, 64<<10)
	b := make([]byte, 64<<10)
	var n int64
	for {
		na, ea := io.ReadFull(rc, a)
		nb, eb := io.ReadFull(body, b[:min(int64(len(b)), size-n)])
		if ea != nil && ea != io.EOF && ea != io.ErrUnexpectedEOF {
			return false, ea
		}
		if eb != nil && eb != io.EOF && eb != io.ErrUnexpectedEOF {
			return false, eb
		}
		if na != nb || !bytes.Equal(a[:na], b[:nb]) {
			return false, nil
		}
		n += int64(na)
		if na < len(a) || n == size {
			// Short read: the stored object ended. Check both ended at size.
			if n != size {
				return false, nil
			}
			extra, _ := rc.Read(a[:1])
			return extra == 0, nil
		}
	}
}

// Get opens the object, retrying the open and resuming the body after
// transient read errors.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	var rc io.ReadCloser
	err := s.do(ctx, "get", key, func(int) error {
		var err error
		rc, err = s.inner.Get(ctx, key)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &resumingReader{s: s, ctx: ctx, key: key, rc: rc}, nil
}

// GetRange opens a range of the object, retrying the open; a transient
// error while reading the body opens the rest of the range again.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	open := func(done int64) (io.ReadCloser, error) {
		var rc io.ReadCloser
		err := s.do(ctx, "get", key, func(int) error {
			var err error
			rc, err = storage.Range(ctx, s.inner, key, off+done, length-done)
			return err
		})
		return rc, err
	}
	rc, err := open(0)
	if err != nil {
		return nil, err
	}
	return &resumingReader{s: s, ctx: ctx, key: key, rc: rc, openAt: open, length: length}, nil
}

// resumingReader reopens the object after a transient read error and skips
// the bytes it already returned.
type resumingReader struct {
	s        *Store
	ctx      context.Context
	key      string
	rc       io.ReadCloser
	off      int64
	failures int
	// openAt, for a range of length bytes, opens the rest of the range
	// after done bytes (nil for a whole object: reopened and skipped).
	openAt func(done int64) (io.ReadCloser, error)
	length int64
}

func (r *resumingReader) Read(p []byte) (int, error) {
	for {
		n, err := r.rc.Read(p)
		r.off += int64(n)
		if err == nil || err == io.EOF || n > 0 {
			if n > 0 && err != nil && err != io.EOF {
				// Return the bytes now; the error shows up again next call.
				return n, nil
			}
			return n, err
		}
		if !Transient(err) || r.ctx.Err() != nil {
			return 0, err
		}
		r.failures++
		if r.failures >= r.s.opts.MaxAttempts {
			return 0, fmt.Errorf("get %s: giving up after %d failed reads: %w", r.key, r.failures, err)
		}
		if err := r.reopen(err); err != nil {
			return 0, err
		}
	}
}

func (r *resumingReader) reopen(cause error) error {
	r.rc.Close()
	r.rc = io.NopCloser(strings.NewReader("")) // until reopened
	for {
		d := r.s.delay(r.failures, Throttled(cause))
		if r.s.opts.OnRetry != nil {
			r.s.opts.OnRetry("get", r.key, r.failures, cause, d)
		}
		if err := r.s.opts.Sleep(r.ctx, d); err != nil {
			return fmt.Errorf("get %s: %w (while backing off after: %v)", r.key, err, cause)
		}
		if r.openAt != nil {
			if r.off >= r.length {
				return fmt.Errorf("get %s: %w", r.key, cause)
			}
			rc, err := r.openAt(r.off)
			if err != nil {
				return err
			}
			r.rc = rc
			return nil
		}
		rc, err := r.s.Get(r.ctx, r.key)
		if err != nil {
			return err
		}
		inner := rc.(*resumingReader).rc
		_, err = io.CopyN(io.Discard, inner, r.off)
		if err == nil {
			r.rc = inner
			return nil
		}
		inner.Close()
		if err == io.EOF {
			return fmt.Errorf("get %s: object shrank to fewer than %d bytes while reading: %w", r.key, r.off, io.ErrUnexpectedEOF)
		}
		r.failures++
		if !Transient(err) || r.ctx.Err() != nil || r.failures >= r.s.opts.MaxAttempts {
			return fmt.Errorf("get %s: skip %d bytes after reopening: %w", r.key, r.off, err)
		}
		cause = err
	}
}

func (r *resumingReader) Close() error { return r.rc.Close() }

// Stat returns the object's info, retrying transient failures.
func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	var info storage.ObjectInfo
	err := s.do(ctx, "stat", key, func(int) error {
		var err error
		info, err = s.inner.Stat(ctx, key)
		return err
	})
	return info, err
}

// fnError marks an error returned by the caller's List callback, which is
// never retried.
type fnError struct{ err error }

func (e *fnError) Error() string { return e.err.Error() }
func (e *fnError) Unwrap() error { return e.err }

// List lists the keys under prefix, retrying and resuming after the last
// key passed to fn.
func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	last, seen := "", false
	return s.do(ctx, "list", prefix, func(int) error {
		return s.inner.List(ctx, prefix, func(o storage.ObjectInfo) error {
			if seen && o.Key <= last {
				return nil
			}
			if err := fn(o); err != nil {
				return &fnError{err} // Transient says no to these
			}
			last, seen = o.Key, true
			return nil
		})
	})
}

// Delete removes the keys, retrying transient failures.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	name := ""
	if len(keys) > 0 {
		name = keys[0]
		if len(keys) > 1 {
			name = fmt.Sprintf("%s (and %d more)", keys[0], len(keys)-1)
		}
	}
	return s.do(ctx, "delete", name, func(int) error {
		return s.inner.Delete(ctx, keys...)
	})
}

// Transient reports whether err is worth retrying: storage.IsTransient,
// except for errors returned by a List callback, which are never retried.
// Backends influence the outcome as the storage.Store contract says: by
// marking errors with storage.ErrTransient or storage.ErrThrottled, or by
// wrapping them in a type with HTTPStatusCode or Temporary.
func Transient(err error) bool {
	var fe *fnError
	if errors.As(err, &fe) {
		return false
	}
	return storage.IsTransient(err)
}

// Throttled reports whether err asks the client to slow down
// (storage.IsThrottled). Throttled errors are also Transient.
func Throttled(err error) bool { return storage.IsThrottled(err) }
