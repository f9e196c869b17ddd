package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/restore"
)

// Shapes compares ckpt with `rclone copy` on two fixed shapes of random
// files (few large ones and many small ones), upload and remote restore,
// side by side in one run on the same server, Reps times each; and times a
// checkpoint that adds one file to the large shape, end to end.
type Shapes struct {
	Reps   int     `json:"reps"`
	Shapes []Shape `json:"shapes"`
	// Increment is the large shape plus one new file, checkpointed after
	// the large shape's checkpoint, request to completed.
	Increment *ShapeIncrement `json:"increment,omitempty"`
	// Rclone is why rclone was not measured ("" when it was).
	Rclone string `json:"rclone_missing,omitempty"`
}

// Shape is one shape's figures: every repetition's time in ms, their
// minimum and median, and ckpt's throughput over rclone's (by medians).
type Shape struct {
	Name      string `json:"name"`
	Files     int    `json:"files"`
	FileBytes int64  `json:"file_bytes"`
	Bytes     int64  `json:"bytes"`

	CkptUploadMS    []float64 `json:"ckpt_upload_ms"`
	CkptRestoreMS   []float64 `json:"ckpt_restore_ms"`
	RcloneUploadMS  []float64 `json:"rclone_upload_ms"`
	RcloneRestoreMS []float64 `json:"rclone_restore_ms"`

	CkptUpload    MinMedian `json:"ckpt_upload"`
	CkptRestore   MinMedian `json:"ckpt_restore"`
	RcloneUpload  MinMedian `json:"rclone_upload"`
	RcloneRestore MinMedian `json:"rclone_restore"`

	// UploadVsRclone and RestoreVsRclone are rclone's median time over
	// ckpt's: ckpt's throughput as a multiple of rclone's.
	UploadVsRclone  float64 `json:"upload_vs_rclone"`
	RestoreVsRclone float64 `json:"restore_vs_rclone"`
	// Verified: every restore of either tool gave the source's bytes.
	Verified bool `json:"verified"`
}

// MinMedian summarises repetitions, in ms and bytes per second.
type MinMedian struct {
	MinMS           float64 `json:"min_ms"`
	MedianMS        float64 `json:"median_ms"`
	MedianBytesPerS float64 `json:"median_bytes_per_s"`
}

// ShapeIncrement is a checkpoint adding AddedBytes (one file) to a
// StateBytes checkpoint of the large shape, request to completed, once
// per repetition; rclone copies the same new file on top of its copy.
type ShapeIncrement struct {
	StateBytes int64     `json:"state_bytes"`
	AddedBytes int64     `json:"added_bytes"`
	CkptMS     []float64 `json:"ckpt_ms"`
	PauseMS    []float64 `json:"pause_ms"`
	RcloneMS   []float64 `json:"rclone_ms"`
	Ckpt       MinMedian `json:"ckpt"`
	Rclone     MinMedian `json:"rclone"`
	// The controls, once per round after ckpt's increment: one Put of the
	// new file's bytes to the same server under another key (no hashing,
	// nothing else), and SHA-256 of the file from the page cache. A
	// content-addressed upload needs the hash before the Put can name
	// its key, so their sum is the floor of this checkpoint on this server.
	ControlPutMS    []float64 `json:"control_put_ms"`
	ControlSHA256MS []float64 `json:"control_sha256_ms"`
	ControlPut      MinMedian `json:"control_put"`
	ControlSHA256   MinMedian `json:"control_sha256"`
}

func minMedian(xs []float64, bytes int64) MinMedian {
	if len(xs) == 0 {
		return MinMedian{}
	}
	m := MinMedian{MinMS: percentile(xs, 0), MedianMS: percentile(xs, 50)}
	if m.MedianMS > 0 {
		m.MedianBytesPerS = round(float64(bytes)/(m.MedianMS/1000), 5)
	}
	return m
}

// shapeSpec is a shape to build: files of size bytes each.
type shapeSpec struct {
	name  string
	files int
	size  int64
}

