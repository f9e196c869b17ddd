package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/lab/workload"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
)

const task = "bench-0"

// ensureStore opens the workload's store, loads it (round 1) and starts
// the incremental agent, once.
func (r *run) ensureStore(ctx context.Context) error {
	if r.w != nil {
		return nil
	}
	w, err := workload.Open(filepath.Join(r.root, "store"), workload.Options{Seed: r.o.Seed, StateBytes: r.o.StateBytes, Churn: r.o.Churn})
	if err != nil {
		return err
	}
	r.w = w
	r.logf("loading %s into Pebble", human.Bytes(r.o.StateBytes))
	if _, err := w.Round(ctx); err != nil {
		return fmt.Errorf("load the state: %w", err)
	}
	if r.inc, err = r.startAgent(ctx, "inc"); err != nil {
		return err
	}
	r.next = 1
	return nil
}

// snapFile is one file of a snapshot directory.
type snapFile struct {
	name string
	size int64
}

func isShared(name string) bool {
	return strings.HasSuffix(name, ".sst") || strings.HasSuffix(name, ".blob")
}

// snapshot flushes the memtable and makes a Pebble checkpoint (with the
// flushed WAL) in a fresh dir, as client/pebble's Checkpoint does, and lists it.
func (r *run) snapshot(dir string) ([]snapFile, error) {
	if err := r.w.DB().Flush(); err != nil {
		return nil, fmt.Errorf("flush: %w", err)
	}
	return r.checkpointTo(dir)
}

// checkpointTo is snapshot without the flush.
func (r *run) checkpointTo(dir string) ([]snapFile, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := r.w.DB().Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return nil, fmt.Errorf("pebble checkpoint: %w", err)
	}
	return listDir(dir)
}

// linkClone makes dst a directory of hard links to the files of src.
func linkClone(src, dst string) error {
	files, err := listDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		if err := os.Link(filepath.Join(src, f.name), filepath.Join(dst, f.name)); err != nil {
			return err
		}
	}
	return nil
}

func listDir(dir string) ([]snapFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []snapFile
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		if fi.Mode().IsRegular() {
			out = append(out, snapFile{e.Name(), fi.Size()})
		}
	}
	return out, nil
}

// sent is one checkpoint request's outcome as the app sees it.
type sent struct {
	ev      client.Event
	synced  client.Event
	pause   time.Duration // request sent to synced read
	total   time.Duration // request sent to completed read
	written int64         // bytes the agent wrote to storage meanwhile
}

// send checkpoints dir as checkpoint n of tsk through agent p and waits for
// the end. With handoff the agent takes dir over (one rename, as
// client/pebble's Checkpoint does); without, it hard-links every file.
func send(ctx context.Context, p *inproc, tsk string, n uint64, dir string, handoff bool) (sent, error) {
	b0, _ := p.count.written()
	t0 := time.Now()
	pend, err := p.client.Send(ctx, client.Request{Task: tsk, Checkpoint: n, Dir: dir, Engine: "pebble", Handoff: handoff})
	if err != nil {
		return sent{}, fmt.Errorf("checkpoint %d: %w", n, err)
	}
	s := sent{pause: time.Since(t0), synced: pend.Synced}
	if s.ev, err = pend.Wait(ctx); err != nil {
		return s, fmt.Errorf("checkpoint %d: %w", n, err)
	}
	s.total = time.Since(t0)
	b1, _ := p.count.written()
	s.written = b1 - b0
	return s, nil
}

