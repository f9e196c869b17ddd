package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/manifests"
)

// Scale is the cost-growth section: how a checkpoint's cost grows with the
// files of the state (Incremental), and how GC, `ckpt list` and `ckpt
// verify` grow with the objects of a job (Objects).
type Scale struct {
	// FileBytes is the size of every file of the incremental states;
	// NewFiles the files each incremental checkpoint adds.
	FileBytes   int64              `json:"file_bytes"`
	NewFiles    int                `json:"new_files"`
	Incremental []ScaleIncremental `json:"incremental"`
	Objects     []ScaleObjects     `json:"objects"`
	// ObjectsReason says why Objects is empty, when it is.
	ObjectsReason string `json:"objects_reason,omitempty"`
}

// ScaleIncremental is one state size of the incremental curve: a separate
// `ckpt agent` process (at nice 10, as a sidecar) uploads a state of Files
// files once, then Samples checkpoints that each add NewFiles files to it,
// handed off as client/pebble hands off a Pebble checkpoint.
type ScaleIncremental struct {
	Files   int `json:"files"`
	Samples int `json:"samples"`
	// FullUploadMS is the first checkpoint (every file uploaded).
	FullUploadMS float64 `json:"full_upload_ms"`
	// E2EMS is the median of request sent to completed read; PauseMS the
	// median (and PauseMaxMS the largest) of request sent to synced read.
	E2EMS      float64   `json:"e2e_ms"`
	PauseMS    float64   `json:"pause_ms"`
	PauseMaxMS float64   `json:"pause_max_ms"`
	RawE2EMS   []float64 `json:"raw_e2e_ms"`
	// ControlMS is the median end-to-end time of a checkpoint of the
	// NewFiles new files alone (a task of its own on the same agent): the
	// transfer of the new bytes and a checkpoint's fixed costs.
	ControlMS float64 `json:"control_ms"`
	// UnchangedFileUS is (E2EMS - ControlMS) / Files: what each unchanged
	// file adds to a checkpoint, in microseconds.
	UnchangedFileUS float64 `json:"unchanged_file_us"`
	// CPUMS is the median CPU time (user and system) the agent spent on
	// a checkpoint, from the request until the agent went idle after it
	// (its background work included); ControlCPUMS the same for the
	// control, and UnchangedFileCPUUS their difference over Files. On a
	// shared machine these move less than the times.
	CPUMS              float64 `json:"cpu_ms"`
	ControlCPUMS       float64 `json:"control_cpu_ms"`
	UnchangedFileCPUUS float64 `json:"unchanged_file_cpu_us"`
	// ManifestBytes is the last incremental checkpoint's manifest as
	// stored, and ManifestBytesPerFile that over its files.
	ManifestBytes        int64   `json:"manifest_bytes"`
	ManifestBytesPerFile float64 `json:"manifest_bytes_per_file"`
	// PeakRSSBytes is the agent's RSS high-water mark over the whole size
	// (the full upload included); IncrementalRSSBytes the highest RSS
	// sampled during the incremental checkpoints.
	PeakRSSBytes        int64 `json:"peak_rss_bytes"`
	IncrementalRSSBytes int64 `json:"incremental_rss_bytes"`
}

// scaleFileBytes is the size of each file of the incremental states.
const scaleFileBytes = 4096

// scaleNewFiles is the files each incremental checkpoint adds.
const scaleNewFiles = 10

