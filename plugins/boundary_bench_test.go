package plugins_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/plugins"
	"github.com/ckpt-io/ckpt/storage"
	_ "github.com/ckpt-io/ckpt/storage/s3"
)

// BenchmarkBoundary measures the cost of the plugin boundary: the same
// workload through ckpt-plugin-s3 and through the built-in S3 backend in
// this process, both on one versitygw, in one run. Each round puts then
// gets the workload in process and then through the plugin; the metrics
// are the medians over the rounds of MB/s and of the plugin/in-process
// ratio. Bodies come from a file, as the uploader passes them.
//
//	go test -run '^$' -bench Boundary -benchtime 1x ./plugins/
//
// CKPT_BOUNDARY_ROUNDS sets the rounds (default 3); CKPT_BOUNDARY_SCALE
// divides the object counts (default 1: 16 x 64 MiB, 1,000 x 1 MiB).
func BenchmarkBoundary(b *testing.B) {
	rounds := envInt(b, "CKPT_BOUNDARY_ROUNDS", 3)
	scale := envInt(b, "CKPT_BOUNDARY_SCALE", 1)
	srv := testservers.S3(b)
	srv.CreateBucket(b, "bench")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		b.Setenv(k, v)
	}
	ctx := context.Background()
	h, err := plugins.Discover(ctx, plugins.Options{Dir: install(b, "s3")})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	inproc, err := storage.Open(ctx, srv.URL("bench", "inproc"))
	if err != nil {
		b.Fatal(err)
	}
	defer inproc.Close()
	viaPlugin, err := h.OpenStorage(ctx, strings.Replace(srv.URL("bench", "plugin"), "s3://", "s3+plugin://", 1))
	if err != nil {
		b.Fatal(err)
	}
	defer viaPlugin.Close()

	dir := b.TempDir()
	for _, w := range []struct {
		name     string
		size     int64
		count    int
		parallel int
	}{
		{"64MiB", 64 << 20, 16 / scale, 1},
		{"1MiB", 1 << 20, 1000 / scale, 8},
	} {
		b.Run(w.name, func(b *testing.B) {
			src := filepath.Join(dir, w.name)
			data := make([]byte, w.size)
			rand.Read(data)
			if err := os.WriteFile(src, data, 0o600); err != nil {
				b.Fatal(err)
			}
			var m [4][]float64 // in-process put, get; plugin put, get
			var ratio [2][]float64
			for range b.N {
				for range rounds {
					ip, ig := transfer(b, inproc, src, w.size, w.count, w.parallel)
					pp, pg := transfer(b, viaPlugin, src, w.size, w.count, w.parallel)
					for i, v := range []float64{ip, ig, pp, pg} {
						m[i] = append(m[i], v)
					}
					ratio[0] = append(ratio[0], pp/ip)
					ratio[1] = append(ratio[1], pg/ig)
				}
			}
			b.ReportMetric(median(m[0]), "inproc-put-MB/s")
			b.ReportMetric(median(m[2]), "plugin-put-MB/s")
			b.ReportMetric(median(ratio[0]), "put-ratio")
			b.ReportMetric(median(m[1]), "inproc-get-MB/s")
			b.ReportMetric(median(m[3]), "plugin-get-MB/s")
			b.ReportMetric(median(ratio[1]), "get-ratio")
			b.Logf("%d x %s, %d in flight, %d rounds: put ratios %.2f, get ratios %.2f", w.count, w.name, w.parallel, rounds, ratio[0], ratio[1])
		})
	}
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// transfer puts count copies of the file at src, then gets them back,
// with parallel calls in flight, and returns put and get MB/s.
func transfer(b *testing.B, s storage.Store, src string, size int64, count, parallel int) (put, get float64) {
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
		b.Fatal(err)
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
		b.Fatal(err)
	}
	get = float64(size) * float64(count) / time.Since(start).Seconds() / 1e6
	return put, get
}