// shapeSpecs are the shapes of the section (scaled down with Quick), and
// the size of the increment's one new file.
func (r *run) shapeSpecs() ([]shapeSpec, int64) {
	if r.o.Quick {
		return []shapeSpec{{"4 x 8 MiB", 4, 8 << 20}, {"100 x 64 KiB", 100, 64 << 10}}, 2 << 20
	}
	return []shapeSpec{{"16 x 64 MiB", 16, 64 << 20}, {"1,000 x 1 MiB", 1000, 1 << 20}}, 16 << 20
}

// writeRandomFiles fills dir with n files of size random bytes named
// 000001.sst and on, starting at first.
func writeRandomFiles(dir string, first, n int, size int64, seed uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 's', 'h', 'a', 'p', 'e'})
	buf := make([]byte, min(size, 4<<20))
	for i := first; i < first+n; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%06d.sst", i)))
		if err != nil {
			return err
		}
		for left := size; left > 0; {
			k := min(left, int64(len(buf)))
			rng.Read(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				f.Close()
				return err
			}
			left -= k
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// sendGeneric checkpoints dir (named by the generic engine: *.sst shared)
// as checkpoint n of tsk and waits for completed.
func sendGeneric(ctx context.Context, p *inproc, tsk string, n uint64, dir string, handoff bool) (sent, error) {
	t0 := time.Now()
	pend, err := p.client.Send(ctx, client.Request{Task: tsk, Checkpoint: n, Dir: dir, Handoff: handoff})
	if err != nil {
		return sent{}, fmt.Errorf("checkpoint %d: %w", n, err)
	}
	s := sent{pause: time.Since(t0), synced: pend.Synced}
	if s.ev, err = pend.Wait(ctx); err != nil {
		return s, fmt.Errorf("checkpoint %d: %w", n, err)
	}
	s.total = time.Since(t0)
	return s, nil
}

// shapes runs the section: for each shape, Reps rounds of ckpt upload,
// ckpt restore, rclone upload, rclone restore, each restore checked
// against the source; in each round of the first shape, one more file
// checkpointed end to end by ckpt and copied by rclone.
func (r *run) shapes(ctx context.Context) error {
	specs, added := r.shapeSpecs()
	reps := 3
	if r.o.Quick {
		reps = 1
	}
	sh := &Shapes{Reps: reps}
	r.rep.Shapes = sh
	var rcEnv []string
	if why, miss := missing("rclone"); miss {
		sh.Rclone = why
	} else {
		cfg := filepath.Join(r.root, "rclone.conf")
		os.WriteFile(cfg, nil, 0o600)
		rcEnv = peerEnv("RCLONE_CONFIG=" + cfg)
	}
	for si, sp := range specs {
		src := filepath.Join(r.root, "shape-src")
		os.RemoveAll(src)
		r.logf("shapes: writing %s of random files", sp.name)
		if err := writeRandomFiles(src, 1, sp.files, sp.size, uint64(si+1)); err != nil {
			return err
		}
		s := Shape{Name: sp.name, Files: sp.files, FileBytes: sp.size, Bytes: int64(sp.files) * sp.size, Verified: true}
		srcSum, err := dirDigest(src)
		if err != nil {
			return err
		}
		var inc *ShapeIncrement
		if si == 0 {
			inc = &ShapeIncrement{StateBytes: s.Bytes, AddedBytes: added}
		}
		for i := range reps {
			// A fresh agent (job, local dir) per round: its first upload
			// hashes every file, as a first checkpoint does.
			a, err := r.startAgent(ctx, fmt.Sprintf("shape%d-r%d", si, i))
			if err != nil {
				return err
			}
			err = r.shapeRound(ctx, a, rcEnv, sh.Rclone == "", src, srcSum, si, i, &s, inc)
			a.stop()
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", sp.name, i+1, err)
			}
		}
		s.CkptUpload, s.CkptRestore = minMedian(s.CkptUploadMS, s.Bytes), minMedian(s.CkptRestoreMS, s.Bytes)
		s.RcloneUpload, s.RcloneRestore = minMedian(s.RcloneUploadMS, s.Bytes), minMedian(s.RcloneRestoreMS, s.Bytes)
		if s.CkptUpload.MedianMS > 0 && s.RcloneUpload.MedianMS > 0 {
			s.UploadVsRclone = round(s.RcloneUpload.MedianMS/s.CkptUpload.MedianMS, 4)
		}
		if s.CkptRestore.MedianMS > 0 && s.RcloneRestore.MedianMS > 0 {
			s.RestoreVsRclone = round(s.RcloneRestore.MedianMS/s.CkptRestore.MedianMS, 4)
		}
		r.logf("shapes: %s: upload ckpt %.0f ms, rclone %.0f ms (%.2fx); restore ckpt %.0f ms, rclone %.0f ms (%.2fx); medians of %d",
			sp.name, s.CkptUpload.MedianMS, s.RcloneUpload.MedianMS, s.UploadVsRclone, s.CkptRestore.MedianMS, s.RcloneRestore.MedianMS, s.RestoreVsRclone, reps)
		sh.Shapes = append(sh.Shapes, s)
		if inc != nil {
			inc.Ckpt, inc.Rclone = minMedian(inc.CkptMS, added), minMedian(inc.RcloneMS, added)
			inc.ControlPut, inc.ControlSHA256 = minMedian(inc.ControlPutMS, added), minMedian(inc.ControlSHA256MS, added)
			sh.Increment = inc
			r.logf("shapes: +%s on %s: ckpt %.0f ms, rclone %.0f ms (medians)", human.Bytes(added), human.Bytes(s.Bytes), inc.Ckpt.MedianMS, inc.Rclone.MedianMS)
		}
		os.RemoveAll(src)
	}
	return nil
}