// scale runs the cost-growth section.
func (r *run) scale(ctx context.Context) error {
	fig := &Scale{FileBytes: scaleFileBytes, NewFiles: scaleNewFiles, Incremental: []ScaleIncremental{}, Objects: []ScaleObjects{}}
	r.rep.Scale = fig
	for _, n := range r.o.ScaleFiles {
		inc, err := r.scaleIncremental(ctx, n)
		if err != nil {
			return fmt.Errorf("incremental at %d files: %w", n, err)
		}
		fig.Incremental = append(fig.Incremental, *inc)
		r.logf("scale: %d files: agent CPU %.0f ms per checkpoint (the new files alone %.0f ms: %.2f us per unchanged file)", inc.Files, inc.CPUMS, inc.ControlCPUMS, inc.UnchangedFileCPUUS)
		r.logf("scale: %d files: checkpoint adding %d files %.1f ms end to end (the new files alone %.1f ms: %.2f us per unchanged file), pause p50 %.2f ms, manifest %d B (%.0f B/file), agent peak RSS %.1f MiB (%.1f MiB during increments); full upload %.0f ms",
			inc.Files, scaleNewFiles, inc.E2EMS, inc.ControlMS, inc.UnchangedFileUS, inc.PauseMS, inc.ManifestBytes, inc.ManifestBytesPerFile,
			float64(inc.PeakRSSBytes)/(1<<20), float64(inc.IncrementalRSSBytes)/(1<<20), inc.FullUploadMS)
	}
	if len(r.o.ScaleObjects) == 0 {
		return nil
	}
	if r.tgt.kind != "s3" {
		fig.ObjectsReason = "GC, list and verify at scale are measured on S3 storage (the bench's versitygw or --storage s3://...)"
		return nil
	}
	for _, n := range r.o.ScaleObjects {
		obj, err := r.scaleObjects(ctx, n)
		if err != nil {
			return fmt.Errorf("job of %d objects: %w", n, err)
		}
		fig.Objects = append(fig.Objects, *obj)
	}
	return nil
}

