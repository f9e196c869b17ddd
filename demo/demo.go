// Package demo runs the whole ckpt loop in one process on the embedded
// default: a Pebble store under a changing keyed-state workload, the agent
// on a Unix socket, file:// storage, a series of incremental checkpoints, a
// crash, a restore from the task-local copy and one from storage alone,
// each verified key by key against the state the workload wrote up to the
// restored checkpoint. `ckpt demo` prints its Report.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	_ "github.com/ckpt-io/ckpt/engines/pebble" // the pebble engine the demo checkpoints
	"github.com/ckpt-io/ckpt/lab/workload"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	_ "github.com/ckpt-io/ckpt/storage/file" // the file:// backend
)

// Options configures a demo run. Zero values take the documented defaults.
type Options struct {
	// Dir holds everything the demo makes (store, socket, local dir,
	// storage) and is kept afterwards; it must be absent or empty. "" uses
	// a temporary directory removed at the end.
	Dir string
	// JSON prints the Report as one JSON value instead of tables.
	JSON bool
	// Out receives the output (default os.Stdout).
	Out io.Writer
	// Checkpoints is how many checkpoints to take (default 10; fewer than 8
	// is raised to 8, so that the sawtooth of compactions has room to show).
	Checkpoints int
	// StateBytes is the size of the keyed state (default 48 MiB).
	StateBytes int64
	// Seed makes the workload reproducible (default 1).
	Seed uint64
}

// Report is what a demo run measured; its JSON is `ckpt demo --json`.
type Report struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
	Restores    []Restore    `json:"restores"`
	// Keys and StateBytes describe the workload's state at the last checkpoint.
	Keys       int   `json:"keys"`
	StateBytes int64 `json:"state_bytes"`
	// WritesPerSecond is the workload's write rate while it was writing.
	WritesPerSecond float64 `json:"writes_per_s"`
	DurationMS      int64   `json:"duration_ms"`
}

// Checkpoint is one completed checkpoint.
type Checkpoint struct {
	Checkpoint uint64 `json:"checkpoint"`
	// CheckpointSize is what this checkpoint uploaded (Flink's
	// lastCheckpointSize); FullSize is what it references, what a restore
	// fetches (lastCheckpointFullSize).
	CheckpointSize int64 `json:"checkpoint_size"`
	FullSize       int64 `json:"full_size"`
	FilesUploaded  int   `json:"files_uploaded"`
	FilesReused    int   `json:"files_reused"`
	// SyncMS is the agent's sync phase; PauseMS is all the app waited:
	// a memtable flush, Pebble's checkpoint and the sync phase.
	SyncMS     int64 `json:"sync_ms"`
	PauseMS    int64 `json:"pause_ms"`
	DurationMS int64 `json:"duration_ms"`
	// Writes is the workload's writes since the previous checkpoint, and
	// CompactedBytes the bytes Pebble's compactions rewrote meanwhile.
	Writes         int    `json:"writes"`
	CompactedBytes uint64 `json:"compacted_bytes"`
}

// Restore is one restore after the crash, verified against the state the
// workload had written when the restored checkpoint was taken.
type Restore struct {
	Source      string `json:"source"` // "local" or "remote"
	Checkpoint  uint64 `json:"checkpoint"`
	Files       int    `json:"files"`
	Bytes       int64  `json:"bytes"`
	BytesLocal  int64  `json:"bytes_local"`
	BytesRemote int64  `json:"bytes_remote"`
	DurationMS  int64  `json:"duration_ms"`
	Keys        int    `json:"keys"`
	VerifyMS    int64  `json:"verify_ms"`
	Verified    bool   `json:"verified"`
	// Error says why verification failed; empty when it passed.
	Error string `json:"error,omitempty"`
}

const (
	job  = "demo"
	task = "demo-0"
)