// incremental runs the workload for Checkpoints rounds and sends each
// snapshot to the incremental agent and to a full-upload one; then it
// restores the last checkpoint from the local copy and from storage.
func (r *run) incremental(ctx context.Context) error {
	if err := r.ensureStore(ctx); err != nil {
		return err
	}
	var full *fullAgent
	if r.o.runs("incremental") {
		var err error
		if full, err = r.startFullAgent(ctx, "full"); err != nil {
			return err
		}
		defer full.close()
	}
	seen := map[snapFile]bool{}
	var exp *workload.Expected
	var last uint64
	// Pebble's counters are read at each snapshot, so that compactions
	// running while the agents upload count toward the next checkpoint.
	lsm0 := r.w.LSM()
	for i := 1; i <= r.o.Checkpoints; i++ {
		var writes int
		if i > 1 {
			rs, err := r.w.Round(ctx)
			if err != nil {
				return fmt.Errorf("workload round: %w", err)
			}
			writes = rs.Writes()
		} else {
			writes = int(r.w.Stats().Writes())
		}
		exp = r.w.Snapshot()
		n := r.next
		r.next++
		dir := filepath.Join(r.root, fmt.Sprintf("snap-%d", n))
		files, err := r.snapshot(dir)
		if err != nil {
			return err
		}
		lsm1 := r.w.LSM()
		s := CheckpointSample{Checkpoint: n, Files: len(files), Writes: writes,
			FlushedBytes: int64(lsm1.FlushedBytes - lsm0.FlushedBytes), CompactedBytes: int64(lsm1.CompactedBytes - lsm0.CompactedBytes)}
		lsm0 = lsm1
		for _, f := range files {
			s.FullSize += f.size
			if !isShared(f.name) || !seen[f] {
				s.NewBytes += f.size
			}
			if isShared(f.name) {
				seen[f] = true
			}
		}
		// Both agents get the snapshot as an app hands it off (the way
		// client/pebble's Checkpoint does): the full-upload agent gets a
		// hard-linked clone, made before anything is timed.
		fullDir := dir + "-full"
		if full != nil {
			if err := linkClone(dir, fullDir); err != nil {
				return err
			}
		}
		inc, err := send(ctx, r.inc, task, n, dir, true)
		if err != nil {
			return fmt.Errorf("incremental agent: %w", err)
		}
		last = n
		s.BytesWritten, s.CheckpointSize = inc.written, inc.ev.CheckpointSize
		s.FilesUploaded, s.FilesReused = inc.ev.FilesUploaded, inc.ev.FilesReused
		s.PauseMS, s.SyncMS, s.DurationMS = ms(inc.pause), inc.synced.SyncMS, ms(inc.total)
		if s.NewBytes > 0 {
			s.Amplification = round(float64(s.BytesWritten)/float64(s.NewBytes), 5)
		}
		if full != nil {
			fs, err := full.send(ctx, n, fullDir)
			if err != nil {
				return fmt.Errorf("full-upload agent: %w", err)
			}
			s.FullBytesWritten, s.FullDurationMS = fs.written, ms(fs.total)
			if fs.written > 0 {
				s.BytesRatio = round(float64(inc.written)/float64(fs.written), 5)
			}
			if fs.total > 0 {
				s.DurationRatio = round(inc.total.Seconds()/fs.total.Seconds(), 5)
			}
			r.rep.Series = append(r.rep.Series, s)
		}
		os.RemoveAll(dir) // left when an agent refused it
		os.RemoveAll(fullDir)
		r.logf("checkpoint %d: %d files, %s full, %s new, wrote %s (full agent %s), %.0f ms vs %.0f ms",
			n, s.Files, human.Bytes(s.FullSize), human.Bytes(s.NewBytes), human.Bytes(s.BytesWritten), human.Bytes(s.FullBytesWritten), s.DurationMS, s.FullDurationMS)
	}
	if full != nil {
		r.summarizeSeries()
	}
	if r.o.runs("restore") {
		return r.restores(ctx, last, exp)
	}
	return nil
}

func (r *run) summarizeSeries() {
	ss := r.rep.Series
	a := &Amplification{}
	var ampl []float64
	for _, s := range ss {
		a.BytesWritten += s.BytesWritten
		a.NewBytes += s.NewBytes
		ampl = append(ampl, s.Amplification)
		a.Max = max(a.Max, s.Amplification)
	}
	if a.NewBytes > 0 {
		a.Overall = round(float64(a.BytesWritten)/float64(a.NewBytes), 5)
	}
	a.Median = percentile(ampl, 50)
	r.rep.Amplification = a
	iv := &IncrementalVsFull{Churn: r.o.Churn}
	var br, dr []float64
	var newBytes, fullSize, lsmBytes int64
	for _, s := range ss[1:] {
		iv.IncrementalBytes += s.BytesWritten
		iv.FullBytes += s.FullBytesWritten
		newBytes, fullSize, lsmBytes = newBytes+s.NewBytes, fullSize+s.FullSize, lsmBytes+s.FlushedBytes+s.CompactedBytes
		iv.IncrementalMS += s.DurationMS
		iv.FullMS += s.FullDurationMS
		br = append(br, s.BytesRatio)
		dr = append(dr, s.DurationRatio)
	}
	if iv.FullBytes > 0 {
		iv.BytesRatio = round(float64(iv.IncrementalBytes)/float64(iv.FullBytes), 5)
	}
	if iv.FullMS > 0 {
		iv.DurationRatio = round(iv.IncrementalMS/iv.FullMS, 5)
	}
	if fullSize > 0 {
		iv.NewBytesRatio = round(float64(newBytes)/float64(fullSize), 5)
		iv.LSMBytesRatio = round(float64(lsmBytes)/float64(fullSize), 5)
	}
	iv.IncrementalMS, iv.FullMS = round(iv.IncrementalMS, 5), round(iv.FullMS, 5)
	iv.MedianBytesRatio, iv.MedianDurationRatio = percentile(br, 50), percentile(dr, 50)
	r.rep.IncrementalVsFull = iv
}

