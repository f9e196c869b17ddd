// Package bench is the benchmark lab behind the ckpt-bench command: a harness that measures ckpt on a real
// Pebble store under a keyed-state workload against the baselines users
// would pick instead (full checkpoints, rclone, restic, RocksDB's
// BackupEngine through ldb) on the same data and the same storage, in one
// run, and checks each figure against its target.
//
// Without a storage URL it starts versitygw (an S3 server over a local
// directory) on 127.0.0.1, since the throughput targets are stated against
// an S3 server. Every figure is a ratio or a latency measured side by side
// in the same run, so a noisy shared machine moves both sides alike.
//
// What it runs, in order:
//
//  1. the workload loads StateBytes, then Checkpoints rounds at Churn, each
//     followed by one Pebble checkpoint sent to two in-process agents: an
//     incremental one and one that uploads everything (fullAgent: it finds
//     no earlier checkpoint to reuse objects of): write amplification and
//     the incremental/full ratios of bytes and duration;
//  2. the last checkpoint restored from the local copy and from storage
//     alone, each verified key by key;
//  3. the workload's write rate with a checkpoint every interval against
//     none (phases off, on, on, off);
//  4. one Pebble checkpoint of the store uploaded and restored by ckpt,
//     rclone and restic; a RocksDB store of the same keys and values backed
//     up and restored by ldb (to a local directory: ldb cannot reach S3);
//  5. 1.5% added to the state and checkpointed end to end by ckpt, then
//     copied by rclone and backed up by restic on top of step 4;
//  6. the app's pause (request sent to synced read) at 1,000 and 10,000
//     files in a snapshot;
//  7. a separate `ckpt agent` process uploading a large checkpoint
//     (StateBytes of production-sized files), its peak RSS sampled from
//     /proc/<pid>/status;
//  8. a job of 4 Pebble tasks owning contiguous key ranges of RescaleBytes,
//     rebuilt as 3 and as 6 tasks by rescale restores (rescale.go);
//  9. two shapes of random files (16 x 64 MiB, 1,000 x 1 MiB) uploaded and
//     restored by ckpt and rclone, three rounds each, and one 16 MiB file
//     added to the large shape end to end (shapes.go).
//  10. cost growth (scale.go): a checkpoint adding 10 files to states of
//     ScaleFiles files through a `ckpt agent` process, and `ckpt gc`,
//     `ckpt list` and `ckpt verify` against jobs of ScaleObjects objects.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/client"
	_ "github.com/ckpt-io/ckpt/engines/pebble" // the engine the app names
	"github.com/ckpt-io/ckpt/lab/workload"
	"github.com/ckpt-io/ckpt/storage"
	_ "github.com/ckpt-io/ckpt/storage/file" // file:// storage
	_ "github.com/ckpt-io/ckpt/storage/gs"   // gs:// storage
	"github.com/ckpt-io/ckpt/storage/retry"
)

