package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// RangeReader is implemented by stores that can read part of an object
// (S3 and GCS ranged GETs, ReadAt on files), so that a large object can
// be fetched in parallel pieces.
//
// GetRange returns a reader of the length bytes of key that start at
// offset off; the caller closes it. off >= 0 and length > 0, and the range
// must lie inside the object: a backend may return fewer bytes when it
// does not (or refuse), so callers count what they read and treat a short
// piece as an error. A missing key returns an error wrapping ErrNotFound.
// Like Get, it honours ctx and is safe for concurrent use.
//
// Decorators implement GetRange by adding their concern to the GetRange of
// the store they wrap (see Range); AsRangeReader reports a RangeReader only
// when the backend at the bottom of the chain reads ranges itself.
type RangeReader interface {
	GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error)
}

// ErrNoRange is returned (wrapped) by Range, and by a decorator's
// GetRange, when the backend under it cannot read ranges.
var ErrNoRange = errors.New("the store cannot read byte ranges")

// AsRangeReader finds the outermost RangeReader in s or the stores it
// wraps, provided the backend itself reads ranges (a decorator's GetRange
// is only as good as the store under it).
func AsRangeReader(s Store) (RangeReader, bool) {
	if _, ok := Innermost(s).(RangeReader); !ok {
		return nil, false
	}
	return find[RangeReader](s)
}

// Range reads a range of key through s's RangeReader: what a decorator's
// GetRange calls on the store it wraps. It fails with ErrNoRange when s
// cannot read ranges, and checks the arguments for every backend.
func Range(ctx context.Context, s Store, key string, off, length int64) (io.ReadCloser, error) {
	if off < 0 || length <= 0 {
		return nil, fmt.Errorf("get %s: bad range %d+%d", key, off, length)
	}
	rr, ok := AsRangeReader(s)
	if !ok {
		return nil, fmt.Errorf("get %s: %w: %s", key, ErrNoRange, s)
	}
	return rr.GetRange(ctx, key, off, length)
}