// scaleIncremental measures one state size of the incremental curve.
func (r *run) scaleIncremental(ctx context.Context, files int) (*ScaleIncremental, error) {
	samples := 5
	if r.o.Quick {
		samples = 2
	}
	fig := &ScaleIncremental{Files: files, Samples: samples, RawE2EMS: []float64{}}
	base := filepath.Join(r.root, fmt.Sprintf("scale-%d", files))
	pool := filepath.Join(base, "pool")
	if err := os.MkdirAll(pool, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	rng := rand.NewChaCha8([32]byte{'s', byte(files), byte(files >> 8), byte(files >> 16)})
	buf := make([]byte, scaleFileBytes)
	var names []string
	addFile := func(dirs ...string) error {
		name := fmt.Sprintf("%07d.sst", len(names)+1)
		rng.Read(buf)
		for _, d := range dirs {
			if err := os.WriteFile(filepath.Join(d, name), buf, 0o644); err != nil {
				return err
			}
		}
		names = append(names, name)
		return nil
	}
	for i := range files {
		if i%1000 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err := addFile(pool); err != nil {
			return nil, err
		}
	}
	// snapshot makes a checkpoint dir as an engine does: hard links to the
	// state's files, plus the private files.
	seq := 0
	snapshot := func(state []string) (string, error) {
		seq++
		dir := filepath.Join(base, fmt.Sprintf("snap-%d", seq))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return "", err
		}
		for _, name := range state {
			if err := os.Link(filepath.Join(pool, name), filepath.Join(dir, name)); err != nil {
				return "", err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "MANIFEST-000001"), buf[:256], 0o644); err != nil {
			return "", err
		}
		return dir, os.WriteFile(filepath.Join(dir, "CURRENT"), []byte("MANIFEST-000001\n"), 0o644)
	}

	sc, err := r.sidecar(ctx, fmt.Sprintf("scale-%d", files), 10)
	if err != nil {
		return nil, err
	}
	defer sc.stop()
	send := func(task string, n uint64, dir string) (pause, e2e time.Duration, err error) {
		waitIdle(ctx, sc.pid)
		t0 := time.Now()
		p, err := sc.client.Send(ctx, client.Request{Task: task, Checkpoint: n, Dir: dir, Engine: "pebble", Handoff: true})
		if err != nil {
			return 0, 0, fmt.Errorf("checkpoint %d of %s: %w (agent log: %s)", n, task, err, sc.log())
		}
		pause = time.Since(t0)
		if _, err := p.Wait(ctx); err != nil {
			return 0, 0, fmt.Errorf("checkpoint %d of %s: %w (agent log: %s)", n, task, err, sc.log())
		}
		return pause, time.Since(t0), nil
	}

	task := fmt.Sprintf("scale-%d", files)
	dir, err := snapshot(names)
	if err != nil {
		return nil, err
	}
	_, d, err := send(task, 1, dir)
	if err != nil {
		return nil, err
	}
	fig.FullUploadMS = ms(d)

	var mu sync.Mutex
	var peak int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if v, err := procStatus(sc.pid, "VmRSS"); err == nil {
				mu.Lock()
				peak = max(peak, v)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			wg.Wait()
		}
	}()
	var pauses, controls, cpus, ctlCPUs []float64
	ctlTask := task + "-new-only"
	for k := 2; k <= samples+1; k++ {
		// The control first: a task of its own holding only the new files.
		first := len(names)
		for range scaleNewFiles {
			if err := addFile(pool); err != nil {
				return nil, err
			}
		}
		ctl, err := snapshot(names[first:])
		if err != nil {
			return nil, err
		}
		c0 := procCPU(sc.pid)
		_, d, err := send(ctlTask, uint64(k), ctl)
		if err != nil {
			return nil, err
		}
		controls = append(controls, ms(d))
		waitIdle(ctx, sc.pid)
		ctlCPUs = append(ctlCPUs, ms(procCPU(sc.pid)-c0))
		// The same new files added to the whole state.
		dir, err := snapshot(names)
		if err != nil {
			return nil, err
		}
		c0 = procCPU(sc.pid)
		p, d, err := send(task, uint64(k), dir)
		if err != nil {
			return nil, err
		}
		pauses = append(pauses, ms(p))
		fig.RawE2EMS = append(fig.RawE2EMS, ms(d))
		waitIdle(ctx, sc.pid)
		cpus = append(cpus, ms(procCPU(sc.pid)-c0))
	}
	close(stop)
	wg.Wait()
	fig.IncrementalRSSBytes = peak
	if fig.PeakRSSBytes, err = procStatus(sc.pid, "VmHWM"); err != nil {
		return nil, err
	}
	fig.E2EMS = percentile(fig.RawE2EMS, 50)
	fig.PauseMS, fig.PauseMaxMS = percentile(pauses, 50), percentile(pauses, 100)
	fig.ControlMS = percentile(controls, 50)
	fig.UnchangedFileUS = round((fig.E2EMS-fig.ControlMS)*1000/float64(files), 4)
	fig.CPUMS, fig.ControlCPUMS = percentile(cpus, 50), percentile(ctlCPUs, 50)
	fig.UnchangedFileCPUUS = round((fig.CPUMS-fig.ControlCPUMS)*1000/float64(files), 4)

	st, err := r.tgt.open(ctx)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	cat, err := manifests.Scan(ctx, st, r.jobName(fmt.Sprintf("scale-%d", files)), task)
	if err != nil {
		return nil, err
	}
	ref, err := cat.Find(task, uint64(samples+1))
	if err != nil {
		return nil, err
	}
	fig.ManifestBytes = ref.ManifestSize
	fig.ManifestBytesPerFile = round(float64(ref.ManifestSize)/float64(files+samples*scaleNewFiles+2), 4)
	return fig, nil
}

// waitIdle waits until process pid has used no CPU for 200 ms (its
// background work after a checkpoint is done), for at most a minute.
func waitIdle(ctx context.Context, pid int) {
	last, still := procCPU(pid), 0
	for deadline := time.Now().Add(time.Minute); still < 2 && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		now := procCPU(pid)
		if now == last {
			still++
		} else {
			still = 0
		}
		last = now
	}
}
