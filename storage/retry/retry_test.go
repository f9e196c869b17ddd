package retry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/faults"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/storage/retry"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

func noSleep(ctx context.Context, _ time.Duration) error { return ctx.Err() }

func fileStore(t *testing.T) *file.Store {
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformanceWithThirtyPercentFaults(t *testing.T) {
	var injected []*faults.Store
	storagetest.Run(t, func(t *testing.T) storage.Store {
		f := faults.New(fileStore(t), faults.Uniform(uint64(len(injected))+1, 0.3))
		injected = append(injected, f)
		return retry.New(f, retry.Options{MaxAttempts: 30, Sleep: noSleep})
	}, storagetest.Options{LargeSize: 4 << 20})
	var total [4]int64
	for _, f := range injected {
		for k := range total {
			total[k] += f.Injected(faults.Kind(k))
		}
	}
	for k, n := range total {
		if n == 0 {
			t.Errorf("no %s faults were injected: the test proves nothing about them", faults.Kind(k))
		}
	}
	t.Logf("faults injected (transient, slowdown, mid-body, after-write): %v", total)
}

func TestCreateAfterLostResponseSucceedsOnce(t *testing.T) {
	inner := fileStore(t)
	f := faults.New(inner, faults.Options{AfterWrite: 1})
	s := retry.New(f, retry.Options{Sleep: func(ctx context.Context, _ time.Duration) error {
		f.SetEnabled(false) // the retry goes through
		return nil
	}})
	ctx := context.Background()
	if err := s.Create(ctx, "m", bytes.NewReader([]byte("mine")), 4); err != nil {
		t.Fatalf("create whose response was lost: %v, want success", err)
	}
	f.SetEnabled(true)
	err := s.Create(ctx, "m", bytes.NewReader([]byte("other")), 5)
	if !errors.Is(err, storage.ErrExists) {
		t.Fatalf("second create of different bytes: %v, want ErrExists", err)
	}
	f.SetEnabled(false)
	err = s.Create(ctx, "m", bytes.NewReader([]byte("mine")), 4)
	if !errors.Is(err, storage.ErrExists) {
		t.Fatalf("a first-attempt create of an existing key with equal bytes: %v, want ErrExists", err)
	}
}

func TestCreateRetryDoesNotStealAnotherWritersKey(t *testing.T) {
	inner := fileStore(t)
	ctx := context.Background()
	if err := inner.Put(ctx, "m", bytes.NewReader([]byte("theirs")), 6); err != nil {
		t.Fatal(err)
	}
	f := faults.New(inner, faults.Options{Transient: 1})
	s := retry.New(f, retry.Options{Sleep: func(context.Context, time.Duration) error { f.SetEnabled(false); return nil }})
	err := s.Create(ctx, "m", bytes.NewReader([]byte("mine!!")), 6)
	if !errors.Is(err, storage.ErrExists) {
		t.Fatalf("create after a transient failure onto another writer's object: %v, want ErrExists", err)
	}
}

type statusErr int

func (e statusErr) Error() string       { return fmt.Sprintf("status %d", int(e)) }
func (e statusErr) HTTPStatusCode() int { return int(e) }

type codeErr string

func (e codeErr) Error() string     { return string(e) }
func (e codeErr) ErrorCode() string { return string(e) }

func TestTransientClassification(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"not found", fmt.Errorf("get x: %w", storage.ErrNotFound), false},
		{"exists", fmt.Errorf("create x: %w", storage.ErrExists), false},
		{"cancelled", fmt.Errorf("put: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, false},
		{"503", statusErr(503), true},
		{"500", statusErr(500), true},
		{"429", statusErr(429), true},
		{"408", statusErr(408), true},
		{"403", statusErr(403), false},
		{"404", statusErr(404), false},
		{"412", statusErr(412), false},
		{"SlowDown code", codeErr("SlowDown"), true},
		{"AccessDenied code", codeErr("AccessDenied"), false},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"unexpected EOF", io.ErrUnexpectedEOF, true},
		{"injected fault", &faults.Error{Kind: faults.Transient}, true},
		{"plain error", errors.New("body has 3 bytes, want 10"), false},
	}
	for _, c := range cases {
		if got := retry.Transient(c.err); got != c.want {
			t.Errorf("Transient(%s) = %v, want %v", c.name, got, c.want)
		}
	}
	if !retry.Throttled(codeErr("SlowDown")) || !retry.Throttled(statusErr(429)) || retry.Throttled(statusErr(500)) {
		t.Error("Throttled misclassifies SlowDown, 429 or 500")
	}
}

// countingStore fails every call with err and counts the calls.
type countingStore struct {
	storage.Store
	err   error
	calls int
}

func (c *countingStore) Stat(context.Context, string) (storage.ObjectInfo, error) {
	c.calls++
	return storage.ObjectInfo{}, c.err
}

func TestAttemptsAreBoundedAndPermanentErrorsNotRetried(t *testing.T) {
	c := &countingStore{err: statusErr(503)}
	s := retry.New(c, retry.Options{MaxAttempts: 4, Sleep: noSleep})
	if _, err := s.Stat(context.Background(), "k"); err == nil || c.calls != 4 {
		t.Fatalf("503 forever: %d calls, err %v; want 4 calls and an error", c.calls, err)
	}
	c = &countingStore{err: statusErr(403)}
	s = retry.New(c, retry.Options{MaxAttempts: 4, Sleep: noSleep})
	if _, err := s.Stat(context.Background(), "k"); err == nil || c.calls != 1 {
		t.Fatalf("403: %d calls, err %v; want 1 call", c.calls, err)
	}
}

func TestSlowDownBacksOffLonger(t *testing.T) {
	mean := func(err error) time.Duration {
		var total time.Duration
		var n int
		for range 200 {
			s := retry.New(&countingStore{err: err}, retry.Options{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: time.Hour,
				Sleep: func(_ context.Context, d time.Duration) error { total += d; n++; return nil }})
			s.Stat(context.Background(), "k")
		}
		return total / time.Duration(n)
	}
	plain, slow := mean(statusErr(500)), mean(codeErr("SlowDown"))
	if slow < 2*plain {
		t.Fatalf("mean backoff after SlowDown %v is not well above the %v after a 500", slow, plain)
	}
}

func TestCancelStopsBackoff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := retry.New(&countingStore{err: statusErr(503)}, retry.Options{BaseDelay: time.Hour, MaxDelay: time.Hour})
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	start := time.Now()
	_, err := s.Stat(ctx, "k")
	if !errors.Is(err, context.Canceled) || time.Since(start) > 10*time.Second {
		t.Fatalf("cancel during backoff: %v after %v", err, time.Since(start))
	}
}

func TestGetResumesAfterABrokenBody(t *testing.T) {
	inner := fileStore(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
	ctx := context.Background()
	if err := inner.Put(ctx, "big", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	f := faults.New(inner, faults.Options{Seed: 7, MidBody: 0.8})
	s := retry.New(f, retry.Options{MaxAttempts: 50, Sleep: noSleep})
	rc, err := s.Get(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("resumed get: %d bytes, equal %v, err %v", len(got), bytes.Equal(got, data), err)
	}
	if f.Injected(faults.MidBody) == 0 {
		t.Fatal("no mid-body faults were injected")
	}
}

func TestUnwrapReachesTheCleaner(t *testing.T) {
	s := retry.New(faults.New(fileStore(t), faults.Options{}), retry.Options{})
	if _, ok := storage.AsCleaner(s); !ok {
		t.Fatal("AsCleaner does not find the file store's cleaner through retry and faults")
	}
}