// Options configures a run. Zero values take the documented defaults.
type Options struct {
	// Storage is the storage URL; "" starts versitygw on loopback.
	Storage string
	// StateBytes is the workload's live state (default 64 MiB; quick 8 MiB).
	// It also sizes the large checkpoint of the memory figure.
	StateBytes int64
	// Churn is the fraction of keys overwritten per round (default 0.01).
	Churn float64
	// Checkpoints is the number of incremental checkpoints (default 10; quick 3).
	Checkpoints int
	// AppInterval is the checkpoint interval of the app-throughput section
	// (default 1s; quick 100ms). Phases last at least five intervals.
	AppInterval time.Duration
	// Quick scales everything down to run in seconds (a smoke test).
	Quick bool
	// Only limits the run to these sections (default all): incremental,
	// restore, app, peers, e2e, pause, memory, rescale, scale.
	Only []string
	// CkptExe is the ckpt binary run as `ckpt agent` (the app, pause and
	// memory sections). Default: built from the ckpt repository around the
	// working directory or this binary, else the `ckpt` beside this binary,
	// else the one on PATH (FindCkpt).
	CkptExe string
	// LoadExe is the binary run as `LoadExe --hash-load RATE` and
	// `LoadExe --copy-load DIR` for the app section's controls (default
	// os.Executable(): ckpt-bench re-executes itself).
	LoadExe string
	// AgentMetricsAddr, when set, makes the agents of the memory and scale
	// sections serve /metrics and /debug/pprof/ there (to profile them).
	AgentMetricsAddr string
	// Dir is the scratch directory (default a temporary one, removed).
	Dir string
	// RescaleBytes is the keyed state of the rescale section (default
	// 1 GiB; quick 16 MiB).
	RescaleBytes int64
	// ScaleFiles are the state sizes, in files, of the scale section's
	// incremental curve (default 1,000, 10,000 and 100,000; quick 200 and
	// 1,000); ScaleObjects the job sizes, in objects, of its GC, list and
	// verify curve (default 10,000, 100,000 and 1,000,000; quick 2,000).
	ScaleFiles   []int
	ScaleObjects []int
	// ScaleNoVerify leaves `ckpt verify` out of the jobs of many objects
	// (it reads every live object: 20 minutes at a million here).
	ScaleNoVerify bool
	// Seed makes the workload reproducible (default 1).
	Seed uint64
	// Log receives progress lines (default: discarded).
	Log io.Writer
}

// Sections, in the order they run.
var Sections = []string{"incremental", "restore", "app", "wal", "peers", "e2e", "pause", "memory", "rescale", "shapes", "scale"}

func (o *Options) defaults() error {
	if o.StateBytes == 0 {
		o.StateBytes = 64 << 20
		if o.Quick {
			o.StateBytes = 8 << 20
		}
	}
	if o.RescaleBytes == 0 {
		o.RescaleBytes = 1 << 30
		if o.Quick {
			o.RescaleBytes = 16 << 20
		}
	}
	if o.ScaleFiles == nil {
		o.ScaleFiles = []int{1000, 10000, 100000}
		if o.Quick {
			o.ScaleFiles = []int{200, 1000}
		}
	}
	if o.ScaleObjects == nil {
		o.ScaleObjects = []int{10000, 100000, 1000000}
		if o.Quick {
			o.ScaleObjects = []int{2000}
		}
	}
	for _, n := range o.ScaleFiles {
		if n < 1 || n > 10000000 {
			return fmt.Errorf("scale files must be between 1 and 10,000,000, got %d", n)
		}
	}
	for _, n := range o.ScaleObjects {
		if n < 100 || n > 100000000 {
			return fmt.Errorf("scale objects must be between 100 and 100,000,000, got %d", n)
		}
	}
	if o.Churn == 0 {
		o.Churn = 0.01
	}
	if o.Checkpoints == 0 {
		o.Checkpoints = 10
		if o.Quick {
			o.Checkpoints = 3
		}
	}
	if o.AppInterval == 0 {
		o.AppInterval = time.Second
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	switch {
	case o.StateBytes < 1<<20:
		return fmt.Errorf("state bytes must be at least 1 MiB, got %d", o.StateBytes)
	case o.RescaleBytes < 1<<20:
		return fmt.Errorf("rescale bytes must be at least 1 MiB, got %d", o.RescaleBytes)
	case o.Churn <= 0 || o.Churn > 1:
		return fmt.Errorf("churn must be in (0, 1], got %g", o.Churn)
	case o.AppInterval < 10*time.Millisecond || o.AppInterval > 10*time.Minute:
		return fmt.Errorf("app interval must be between 10ms and 10m, got %s", o.AppInterval)
	case o.Checkpoints < 2:
		return fmt.Errorf("checkpoints must be at least 2 (the first one is a full upload either way), got %d", o.Checkpoints)
	}
	for _, s := range o.Only {
		found := false
		for _, k := range Sections {
			found = found || s == k
		}
		if !found {
			return fmt.Errorf("unknown section %q (known: %s)", s, strings.Join(Sections, ", "))
		}
	}
	if o.LoadExe == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the ckpt-bench binary to run the load controls: %w", err)
		}
		o.LoadExe = exe
	}
	return nil
}

