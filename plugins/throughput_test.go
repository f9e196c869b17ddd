package plugins_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/internal/testservers"
	"github.com/ckpt-io/ckpt/plugins"
	"github.com/ckpt-io/ckpt/storage"
	_ "github.com/ckpt-io/ckpt/storage/s3"
)

// TestThroughputPluginVsInProcess measures uploads and downloads through
// ckpt-plugin-s3 against the built-in S3 backend in this process, both on
// versitygw: 1 GiB as 16 objects of 64 MiB, and 1,000 objects of 1 MiB
// with 8 in flight, put from files as the uploader does. It logs MB/s and
// the plugin/in-process ratio. Set CKPT_PLUGIN_BENCH=1 to run it.
func TestThroughputPluginVsInProcess(t *testing.T) {
	if os.Getenv("CKPT_PLUGIN_BENCH") == "" {
		t.Skip("set CKPT_PLUGIN_BENCH=1 to measure plugin throughput (moves about 8 GiB through versitygw)")
	}
	srv := testservers.S3(t)
	srv.CreateBucket(t, "bench")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	h := discover(t, plugins.Options{Dir: install(t, "s3")})
	ctx := context.Background()
	inproc, err := storage.Open(ctx, srv.URL("bench", "inproc"))
	if err != nil {
		t.Fatal(err)
	}
	defer inproc.Close()
	viaPlugin := open(t, h, strings.Replace(srv.URL("bench", "plugin"), "s3://", "s3+plugin://", 1))
	defer viaPlugin.Close()

	dir := t.TempDir()
	file := func(size int64) string {
		p := filepath.Join(dir, fmt.Sprint(size))
		b := make([]byte, size)
		rand.Read(b)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, w := range []struct {
		name     string
		size     int64
		count    int
		parallel int
	}{
		{"16 x 64 MiB", 64 << 20, 16, 1},
		{"1000 x 1 MiB", 1 << 20, 1000, 8},
	} {
		src := file(w.size)
		var rates [2][2]float64 // store, put/get
		for i, s := range []storage.Store{inproc, viaPlugin} {
			put, get := run(t, s, src, w.size, w.count, w.parallel)
			rates[i] = [2]float64{put, get}
		}
		t.Logf("%s: put in-process %.0f MB/s, plugin %.0f MB/s (%.2fx); get in-process %.0f MB/s, plugin %.0f MB/s (%.2fx)",
			w.name, rates[0][0], rates[1][0], rates[1][0]/rates[0][0], rates[0][1], rates[1][1], rates[1][1]/rates[0][1])
	}
}

// run puts count copies of the file at src, then gets them back, with
// parallel calls in flight, and returns put and get MB/s.
func run(t *testing.T, s storage.Store, src string, size int64, count, parallel int) (put, get float64) {
	ctx := context.Background()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for i := range count {
		g.Go(func() error {
			f, err := os.Open(src)
			if err != nil {
				return err
			}
			defer f.Close()
			return s.Put(gctx, fmt.Sprintf("obj/%04d", i), f, size)
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	put = float64(size) * float64(count) / time.Since(start).Seconds() / 1e6
	start = time.Now()
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for i := range count {
		g.Go(func() error {
			rc, err := s.Get(gctx, fmt.Sprintf("obj/%04d", i))
			if err != nil {
				return err
			}
			defer rc.Close()
			n, err := io.Copy(io.Discard, rc)
			if err == nil && n != size {
				err = fmt.Errorf("got %d bytes, want %d", n, size)
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	get = float64(size) * float64(count) / time.Since(start).Seconds() / 1e6
	return put, get
}