// shapeRound is one repetition of one shape: ckpt up and down, rclone up
// and down, and with inc the increment by both.
func (r *run) shapeRound(ctx context.Context, a *inproc, rcEnv []string, rclone bool, src, srcSum string, si, i int, s *Shape, inc *ShapeIncrement) error {
	tsk := fmt.Sprintf("shape%d-r%d", si, i)
	// ckpt: a new task's first checkpoint uploads every file (the agent
	// links the files: the source stays for the others).
	up, err := sendGeneric(ctx, a, tsk, 1, src, false)
	if err != nil {
		return fmt.Errorf("ckpt upload: %w", err)
	}
	down := filepath.Join(r.root, "shape-down-ckpt")
	os.RemoveAll(down)
	t0 := time.Now()
	_, err = restore.Run(ctx, restore.Options{Store: a.store, Job: a.job, Task: tsk, Target: down, Checkpoint: 1})
	d := time.Since(t0)
	if err != nil {
		return fmt.Errorf("ckpt restore: %w", err)
	}
	s.CkptUploadMS, s.CkptRestoreMS = append(s.CkptUploadMS, ms(up.total)), append(s.CkptRestoreMS, ms(d))
	var t Tool
	if !sameDigest(down, srcSum, &t) {
		s.Verified = false
	}
	os.RemoveAll(down)

	var remote string
	if rclone {
		if remote, err = r.tgt.rcloneRemote(fmt.Sprintf("bench-%s-peers/shape%d-r%d", r.id, si, i)); err != nil {
			return err
		}
		down = filepath.Join(r.root, "shape-down-rclone")
		os.RemoveAll(down)
		du, err := tool(ctx, rcEnv, "rclone", "copy", src, remote)
		if err != nil {
			return err
		}
		dd, err := tool(ctx, rcEnv, "rclone", "copy", remote, down)
		if err != nil {
			return err
		}
		s.RcloneUploadMS, s.RcloneRestoreMS = append(s.RcloneUploadMS, ms(du)), append(s.RcloneRestoreMS, ms(dd))
		if !sameDigest(down, srcSum, &t) {
			s.Verified = false
		}
		os.RemoveAll(down)
	}

	if inc != nil {
		// The app's next checkpoint: the same files (hard links, as an
		// engine's checkpoint makes) and one new one, handed off.
		next := filepath.Join(r.root, "shape-next")
		os.RemoveAll(next)
		if err := linkClone(src, next); err != nil {
			return err
		}
		if err := writeRandomFiles(next, s.Files+1, 1, inc.AddedBytes, uint64(100+i)); err != nil {
			return err
		}
		// rclone gets the same new file in its own copy of the source.
		one := filepath.Join(r.root, "shape-added")
		os.RemoveAll(one)
		if err := os.MkdirAll(one, 0o755); err != nil {
			return err
		}
		newName := fmt.Sprintf("%06d.sst", s.Files+1)
		if err := os.Link(filepath.Join(next, newName), filepath.Join(one, newName)); err != nil {
			return err
		}
		e, err := sendGeneric(ctx, a, tsk, 2, next, true)
		if err != nil {
			return fmt.Errorf("ckpt increment: %w", err)
		}
		if e.ev.FilesUploaded != 1 || e.ev.CheckpointSize < inc.AddedBytes || e.ev.CheckpointSize > inc.AddedBytes+1<<20 {
			// The new file and the manifest, nothing else.
			return fmt.Errorf("ckpt increment shipped %d files, %d bytes, want the new file's %d and the manifest", e.ev.FilesUploaded, e.ev.CheckpointSize, inc.AddedBytes)
		}
		inc.CkptMS, inc.PauseMS = append(inc.CkptMS, ms(e.total)), append(inc.PauseMS, ms(e.pause))
		put, hash, err := incrementControls(ctx, a, filepath.Join(one, newName), fmt.Sprintf("bench-%s-control/put-%d-%d", r.id, si, i))
		if err != nil {
			return err
		}
		inc.ControlPutMS, inc.ControlSHA256MS = append(inc.ControlPutMS, ms(put)), append(inc.ControlSHA256MS, ms(hash))
		if rclone {
			// rclone copy of the source plus the new file: it lists both
			// sides and sends the one file that is new.
			for _, f := range []string{newName} {
				if err := os.Link(filepath.Join(one, f), filepath.Join(src, f)); err != nil {
					return err
				}
			}
			dr, err := tool(ctx, rcEnv, "rclone", "copy", src, remote)
			os.Remove(filepath.Join(src, newName))
			if err != nil {
				return err
			}
			inc.RcloneMS = append(inc.RcloneMS, ms(dr))
		}
		os.RemoveAll(one)
		os.RemoveAll(next)
	}
	if rclone {
		// Not timed: the next round uploads to a fresh path.
		tool(ctx, rcEnv, "rclone", "purge", remote)
	}
	return nil
}

