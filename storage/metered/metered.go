// Package metered is a storage.Store decorator that publishes every call as
// OpenTelemetry metrics: requests by operation and outcome, their latency,
// and the bytes moved each way. It adds no behaviour of its own.
package metered

import (
	"context"
	"errors"
	"io"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ckpt-io/ckpt/storage"
)

// Store measures the store it wraps.
type Store struct {
	inner    storage.Store
	backend  attribute.KeyValue
	requests metric.Int64Counter
	latency  metric.Float64Histogram
	bytes    metric.Int64Counter
}

var (
	_ storage.Store       = (*Store)(nil)
	_ storage.Unwrapper   = (*Store)(nil)
	_ storage.RangeReader = (*Store)(nil)
)

// New wraps inner; the metrics come from the global meter provider and
// carry the backend's name (file, s3, gs) as an attribute.
func New(inner storage.Store, backend string) *Store {
	m := otel.Meter("github.com/ckpt-io/ckpt/storage")
	s := &Store{inner: inner, backend: attribute.String("backend", backend)}
	s.requests, _ = m.Int64Counter("ckpt.storage.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Storage calls, by operation and outcome (ok, not_found, exists, error)."))
	s.latency, _ = m.Float64Histogram("ckpt.storage.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Storage call latency, by operation (a Put or Get includes its transfer)."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	s.bytes, _ = m.Int64Counter("ckpt.storage.transferred", metric.WithUnit("By"),
		metric.WithDescription("Bytes moved to (up) and from (down) storage by successful calls."))
	return s
}

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() storage.Store { return s.inner }

func (s *Store) String() string { return s.inner.String() }

func (s *Store) Close() error { return s.inner.Close() }

func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, storage.ErrNotFound):
		return "not_found"
	case errors.Is(err, storage.ErrExists):
		return "exists"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "error"
}

func (s *Store) record(ctx context.Context, op string, start time.Time, err error) {
	ctx = context.WithoutCancel(ctx)
	s.requests.Add(ctx, 1, metric.WithAttributes(s.backend, attribute.String("op", op), attribute.String("outcome", outcome(err))))
	s.latency.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(s.backend, attribute.String("op", op)))
}

func (s *Store) moved(ctx context.Context, direction string, n int64) {
	s.bytes.Add(context.WithoutCancel(ctx), n, metric.WithAttributes(s.backend, attribute.String("direction", direction)))
}

func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	start := time.Now()
	err := s.inner.Put(ctx, key, body, size)
	s.record(ctx, "put", start, err)
	if err == nil {
		s.moved(ctx, "up", size)
	}
	return err
}

func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	start := time.Now()
	err := s.inner.Create(ctx, key, body, size)
	s.record(ctx, "create", start, err)
	if err == nil {
		s.moved(ctx, "up", size)
	}
	return err
}

func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	start := time.Now()
	rc, err := s.inner.Get(ctx, key)
	s.record(ctx, "get", start, err)
	if err != nil {
		return nil, err
	}
	return &countingReader{ReadCloser: rc, done: func(n int64) { s.moved(ctx, "down", n) }}, nil
}

// GetRange is metered as a get.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	start := time.Now()
	rc, err := storage.Range(ctx, s.inner, key, off, length)
	s.record(ctx, "get", start, err)
	if err != nil {
		return nil, err
	}
	return &countingReader{ReadCloser: rc, done: func(n int64) { s.moved(ctx, "down", n) }}, nil
}

func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	start := time.Now()
	info, err := s.inner.Stat(ctx, key)
	s.record(ctx, "stat", start, err)
	return info, err
}

func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	start := time.Now()
	err := s.inner.List(ctx, prefix, fn)
	s.record(ctx, "list", start, err)
	return err
}

func (s *Store) Delete(ctx context.Context, keys ...string) error {
	start := time.Now()
	err := s.inner.Delete(ctx, keys...)
	s.record(ctx, "delete", start, err)
	return err
}

// countingReader reports the bytes read once, at Close.
type countingReader struct {
	io.ReadCloser
	n    int64
	done func(int64)
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n += int64(n)
	return n, err
}

func (r *countingReader) Close() error {
	if r.done != nil {
		r.done(r.n)
		r.done = nil
	}
	return r.ReadCloser.Close()
}
