package storage_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/faults"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/storage/metered"
	"github.com/ckpt-io/ckpt/storage/ratelimit"
	"github.com/ckpt-io/ckpt/storage/retry"
)

// noRange is a backend that reads no ranges: it hides the file store's
// GetRange behind the Store interface.
type noRange struct{ storage.Store }

func TestADecoratorChainPassesRangesThrough(t *testing.T) {
	ctx := context.Background()
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 256<<10)
	if err := fs.Put(ctx, "a/obj", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	chain := func(inner storage.Store) storage.Store {
		// Faults under retries: ranges must resume where they broke.
		f := faults.New(inner, faults.Options{Seed: 3, Transient: 0.2, MidBody: 0.5})
		return retry.New(ratelimit.New(metered.New(f, "test"), ratelimit.Limits{Download: 1 << 30}),
			retry.Options{MaxAttempts: 50, Sleep: func(context.Context, time.Duration) error { return nil }})
	}

	s := chain(fs)
	rr, ok := storage.AsRangeReader(s)
	if !ok {
		t.Fatal("a chain of decorators over the file store hides its RangeReader")
	}
	if rr != storage.RangeReader(s.(*retry.Store)) {
		t.Fatal("AsRangeReader skipped the outermost decorator: its concern (retries) would be lost")
	}
	for _, r := range [][2]int64{{100, 5000}, {1 << 20, 3 << 20}, {int64(len(data)) - 7, 7}} {
		for range 5 {
			rc, err := rr.GetRange(ctx, "a/obj", r[0], r[1])
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
				t.Fatalf("range %d+%d through the chain: %d bytes, %v", r[0], r[1], len(got), err)
			}
		}
	}
	if f := storage.Innermost(s); f != storage.Store(fs) {
		t.Fatal("the chain's backend is not the file store")
	}

	// Over a backend without ranges the chain offers none, and a
	// decorator asked anyway says so.
	s = chain(noRange{fs})
	if _, ok := storage.AsRangeReader(s); ok {
		t.Fatal("AsRangeReader offered ranges of a backend that reads none")
	}
	if _, err := s.(storage.RangeReader).GetRange(ctx, "a/obj", 0, 10); !errors.Is(err, storage.ErrNoRange) {
		t.Fatalf("GetRange over a backend without ranges: %v, want ErrNoRange", err)
	}
}