// incrementControls times one Put of the file at path to key through the
// agent's store, and SHA-256 of the file.
func incrementControls(ctx context.Context, a *inproc, path, key string) (put, hash time.Duration, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if _, _, err := fsutil.HashReader(ctx, f); err != nil {
		return 0, 0, err
	}
	hash = time.Since(t0)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, 0, err
	}
	t0 = time.Now()
	if err := a.store.Put(ctx, key, f, fi.Size()); err != nil {
		return 0, 0, fmt.Errorf("control put: %w", err)
	}
	return time.Since(t0), hash, nil
}

// printShapes writes the shapes section of the human report.
func (r *Report) printShapes(w io.Writer) {
	sh := r.Shapes
	if sh == nil {
		return
	}
	fmt.Fprintf(w, "\nShapes of random files, ckpt against rclone copy on the same server (min / median of %d rounds):\n", sh.Reps)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHAPE\tCKPT UP\tRCLONE UP\tRATIO\tCKPT RESTORE\tRCLONE RESTORE\tRATIO\tVERIFIED")
	mm := func(m MinMedian) string { return fmt.Sprintf("%.0f / %.0f ms", m.MinMS, m.MedianMS) }
	for _, s := range sh.Shapes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2fx\t%s\t%s\t%.2fx\t%v\n", s.Name, mm(s.CkptUpload), mm(s.RcloneUpload), s.UploadVsRclone,
			mm(s.CkptRestore), mm(s.RcloneRestore), s.RestoreVsRclone, s.Verified)
	}
	tw.Flush()
	if inc := sh.Increment; inc != nil {
		fmt.Fprintf(w, "Adding %s to %s: ckpt %s end to end (pause %v ms), rclone copy %s; controls: one Put of the file %s, SHA-256 of it %s\n",
			human.Bytes(inc.AddedBytes), human.Bytes(inc.StateBytes), mm(inc.Ckpt), inc.PauseMS, mm(inc.Rclone), mm(inc.ControlPut), mm(inc.ControlSHA256))
	}
	if sh.Rclone != "" {
		fmt.Fprintf(w, "rclone: %s\n", sh.Rclone)
	}
}
