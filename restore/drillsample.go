package restore

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// drillSample is Drill with o.SampleBytes set: it reads the objects of a
// random sample of the checkpoint's files from storage, whole, hashing
// them as they stream in, and compares each with the manifest. Nothing is
// written to disk, so neither the scratch directory's free space nor
// o.MaxBytes limits it, and no engine opens anything.
func drillSample(ctx context.Context, o DrillOptions) (*DrillResult, error) {
	n := o.Checkpoint
	if n == 0 {
		cat, err := manifests.Scan(ctx, o.Store, o.Job, o.Task)
		if err != nil {
			return nil, fmt.Errorf("sample drill of task %s: %w", o.Task, err)
		}
		for _, r := range cat.Retained(o.Task) {
			n = max(n, r.Checkpoint)
		}
		if n == 0 {
			return nil, fmt.Errorf("sample drill of task %s: %w", o.Task, ErrNoCheckpoint)
		}
	}
	m, err := manifests.Load(ctx, o.Store, o.Job, o.Task, n)
	if err != nil {
		return nil, fmt.Errorf("sample drill of task %s: %w", o.Task, err)
	}
	seed := o.SampleSeed
	if seed == 0 {
		seed = rand.Uint64() | 1 // never 0: 0 asks for a random seed
	}
	sample := PickSample(m.Files, o.SampleBytes, seed)
	var total int64
	for _, f := range sample {
		total += f.Size
	}
	par := o.Parallelism
	if par < 1 {
		par = 8
	}
	start := time.Now()
	var done atomic.Int64
	progress := func(k int64) {
		if o.Progress != nil {
			o.Progress(done.Add(k), total)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(par)
	for _, f := range sample {
		g.Go(func() error {
			if err := verifyObject(gctx, o.Store, f, progress); err != nil {
				return fmt.Errorf("file %s (object %s): %w", f.Name, f.Key, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("sample drill of task %s checkpoint %d (seed %d): %w", o.Task, n, seed, err)
	}
	d := time.Since(start)
	out := &DrillResult{Task: o.Task, Checkpoint: n, Bytes: m.FullSize, Files: len(m.Files), DurationMS: d.Milliseconds(),
		Verified: true, Sample: true, SampleFiles: len(sample), SampleBytes: total, SampleSeed: seed}
	if d > 0 {
		out.ThroughputBytesPerS = float64(total) / d.Seconds()
	}
	return out, nil
}

// PickSample returns the files of files held in objects (not inline), in
// a random order drawn from seed, up to budget bytes: it stops at the
// first file that brings the total to budget or beyond, so the sample
// holds at most budget bytes plus one file. The same files and seed give
// the same sample.
func PickSample(files []manifests.File, budget int64, seed uint64) []manifests.File {
	var objs []manifests.File
	for _, f := range files {
		if f.Key != "" {
			objs = append(objs, f)
		}
	}
	r := rand.New(rand.NewPCG(seed, 0))
	r.Shuffle(len(objs), func(i, j int) { objs[i], objs[j] = objs[j], objs[i] })
	var total int64
	for i, f := range objs {
		if total >= budget {
			return objs[:i]
		}
		total += f.Size
	}
	return objs
}

// verifyObject reads f's object whole from storage into a verifier (size
// and hash), writing nothing.
func verifyObject(ctx context.Context, s storage.Store, f manifests.File, progress func(int64)) error {
	rc, err := s.Get(ctx, f.Key)
	if err != nil {
		return err
	}
	defer rc.Close()
	v := newVerifier(f)
	bp := fsutil.GetBuf()
	defer fsutil.PutBuf(bp)
	buf := *bp
	for {
		k, rerr := rc.Read(buf)
		if k > 0 {
			if v.n+int64(k) > f.Size {
				return fmt.Errorf("object is larger than the %d bytes the manifest says: the stored object is corrupt", f.Size)
			}
			v.Write(buf[:k])
			progress(int64(k))
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return v.check()
}
