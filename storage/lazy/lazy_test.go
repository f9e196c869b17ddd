package lazy

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// Before the store opens, every call fails with an UnavailableError that
// wraps the open's error and is worth retrying; failed opens are retried
// at most once per interval; once open, calls reach the store.
func TestAStoreThatCannotOpenIsUnavailableUntilItCan(t *testing.T) {
	down := errors.New("connection refused")
	opens, up := 0, false
	dir := t.TempDir()
	open := func(context.Context) (storage.Store, error) {
		opens++
		if !up {
			return nil, down
		}
		return file.Open(dir)
	}
	l := New("s3://b/p", nil, down, open, 50*time.Millisecond)
	ctx := context.Background()
	_, err := l.Stat(ctx, "k")
	var ue *UnavailableError
	if !errors.As(err, &ue) || !errors.Is(err, down) || !ue.Temporary() {
		t.Fatalf("Stat before the store opens: %v, want an UnavailableError wrapping the open's error", err)
	}
	if errors.Is(err, storage.ErrNotFound) {
		t.Fatal("an unopened store answered not found: callers would take it for an empty store")
	}
	for range 10 {
		l.List(ctx, "", func(storage.ObjectInfo) error { return nil })
	}
	if opens != 0 {
		t.Fatalf("%d opens within the retry interval of the failed one at start, want 0", opens)
	}
	up = true
	time.Sleep(60 * time.Millisecond)
	if err := l.Put(ctx, "k", bytes.NewReader([]byte("x")), 1); err != nil {
		t.Fatalf("Put once storage answers: %v", err)
	}
	if _, err := l.Stat(ctx, "k"); err != nil || opens != 1 || !l.Opened() {
		t.Fatalf("after the open: stat %v, %d opens, opened %v", err, opens, l.Opened())
	}
	if _, ok := storage.AsRangeReader(l); !ok {
		t.Fatal("the open store's optional interfaces are not reachable through the decorator")
	}
}
