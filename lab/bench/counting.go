package bench

import (
	"context"
	"io"
	"sync/atomic"

	"github.com/ckpt-io/ckpt/storage"
)

// counting is a storage decorator that counts the bytes and objects
// written through it: the numerator of write amplification.
type counting struct {
	storage.Store
	bytes   atomic.Int64
	objects atomic.Int64
}

var _ storage.Store = (*counting)(nil)

func (c *counting) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	err := c.Store.Put(ctx, key, body, size)
	if err == nil {
		c.bytes.Add(size)
		c.objects.Add(1)
	}
	return err
}

func (c *counting) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	err := c.Store.Create(ctx, key, body, size)
	if err == nil {
		c.bytes.Add(size)
		c.objects.Add(1)
	}
	return err
}

// Unwrap lets callers reach the wrapped store's optional interfaces.
func (c *counting) Unwrap() storage.Store { return c.Store }

// written returns the totals so far.
func (c *counting) written() (bytes, objects int64) { return c.bytes.Load(), c.objects.Load() }