func (o *Options) runs(section string) bool {
	if len(o.Only) == 0 {
		return true
	}
	for _, s := range o.Only {
		if s == section {
			return true
		}
	}
	return false
}

// run is the state of one bench run.
type run struct {
	o     Options
	root  string
	tgt   *target
	id    string // run id: job names and peer paths carry it
	rep   *Report
	start time.Time

	// The workload's store and the incremental agent, shared by the
	// sections that need a real store (ensureStore opens them).
	w    *workload.Workload
	inc  *inproc
	next uint64 // the next checkpoint number of the incremental agent
	x    *xfer  // the transfer section's state, for the end-to-end one

	ckptOnce sync.Once
	ckptErr  error
}

// ckptExe returns the ckpt binary that runs as `ckpt agent`: o.CkptExe, or
// the one FindCkpt finds (building it into the scratch dir), once per run.
func (r *run) ckptExe(ctx context.Context) (string, error) {
	r.ckptOnce.Do(func() {
		if r.o.CkptExe != "" {
			return
		}
		r.o.CkptExe, r.ckptErr = FindCkpt(ctx, filepath.Join(r.root, "bin"), r.logf)
	})
	return r.o.CkptExe, r.ckptErr
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.o.Log, "[%6.1fs] "+format+"\n", append([]any{time.Since(r.start).Seconds()}, args...)...)
}

// Run runs the bench and returns its report. Sections that fail record
// their error in the report (Report.Errors) and the others go on; Run
// returns an error only when it cannot start at all, or when a restore did
// not verify (then with the report).
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	r := &run{o: o, start: time.Now(), id: time.Now().UTC().Format("20060102t150405")}
	r.rep = newReport(o)
	root := o.Dir
	if root == "" {
		d, err := os.MkdirTemp("", "ckpt-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		root = d
	} else if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	root, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, err
	}
	r.root = root
	// On every return, the agents and the store stop before the scratch
	// directory goes: an interrupted run must not remove the files of a
	// store that is still compacting.
	defer r.closeStore()

	if o.Storage == "" {
		r.logf("starting versitygw")
		r.tgt, err = startVersitygw(ctx, root)
	} else {
		r.tgt, err = openTarget(ctx, o.Storage)
	}
	if err != nil {
		return nil, err
	}
	defer r.tgt.stop()
	r.rep.Config.Storage = r.tgt.desc
	// Probe once: a storage that cannot be reached fails the run at once.
	st, err := r.tgt.open(ctx)
	if err != nil {
		return nil, err
	}
	st.Close()

	sections := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"incremental", r.incremental},
		{"app", r.appThroughput},
		{"wal", r.walShipping},
		{"peers", r.peers},
		{"e2e", r.endToEnd},
		{"pause", r.pause},
		{"memory", r.memory},
		{"rescale", r.rescale},
		{"shapes", r.shapes},
		{"scale", r.scale},
	}
	for _, s := range sections {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !o.runs(s.name) && !(s.name == "incremental" && o.runs("restore")) {
			continue
		}
		r.logf("section %s", s.name)
		if err := s.fn(ctx); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r.rep.Errors = append(r.rep.Errors, fmt.Sprintf("%s: %v", s.name, err))
			r.logf("section %s failed: %v", s.name, err)
		}
	}
	r.closeStore()
	r.cleanupStorage(ctx)
	r.rep.finish()
	r.rep.DurationS = time.Since(r.start).Seconds()
	if rs := r.rep.Restore; rs != nil && (!rs.LocalVerified || !rs.RemoteVerified) {
		return r.rep, fmt.Errorf("a restore did not verify: %s", rs.Error)
	}
	return r.rep, nil
}

// inproc is an agent running in this process on a counting store.
type inproc struct {
	client   *client.Client
	count    *counting
	store    storage.Store
	localDir string
	job      string
	cancel   context.CancelFunc
	done     chan error
	// ownsStore: stop closes store.
	ownsStore bool
}