// Run runs the demo and prints its report to o.Out. A restore that does
// not verify makes it print the report and return it with an error; any
// other failed step returns only the error. Everything it started (agent,
// client, store) is stopped before it returns, and a temporary dir removed.
func Run(ctx context.Context, o Options) (*Report, error) {
	start := time.Now()
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Checkpoints == 0 {
		o.Checkpoints = 10
	}
	o.Checkpoints = max(o.Checkpoints, 8)
	if o.StateBytes == 0 {
		o.StateBytes = 48 << 20
	}

	root, cleanup, err := prepare(o.Dir)
	if err != nil {
		return nil, err
	}
	defer cleanup()

	env, err := startAgent(ctx, root)
	if err != nil {
		return nil, err
	}
	defer env.stop()

	rep, exps, w, err := checkpoints(ctx, env, o)
	if err != nil {
		if w != nil {
			w.Close()
		}
		return nil, err
	}
	last := rep.Checkpoints[len(rep.Checkpoints)-1].Checkpoint
	exp := exps[last]
	rep.Keys, rep.StateBytes = exp.Keys(), exp.Bytes()
	rep.WritesPerSecond = w.Stats().WritesPerSecond()

	// Writes after the last checkpoint: the crash loses them, and the
	// verification below proves the restore does not pretend otherwise.
	lost, err := w.Round(ctx)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("workload round after the last checkpoint: %w", err)
	}
	memTable := w.Options().MemTableSize
	if err := crash(w); err != nil {
		return nil, err
	}

	for _, source := range []string{"local", "remote"} {
		r, err := restoreAndVerify(ctx, env, source, last, exp, memTable)
		if err != nil {
			return nil, err
		}
		rep.Restores = append(rep.Restores, r)
		if source == "local" {
			if err := os.RemoveAll(env.storeDir); err != nil { // crash again
				return nil, fmt.Errorf("delete restored store: %w", err)
			}
		}
	}
	if err := env.stop(); err != nil {
		return nil, err
	}
	rep.DurationMS = time.Since(start).Milliseconds()

	if o.JSON {
		enc := json.NewEncoder(o.Out)
		if err := enc.Encode(rep); err != nil {
			return nil, fmt.Errorf("write report: %w", err)
		}
	} else if err := rep.print(o.Out, root, o.Dir != "", lost.Writes()); err != nil {
		return nil, fmt.Errorf("write report: %w", err)
	}
	for _, r := range rep.Restores {
		if !r.Verified {
			return rep, fmt.Errorf("restore from %s did not verify: %s", r.Source, r.Error)
		}
	}
	return rep, nil
}

