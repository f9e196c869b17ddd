package ratelimit_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/storage/ratelimit"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

func fileStore(t *testing.T) storage.Store {
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.Store {
		return ratelimit.New(fileStore(t), ratelimit.Limits{Upload: 400 << 20, Download: 400 << 20})
	}, storagetest.Options{LargeSize: 8 << 20})
}

func TestUploadLimitIsSharedByConcurrentPuts(t *testing.T) {
	const limit = 4 << 20 // 4 MiB/s
	s := ratelimit.New(fileStore(t), ratelimit.Limits{Upload: limit})
	data := make([]byte, 2<<20)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Put(context.Background(), "k"+string(rune('a'+i)), bytes.NewReader(data), int64(len(data)))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// 6 MiB at 4 MiB/s with a 1 MiB burst: at least 1.25 s.
	if el := time.Since(start); el < 1200*time.Millisecond || el > 4*time.Second {
		t.Fatalf("3 parallel 2 MiB puts at 4 MiB/s took %v, want about 1.25-1.5 s", el)
	}
}

func TestDownloadLimitAndUnlimitedUpload(t *testing.T) {
	s := ratelimit.New(fileStore(t), ratelimit.Limits{Download: 2 << 20})
	data := make([]byte, 2<<20)
	ctx := context.Background()
	start := time.Now()
	if err := s.Put(ctx, "k", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Fatalf("unlimited upload took %v", el)
	}
	start = time.Now()
	rc, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, rc)
	rc.Close()
	if err != nil || n != int64(len(data)) {
		t.Fatalf("get: %d bytes, %v", n, err)
	}
	// 2 MiB at 2 MiB/s with a 512 KiB burst: at least 0.75 s.
	if el := time.Since(start); el < 700*time.Millisecond {
		t.Fatalf("2 MiB download at 2 MiB/s took only %v", el)
	}
}

func TestCancelledWhileWaiting(t *testing.T) {
	s := ratelimit.New(fileStore(t), ratelimit.Limits{Upload: 1024})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	data := make([]byte, 1<<20)
	err := s.Put(ctx, "k", bytes.NewReader(data), int64(len(data)))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("put of 1 MiB at 1 KiB/s with a 100ms deadline: %v", err)
	}
	if _, ok := storage.AsCleaner(s); !ok {
		t.Fatal("AsCleaner does not see through the limiter")
	}
}