// jobName is the job of the agent called name.
func (r *run) jobName(name string) string { return "bench-" + r.id + "-" + name }

// openCounting opens the target behind retries and a byte counter.
func (r *run) openCounting(ctx context.Context) (*counting, error) {
	base, err := r.tgt.open(ctx)
	if err != nil {
		return nil, err
	}
	return &counting{Store: retry.New(base, retry.Options{MaxAttempts: 4})}, nil
}

// startAgent starts an in-process agent for job on the target, with its
// local dir and socket under root/name.
func (r *run) startAgent(ctx context.Context, name string) (*inproc, error) {
	c, err := r.openCounting(ctx)
	if err != nil {
		return nil, err
	}
	p, err := r.startAgentOn(ctx, name, c, c, agent.Config{})
	if err != nil {
		c.Close()
		return nil, err
	}
	p.ownsStore = true
	return p, nil
}

// startAgentOn starts an in-process agent called name on st, which writes
// through c (the counter of its bytes); cfg's GCInterval is kept. The
// agent does not close st when it stops.
func (r *run) startAgentOn(ctx context.Context, name string, c *counting, st storage.Store, cfg agent.Config) (*inproc, error) {
	dir := filepath.Join(r.root, "agents", name)
	if err := os.MkdirAll(filepath.Join(dir, "local"), 0o755); err != nil {
		return nil, err
	}
	sock, err := shortSocket(dir)
	if err != nil {
		return nil, err
	}
	job := r.jobName(name)
	a, err := agent.New(agent.Config{
		Socket: sock, Store: st, Job: job, LocalDir: filepath.Join(dir, "local"),
		AllowRoots: []string{r.root}, Retain: 2, ShutdownGrace: 5 * time.Second, GCInterval: cfg.GCInterval,
		Version: "bench", Logger: slog.New(slog.DiscardHandler), MaxQueued: 16,
	})
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &inproc{count: c, store: st, localDir: filepath.Join(dir, "local"), job: job, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- a.Run(actx) }()
	select {
	case <-a.Ready():
	case err := <-p.done:
		cancel()
		return nil, fmt.Errorf("start agent: %w", err)
	}
	if p.client, err = client.Dial(ctx, sock); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *inproc) stop() {
	if p.client != nil {
		p.client.Close()
	}
	p.cancel()
	<-p.done
	if p.ownsStore {
		p.store.Close()
	}
}

// shortSocket returns a socket path that fits sun_path.
func shortSocket(dir string) (string, error) {
	p := filepath.Join(dir, "a.sock")
	if len(p) < 100 {
		return p, nil
	}
	d, err := os.MkdirTemp("", "ckpt-bench-sock-")
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "a.sock"), nil
}

// cleanupStorage deletes what the run wrote to a storage the user gave
// (a self-started server goes away with its directory).
func (r *run) cleanupStorage(ctx context.Context) {
	if r.o.Storage == "" {
		return
	}
	st, err := r.tgt.open(ctx)
	if err != nil {
		return
	}
	defer st.Close()
	var keys []string
	st.List(ctx, "bench-"+r.id+"-", func(oi storage.ObjectInfo) error {
		keys = append(keys, oi.Key)
		return nil
	})
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		if err := st.Delete(ctx, keys[:n]...); err != nil {
			r.logf("cleanup: %v", err)
			break
		}
		keys = keys[n:]
	}
	if r.tgt.kind == "file" {
		os.RemoveAll(filepath.Join(r.tgt.dir, "bench-"+r.id+"-peers"))
	}
}

// closeStore stops the incremental agent and closes the workload's store.
func (r *run) closeStore() {
	if r.x != nil && r.x.agent != nil {
		r.x.agent.stop()
		r.x.agent = nil
	}
	if r.inc != nil {
		r.inc.stop()
		r.inc = nil
	}
	if r.w != nil {
		r.w.Close()
		r.w = nil
	}
}
