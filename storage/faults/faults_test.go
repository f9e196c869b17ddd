package faults_test

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
	"github.com/ckpt-io/ckpt/storage/retry"
)

func newStore(t *testing.T, o faults.Options) (*faults.Store, *file.Store) {
	inner, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return faults.New(inner, o), inner
}

// outcomes runs a fixed sequence of calls and records which failed.
func outcomes(t *testing.T, s storage.Store) []bool {
	ctx := context.Background()
	var out []bool
	for range 100 {
		err := s.Put(ctx, "k", bytes.NewReader([]byte("hello")), 5)
		out = append(out, err == nil)
		_, err = s.Stat(ctx, "k")
		out = append(out, err == nil)
	}
	return out
}

func TestSameSeedSameFaults(t *testing.T) {
	o := faults.Uniform(42, 0.5)
	a, _ := newStore(t, o)
	b, _ := newStore(t, o)
	ra, rb := outcomes(t, a), outcomes(t, b)
	if !equal(ra, rb) {
		t.Fatal("two stores with the same seed injected different faults")
	}
	o.Seed = 43
	c, _ := newStore(t, o)
	if equal(ra, outcomes(t, c)) {
		t.Fatal("a different seed injected the same faults")
	}
}

func equal(a, b []bool) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func TestErrorsAreTransientAndSlowDownThrottles(t *testing.T) {
	for k := range 4 {
		e := &faults.Error{Kind: faults.Kind(k)}
		if !retry.Transient(e) {
			t.Errorf("%s fault is not transient", e.Kind)
		}
		if retry.Throttled(e) != (e.Kind == faults.SlowDown) {
			t.Errorf("%s fault: Throttled = %v", e.Kind, retry.Throttled(e))
		}
	}
}

func TestMidBodyPutLeavesNothing(t *testing.T) {
	s, inner := newStore(t, faults.Options{MidBody: 1})
	data := bytes.Repeat([]byte("x"), 1<<16)
	err := s.Put(context.Background(), "k", bytes.NewReader(data), int64(len(data)))
	var fe *faults.Error
	if !errors.As(err, &fe) || fe.Kind != faults.MidBody {
		t.Fatalf("put with a mid-body fault: %v", err)
	}
	if _, err := inner.Stat(context.Background(), "k"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the failed put left an object: %v", err)
	}
}

func TestAfterWriteFaultWritesThenFails(t *testing.T) {
	s, inner := newStore(t, faults.Options{AfterWrite: 1})
	err := s.Create(context.Background(), "k", bytes.NewReader([]byte("v")), 1)
	var fe *faults.Error
	if !errors.As(err, &fe) || fe.Kind != faults.AfterWrite {
		t.Fatalf("create with an after-write fault: %v", err)
	}
	if _, err := inner.Stat(context.Background(), "k"); err != nil {
		t.Fatalf("the object was not written: %v", err)
	}
	if s.Injected(faults.AfterWrite) != 1 {
		t.Fatalf("injected count %d, want 1", s.Injected(faults.AfterWrite))
	}
}

func TestMidBodyGetBreaksTheReader(t *testing.T) {
	s, inner := newStore(t, faults.Options{MidBody: 1})
	data := bytes.Repeat([]byte("y"), 2<<20) // larger than the 1 MiB fault window
	ctx := context.Background()
	if err := inner.Put(ctx, "k", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	n, err := io.Copy(io.Discard, rc)
	if err == nil || n >= int64(len(data)) {
		t.Fatalf("read %d bytes, err %v; want a failure part way", n, err)
	}
}

func TestLatencyHonoursContext(t *testing.T) {
	s, _ := newStore(t, faults.Options{Latency: 1, MaxLatency: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := s.Stat(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stat under injected latency: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("latency ignored the context")
	}
}