// restores restores checkpoint n from the local copy and from storage
// alone, timing each, and verifies both against exp.
func (r *run) restores(ctx context.Context, n uint64, exp *workload.Expected) error {
	fig := &RestoreFigure{Checkpoint: n, Keys: exp.Keys()}
	r.rep.Restore = fig
	var errs []string
	for _, source := range []string{"local", "local-identity", "remote"} {
		dir := filepath.Join(r.root, "restore-"+source)
		o := restore.Options{Store: r.inc.store, Job: r.inc.job, Task: task, Target: dir, Checkpoint: n}
		if source != "remote" {
			o.LocalDir = r.inc.localDir
			o.TrustUnchangedLocal = source == "local-identity"
		}
		t0 := time.Now()
		res, err := restore.Run(ctx, o)
		d := time.Since(t0)
		res.Wait() // untimed: the local copy re-created after a move
		if err != nil {
			errs = append(errs, fmt.Sprintf("restore from %s: %v", source, err))
			continue
		}
		fig.Files, fig.Bytes = res.Files, res.Bytes
		verr := verifyStore(ctx, dir, r.w.Options().MemTableSize, exp)
		if verr != nil {
			errs = append(errs, fmt.Sprintf("restore from %s did not verify: %v", source, verr))
		}
		switch source {
		case "local":
			fig.LocalMS, fig.BytesLocal, fig.LocalVerified = ms(d), res.BytesLocal, verr == nil
		case "local-identity":
			fig.LocalIdentityMS = ms(d)
			fig.LocalVerified = fig.LocalVerified && verr == nil
		default:
			fig.RemoteMS, fig.BytesRemote, fig.RemoteVerified = ms(d), res.BytesRemote, verr == nil
		}
		os.RemoveAll(dir)
		r.logf("restore from %s: %s in %.1f ms (local %s, remote %s), verified %v", source, human.Bytes(res.Bytes), ms(d), human.Bytes(res.BytesLocal), human.Bytes(res.BytesRemote), verr == nil)
	}
	if fig.LocalMS > 0 {
		fig.Speedup = round(fig.RemoteMS/fig.LocalMS, 4)
	}
	if fig.LocalIdentityMS > 0 {
		fig.SpeedupIdentity = round(fig.RemoteMS/fig.LocalIdentityMS, 4)
	}
	fig.SHA256BytesPerS = sha256Rate()
	if fig.SHA256BytesPerS > 0 && fig.RemoteMS > 0 {
		floor := float64(fig.Bytes) / fig.SHA256BytesPerS * 1000 // ms
		fig.SpeedupBound = round(fig.RemoteMS/floor, 4)
	}
	fig.BLAKE3BytesPerS = hashRate(manifests.BLAKE3)
	if fig.BLAKE3BytesPerS > 0 && fig.RemoteMS > 0 {
		floor := float64(fig.Bytes) / fig.BLAKE3BytesPerS * 1000 // ms
		fig.SpeedupBoundBLAKE3 = round(fig.RemoteMS/floor, 4)
	}
	if len(errs) > 0 {
		fig.Error = strings.Join(errs, "; ")
		return errors.New(fig.Error)
	}
	return nil
}

// verifyStore opens a restored store and checks every key against exp.
func verifyStore(ctx context.Context, dir string, memTable uint64, exp *workload.Expected) error {
	db, err := pebble.Open(dir, workload.PebbleOptions(memTable))
	if err != nil {
		return fmt.Errorf("open restored store: %w", err)
	}
	verr := workload.Verify(ctx, db, exp)
	if err := db.Close(); err != nil && verr == nil {
		verr = err
	}
	return verr
}

// sha256Rate is hashRate of SHA-256.
func sha256Rate() float64 { return hashRate(manifests.SHA256) }

// hashRate measures alg on every core at once, in bytes/s: the speed
// limit of a restore that hashes every byte it restores.
func hashRate(alg manifests.Alg) float64 {
	workers := runtime.GOMAXPROCS(0)
	const chunk, rounds = 1 << 20, 128
	buf := make([]byte, chunk)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := manifests.NewHasher(alg)
			for range rounds {
				h.Write(buf)
			}
			h.Sum(nil)
		}()
	}
	wg.Wait()
	return round(float64(workers*chunk*rounds)/time.Since(t0).Seconds(), 4)
}
