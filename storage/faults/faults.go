// Package faults is a storage.Store decorator for tests that injects the
// failures object stores produce in production: transient errors, throttling
// (S3 SlowDown), connections dropped in the middle of a body, responses lost
// after the write took effect, and latency.
//
// Faults are drawn from a pseudo-random source seeded by Options.Seed, so a
// sequential test sees the same faults on every run. (Concurrent calls draw
// in scheduling order, which is not deterministic.) Every injected error is
// an *Error, which retry.Transient classifies as transient; SlowDown errors
// are also throttling errors (retry.Throttled).
package faults

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// Kind names a class of injected fault.
type Kind int

const (
	// Transient is an error returned before the call reaches the store, as
	// a 500 InternalError or a refused connection would be.
	Transient Kind = iota
	// SlowDown is a throttling error returned before the call reaches the
	// store, as S3's 503 SlowDown.
	SlowDown
	// MidBody fails a transfer part way: an upload body stops with an error
	// after some bytes (the store sees a failed write), or a downloaded body
	// does.
	MidBody
	// AfterWrite lets Put, Create or Delete take effect and then returns a
	// transient error, as when the response is lost.
	AfterWrite
	numKinds
)

func (k Kind) String() string {
	switch k {
	case Transient:
		return "transient"
	case SlowDown:
		return "slowdown"
	case MidBody:
		return "mid-body"
	case AfterWrite:
		return "after-write"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Error is an injected failure. It is transient: Temporary returns true,
// and HTTPStatusCode and ErrorCode describe it like an object store would.
type Error struct {
	Op, Key string
	Kind    Kind
}

func (e *Error) Error() string {
	return fmt.Sprintf("injected %s fault in %s %s", e.Kind, e.Op, e.Key)
}

// Temporary reports true: every injected fault is worth retrying.
func (e *Error) Temporary() bool { return true }

// Throttled reports whether the fault asks the client to slow down.
func (e *Error) Throttled() bool { return e.Kind == SlowDown }

// HTTPStatusCode returns the status an object store would answer with:
// 503 for SlowDown, 500 for transient and lost-response faults, 0 (no
// response) for a body that broke part way.
func (e *Error) HTTPStatusCode() int {
	switch e.Kind {
	case SlowDown:
		return 503
	case MidBody:
		return 0
	}
	return 500
}

// ErrorCode returns an S3-style error code.
func (e *Error) ErrorCode() string {
	if e.Kind == SlowDown {
		return "SlowDown"
	}
	return "InternalError"
}

// Options sets the probability (0 to 1) of each fault per call. The
// probabilities of the error kinds are exclusive per call and should sum to
// at most 1; a kind drawn for a call it does not apply to (AfterWrite for
// Get or Stat, MidBody for Stat or Delete) means no fault for that call.
// Latency is drawn independently.
type Options struct {
	Seed uint64
	// Transient is the probability that a call fails before reaching the
	// store.
	Transient float64
	// SlowDown is the probability that a call is refused as throttled.
	SlowDown float64
	// MidBody is the probability that Put, Create or Get fail part way
	// through the body (and that List fails part way through the listing).
	MidBody float64
	// AfterWrite is the probability that Put, Create or Delete succeed in
	// the store and then report a transient error.
	AfterWrite float64
	// Latency is the probability of a delay of up to MaxLatency before the
	// call.
	Latency    float64
	MaxLatency time.Duration
}

// Uniform returns options that fail a fraction p of calls, split evenly
// over the four error kinds, with no latency.
func Uniform(seed uint64, p float64) Options {
	return Options{Seed: seed, Transient: p / 4, SlowDown: p / 4, MidBody: p / 4, AfterWrite: p / 4}
}

// Store injects faults into the calls of the store it wraps.
type Store struct {
	inner storage.Store
	opts  Options

	mu  sync.Mutex
	rng *rand.Rand

	counts   [numKinds]atomic.Int64
	disabled atomic.Bool
}

var (
	_ storage.Store       = (*Store)(nil)
	_ storage.Unwrapper   = (*Store)(nil)
	_ storage.RangeReader = (*Store)(nil)
)

// New wraps inner so that its calls fail as opts says.
func New(inner storage.Store, opts Options) *Store {
	return &Store{inner: inner, opts: opts, rng: rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))}
}

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() storage.Store { return s.inner }

// String names the wrapped store.
func (s *Store) String() string { return s.inner.String() }

// Close closes the wrapped store.
func (s *Store) Close() error { return s.inner.Close() }

// SetEnabled turns fault injection on or off (it starts on), for test
// set-up and checks that must not fail.
func (s *Store) SetEnabled(on bool) { s.disabled.Store(!on) }

// Injected returns how many faults of kind k were injected so far.
func (s *Store) Injected(k Kind) int64 { return s.counts[k].Load() }

// none is the draw result when no error fault is injected.
const none Kind = -1

