package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrBadURL marks the errors of a storage URL that names no store: one that
// does not parse, an unknown scheme, or options its backend refuses. It is
// the user's mistake (bad usage), not a store that cannot be reached.
var ErrBadURL = errors.New("bad storage URL")

type badURLError struct{ error }

func (e badURLError) Is(target error) bool { return target == ErrBadURL }
func (e badURLError) Unwrap() error        { return e.error }

// BadURL marks err (a backend's refusal of its URL) as ErrBadURL, its
// message unchanged.
func BadURL(err error) error { return badURLError{err} }

// Opener opens a store for a parsed storage URL.
type Opener func(ctx context.Context, u *url.URL) (Store, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Opener{}
)

// Register makes a backend available under a URL scheme ("file", "s3",
// "gs"). Backends call it from init; registering a scheme twice panics, as
// that is a programming error, never an input error.
func Register(scheme string, open Opener) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[scheme]; dup {
		panic("storage: scheme registered twice: " + scheme)
	}
	registry[scheme] = open
}

// RegisterParsed registers a backend as two steps: parse the URL into the
// backend's options, then open a store with them. A failed parse opens
// nothing.
func RegisterParsed[O any, S Store](scheme string, parse func(*url.URL) (O, error), open func(context.Context, O) (S, error)) {
	Register(scheme, func(ctx context.Context, u *url.URL) (Store, error) {
		o, err := parse(u)
		if err != nil {
			return nil, BadURL(err)
		}
		return open(ctx, o)
	})
}

// Fallback finds an opener for a scheme no backend registered (package
// plugins provides one for the schemes its plugins serve) and lists the
// schemes it knows.
type Fallback interface {
	Opener(scheme string) (Opener, bool)
	Schemes() []string
}

var fallback Fallback

// SetFallback makes Open ask f about schemes no backend registered; nil
// removes it.
func SetFallback(f Fallback) {
	registryMu.Lock()
	defer registryMu.Unlock()
	fallback = f
}

// Open opens the store a storage URL names, such as file:///var/ckpt or
// s3://bucket/prefix. The backend's package must be imported (for its
// init), or a plugin must serve the scheme (see SetFallback).
func Open(ctx context.Context, rawURL string) (Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, BadURL(fmt.Errorf("storage URL %q: %w", rawURL, err))
	}
	registryMu.RLock()
	open, ok := registry[u.Scheme]
	var schemes []string
	for s := range registry {
		schemes = append(schemes, s+"://")
	}
	fb := fallback
	registryMu.RUnlock()
	if !ok && fb != nil {
		open, ok = fb.Opener(u.Scheme)
		for _, s := range fb.Schemes() {
			schemes = append(schemes, s+"://")
		}
	}
	if !ok {
		sort.Strings(schemes)
		return nil, BadURL(fmt.Errorf("storage URL %q: unknown scheme %q (use one of %s)", redact(u), u.Scheme, strings.Join(schemes, ", ")))
	}
	return open(ctx, u)
}

// redact returns u as text without user info.
func redact(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}

// ValidKey reports whether key is acceptable to every backend: non-empty,
// relative, no empty, "." or ".." segments, no NUL or backslash.
func ValidKey(key string) error {
	if key == "" {
		return fmt.Errorf("empty key")
	}
	if strings.ContainsAny(key, "\x00\\") {
		return fmt.Errorf("key %q: contains NUL or backslash", key)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("key %q: empty, '.' or '..' segment", key)
		}
	}
	return nil
}

// ProbeAttempts bounds the requests of a backend's start-up probe.
const ProbeAttempts = 4

// RetryProbe runs a backend's start-up probe: do, asked again (200 ms
// doubling, at most ProbeAttempts times, within ctx) while transient says
// its error is worth another try. A server that is down or refuses the
// request should fail at once, not after minutes of backoff; an answer that
// says "try again" (throttling, a server error, a reset connection) should
// not stop an agent from starting. It returns do's last error.
func RetryProbe(ctx context.Context, do func(context.Context) error, transient func(error) bool) error {
	var err error
	for attempt, delay := 1, 200*time.Millisecond; ; attempt, delay = attempt+1, 2*delay {
		if err = do(ctx); err == nil || attempt == ProbeAttempts || !transient(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

// Probe is a backend's start-up check of its bucket: one request,
// asked again by RetryProbe while Transient says so, within Timeout. A
// failure becomes an *OpenError whose message Explain writes for a person.
type Probe struct {
	// Name names the bucket in errors: `s3 bucket "b"`.
	Name    string
	Timeout time.Duration
	// Check sends the request, without retries of the SDK's own.
	Check func(ctx context.Context) error
	// Transient reports an answer worth asking again; nil means
	// ProbeTransient.
	Transient func(error) bool
	// Explain returns the message of a failure (timedOut: the probe ran
	// out of Timeout) and the error the OpenError unwraps to, usually err.
	// ctx is the probe's: one more request may refine the answer.
	Explain func(ctx context.Context, err error, timedOut bool) (string, error)
}

// Run probes; nil means the bucket answered. A ctx that ends first
// returns ctx's error, named.
func (p Probe) Run(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	transient := p.Transient
	if transient == nil {
		transient = ProbeTransient
	}
	err := RetryProbe(pctx, p.Check, transient)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", p.Name, ctx.Err())
	}
	msg, cause := p.Explain(pctx, err, pctx.Err() != nil)
	return &OpenError{Msg: msg, Err: cause}
}

// ProbeTransient reports a start-up answer worth asking again: a server
// error or throttling (HTTP 5xx, 429; the error must say its status, see
// HTTPError), or a connection lost mid-request. A refused connection is
// not: nothing listens there, and an agent should say so at once.
func ProbeTransient(err error) bool {
	if c := HTTPStatus(err); c >= 500 || c == 429 {
		return true
	}
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