// prepare makes the demo's root directory and returns how to clean it up.
func prepare(dir string) (string, func(), error) {
	if dir == "" {
		root, err := os.MkdirTemp("", "ckpt-demo-")
		if err != nil {
			return "", nil, fmt.Errorf("demo dir: %w", err)
		}
		return root, func() { os.RemoveAll(root) }, nil
	}
	root, err := filepath.Abs(dir)
	if err != nil {
		return "", nil, fmt.Errorf("demo dir: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", nil, fmt.Errorf("demo dir: %w", err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return "", nil, fmt.Errorf("demo dir: %w", err)
	}
	if len(entries) > 0 {
		return "", nil, fmt.Errorf("demo dir %s is not empty: pass a new or empty directory to --dir", root)
	}
	return root, func() {}, nil
}

// env is the running agent and everything around it.
type env struct {
	store    storage.Store
	storeDir string
	localDir string
	client   *client.Client

	cancel  context.CancelFunc
	done    chan error // Run's result
	sockDir string     // a short temporary dir for the socket, or ""
	stopped bool
	stopErr error
}

// startAgent lays out root (store/, local/, storage/, agent.sock), starts
// an agent in a goroutine, waits until it serves and connects to it.
func startAgent(ctx context.Context, root string) (*env, error) {
	e := &env{storeDir: filepath.Join(root, "store"), localDir: filepath.Join(root, "local")}
	storageDir := filepath.Join(root, "storage")
	socket := filepath.Join(root, "agent.sock")
	if len(socket) > 100 { // beyond what sun_path holds on every platform
		d, err := os.MkdirTemp("", "ckpt-demo-sock-")
		if err != nil {
			return nil, fmt.Errorf("socket dir: %w", err)
		}
		e.sockDir, socket = d, filepath.Join(d, "agent.sock")
	}
	for _, d := range []string{e.localDir, storageDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			e.removeSockDir()
			return nil, fmt.Errorf("demo dir: %w", err)
		}
	}
	st, err := storage.Open(ctx, "file://"+storageDir)
	if err != nil {
		e.removeSockDir()
		return nil, err
	}
	e.store = st
	a, err := agent.New(agent.Config{
		Socket: socket, Store: st, Job: job, LocalDir: e.localDir,
		// Pebble checkpoints land next to the store, inside root.
		AllowRoots: []string{root},
		Retain:     2,
		// A cancelled demo should not wait long for an upload in flight.
		ShutdownGrace: 2 * time.Second,
		Version:       "demo",
	})
	if err != nil {
		e.removeSockDir()
		return nil, fmt.Errorf("start agent: %w", err)
	}
	// The agent stops when the demo says so, not when ctx ends: the demo's
	// own steps then see ctx's error first and report it as such.
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancel, e.done = cancel, make(chan error, 1)
	go func() { e.done <- a.Run(actx) }()
	select {
	case <-a.Ready():
	case err := <-e.done:
		e.done <- err
		e.stop()
		return nil, fmt.Errorf("start agent: %w", err)
	case <-ctx.Done():
		e.stop()
		return nil, ctx.Err()
	}
	if e.client, err = client.Dial(ctx, socket); err != nil {
		e.stop()
		return nil, err
	}
	return e, nil
}

// stop closes the client, stops the agent and waits for Run to return.
// It is idempotent.
func (e *env) stop() error {
	if e.stopped {
		return e.stopErr
	}
	e.stopped = true
	if e.client != nil {
		e.client.Close()
	}
	e.cancel()
	if err := <-e.done; err != nil {
		e.stopErr = fmt.Errorf("agent: %w", err)
	}
	e.removeSockDir()
	return e.stopErr
}

func (e *env) removeSockDir() {
	if e.sockDir != "" {
		os.RemoveAll(e.sockDir)
	}
}

// checkpoints runs the workload and takes o.Checkpoints checkpoints, one
// after each round, returning the expected state at each. It returns the
// open workload, which the caller closes.
func checkpoints(ctx context.Context, e *env, o Options) (*Report, map[uint64]*workload.Expected, *workload.Workload, error) {
	w, err := workload.Open(e.storeDir, workload.Options{Seed: o.Seed, StateBytes: o.StateBytes})
	if err != nil {
		return nil, nil, nil, err
	}
	rep := &Report{Checkpoints: []Checkpoint{}, Restores: []Restore{}}
	exps := map[uint64]*workload.Expected{}
	prevCompacted := w.LSM().CompactedBytes
	for i := 1; i <= o.Checkpoints; i++ {
		n := uint64(i)
		rs, err := w.Round(ctx)
		if err != nil {
			return nil, nil, w, fmt.Errorf("workload round %d: %w", i, err)
		}
		exps[n] = w.Snapshot()
		t0 := time.Now()
		// The helper flushes the memtable first (see package
		// client/pebble): the app's pause includes the flush.
		p, err := ckptpebble.Checkpoint(ctx, e.client, w.DB(), e.storeDir, task, n)
		if err != nil {
			return nil, nil, w, fmt.Errorf("checkpoint %d: %w", n, err)
		}
		pause := time.Since(t0)
		compacted := w.LSM().CompactedBytes
		ev, err := p.Wait(ctx)
		if err != nil {
			return nil, nil, w, fmt.Errorf("checkpoint %d: %w", n, err)
		}
		rep.Checkpoints = append(rep.Checkpoints, Checkpoint{
			Checkpoint: n, CheckpointSize: ev.CheckpointSize, FullSize: ev.FullSize,
			FilesUploaded: ev.FilesUploaded, FilesReused: ev.FilesReused,
			SyncMS: p.Synced.SyncMS, PauseMS: pause.Milliseconds(), DurationMS: ev.DurationMS,
			Writes: rs.Writes(), CompactedBytes: compacted - prevCompacted,
		})
		prevCompacted = compacted
	}
	return rep, exps, w, nil
}

// crash closes the store and deletes its directory, as a lost node would.
func crash(w *workload.Workload) error {
	if err := w.Close(); err != nil {
		return err
	}
	if err := os.RemoveAll(w.Dir()); err != nil {
		return fmt.Errorf("delete store: %w", err)
	}
	return nil
}

// restoreAndVerify restores checkpoint n into the (absent) store dir, from
// the local copy and storage ("local") or from storage alone ("remote"),
// then opens it with Pebble and checks every key against exp.
func restoreAndVerify(ctx context.Context, e *env, source string, n uint64, exp *workload.Expected, memTable uint64) (Restore, error) {
	opts := restore.Options{Store: e.store, Job: job, Task: task, Target: e.storeDir, Checkpoint: n}
	if source == "local" {
		opts.LocalDir = e.localDir
	}
	res, err := restore.Run(ctx, opts)
	if err != nil {
		return Restore{}, fmt.Errorf("restore checkpoint %d from %s: %w", n, source, err)
	}
	if !res.Restored {
		return Restore{}, fmt.Errorf("restore checkpoint %d from %s: nothing restored: %s", n, source, res.Reason)
	}
	r := Restore{
		Source: source, Checkpoint: res.Checkpoint, Files: res.Files, Bytes: res.Bytes,
		BytesLocal: res.BytesLocal, BytesRemote: res.BytesRemote, DurationMS: res.DurationMS,
		Keys: exp.Keys(),
	}
	t0 := time.Now()
	db, err := pebble.Open(e.storeDir, workload.PebbleOptions(memTable))
	if err != nil {
		return r, fmt.Errorf("open store restored from %s: %w", source, err)
	}
	verr := workload.Verify(ctx, db, exp)
	if err := db.Close(); err != nil && verr == nil {
		verr = fmt.Errorf("close restored store: %w", err)
	}
	r.VerifyMS = time.Since(t0).Milliseconds()
	var ve *workload.VerifyError
	switch {
	case verr == nil:
		r.Verified = true
	case errors.As(verr, &ve):
		r.Error = verr.Error()
	default:
		return r, fmt.Errorf("verify store restored from %s: %w", source, verr)
	}
	return r, nil
}

// spikes marks the checkpoints whose size is more than twice the median of
// the incremental ones (all but the first): compaction rewrote old data
// into new files, which the checkpoint had to upload.
func (r *Report) spikes() map[uint64]bool {
	var sizes []int64
	for _, c := range r.Checkpoints[1:] {
		sizes = append(sizes, c.CheckpointSize)
	}
	slices.Sort(sizes)
	median := sizes[len(sizes)/2]
	if len(sizes)%2 == 0 {
		median = (sizes[len(sizes)/2-1] + sizes[len(sizes)/2]) / 2
	}
	out := map[uint64]bool{}
	for _, c := range r.Checkpoints[1:] {
		if c.CheckpointSize > 2*median {
			out[c.Checkpoint] = true
		}
	}
	return out
}