// draw picks this call's fault (or none) and sleeps for injected latency.
// allowed lists the kinds that make sense for the operation.
func (s *Store) draw(ctx context.Context, allowed ...Kind) (Kind, error) {
	if s.disabled.Load() {
		return none, nil
	}
	s.mu.Lock()
	u := s.rng.Float64()
	lat := s.rng.Float64()
	frac := s.rng.Float64()
	s.mu.Unlock()
	if lat < s.opts.Latency && s.opts.MaxLatency > 0 {
		t := time.NewTimer(time.Duration(frac * float64(s.opts.MaxLatency)))
		select {
		case <-ctx.Done():
			t.Stop()
			return none, ctx.Err()
		case <-t.C:
		}
	}
	probs := [numKinds]float64{s.opts.Transient, s.opts.SlowDown, s.opts.MidBody, s.opts.AfterWrite}
	acc := 0.0
	for k := range numKinds {
		acc += probs[k]
		if u < acc {
			for _, a := range allowed {
				if a == k {
					s.counts[k].Add(1)
					return k, nil
				}
			}
			return none, nil
		}
	}
	return none, nil
}

// intn returns a pseudo-random number in [0, n).
func (s *Store) intn(n int64) int64 {
	if n <= 0 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.Int64N(n)
}

// Put writes through to the wrapped store unless a fault is drawn.
func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.write(ctx, "put", key, body, size, s.inner.Put)
}

// Create writes through to the wrapped store unless a fault is drawn.
func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.write(ctx, "create", key, body, size, s.inner.Create)
}

func (s *Store) write(ctx context.Context, op, key string, body io.ReadSeeker, size int64,
	fn func(context.Context, string, io.ReadSeeker, int64) error) error {
	k, err := s.draw(ctx, Transient, SlowDown, MidBody, AfterWrite)
	if err != nil {
		return err
	}
	switch k {
	case Transient, SlowDown:
		return &Error{Op: op, Key: key, Kind: k}
	case MidBody:
		fr := &failingReader{r: body, left: s.intn(size + 1), err: &Error{Op: op, Key: key, Kind: MidBody}}
		return fn(ctx, key, &failingSeeker{failingReader: fr, s: body}, size)
	case AfterWrite:
		if err := fn(ctx, key, body, size); err != nil {
			return err
		}
		return &Error{Op: op, Key: key, Kind: AfterWrite}
	}
	return fn(ctx, key, body, size)
}

// Get opens the object; a MidBody fault breaks the returned reader after a
// random number of bytes (up to 1 MiB, so small objects may read whole).
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.get(ctx, key, func() (io.ReadCloser, error) { return s.inner.Get(ctx, key) })
}

// GetRange draws the faults of Get for a range of the object.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	return s.get(ctx, key, func() (io.ReadCloser, error) { return storage.Range(ctx, s.inner, key, off, length) })
}

func (s *Store) get(ctx context.Context, key string, open func() (io.ReadCloser, error)) (io.ReadCloser, error) {
	k, err := s.draw(ctx, Transient, SlowDown, MidBody)
	if err != nil {
		return nil, err
	}
	if k == Transient || k == SlowDown {
		return nil, &Error{Op: "get", Key: key, Kind: k}
	}
	rc, err := open()
	if err != nil || k != MidBody {
		return rc, err
	}
	fr := &failingReader{r: rc, left: s.intn(1 << 20), err: &Error{Op: "get", Key: key, Kind: MidBody}}
	return struct {
		io.Reader
		io.Closer
	}{fr, rc}, nil
}

// Stat returns the object's info unless a fault is drawn.
func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	k, err := s.draw(ctx, Transient, SlowDown)
	if err != nil {
		return storage.ObjectInfo{}, err
	}
	if k != none {
		return storage.ObjectInfo{}, &Error{Op: "stat", Key: key, Kind: k}
	}
	return s.inner.Stat(ctx, key)
}

// List lists the keys; a MidBody fault stops the listing with an error
// after a few keys were passed to fn.
func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	k, err := s.draw(ctx, Transient, SlowDown, MidBody)
	if err != nil {
		return err
	}
	switch k {
	case Transient, SlowDown:
		return &Error{Op: "list", Key: prefix, Kind: k}
	case MidBody:
		left := s.intn(4)
		return s.inner.List(ctx, prefix, func(o storage.ObjectInfo) error {
			if left == 0 {
				return &Error{Op: "list", Key: prefix, Kind: MidBody}
			}
			left--
			return fn(o)
		})
	}
	return s.inner.List(ctx, prefix, fn)
}

// Delete removes the keys; an AfterWrite fault reports an error after the
// keys were removed.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	k, err := s.draw(ctx, Transient, SlowDown, AfterWrite)
	if err != nil {
		return err
	}
	key := ""
	if len(keys) > 0 {
		key = keys[0]
	}
	switch k {
	case Transient, SlowDown:
		return &Error{Op: "delete", Key: key, Kind: k}
	case AfterWrite:
		if err := s.inner.Delete(ctx, keys...); err != nil {
			return err
		}
		return &Error{Op: "delete", Key: key, Kind: k}
	}
	return s.inner.Delete(ctx, keys...)
}

// failingReader returns err once left bytes were read.
type failingReader struct {
	r    io.Reader
	left int64
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.left <= 0 {
		return 0, f.err
	}
	if int64(len(p)) > f.left {
		p = p[:f.left]
	}
	n, err := f.r.Read(p)
	f.left -= int64(n)
	return n, err
}

// failingSeeker is a failingReader over a seekable body; seeking does not
// heal it (the fault is for this call).
type failingSeeker struct {
	*failingReader
	s io.Seeker
}

func (f *failingSeeker) Seek(off int64, whence int) (int64, error) { return f.s.Seek(off, whence) }
