package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ckpt-io/ckpt/statuspage"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/ratelimit"
	"github.com/ckpt-io/ckpt/telemetry"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// idList is a repeatable flag of numeric user or group ids.
type idList []uint32

func (l *idList) String() string {
	s := make([]string, len(*l))
	for i, id := range *l {
		s[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(s, ",")
}

func (l *idList) Set(v string) error {
	id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
	if err != nil {
		return fmt.Errorf("%q is not a numeric id", v)
	}
	*l = append(*l, uint32(id))
	return nil
}

func runAgent(ctx context.Context, args []string) error {
	fs := newFlags("agent", "--socket PATH --storage URL --job NAME --local-dir DIR [flags]",
		"ckpt agent --socket /run/ckpt/ckpt.sock --storage s3://bucket/ckpt --job orders --local-dir /data/ckpt-local --allow-root /data")
	socket := fs.String("socket", "", "Unix socket to serve the protocol on (created with mode 0660)")
	store := fs.String("storage", "", "storage URL: file:///dir, s3://bucket/prefix or gs://bucket/prefix")
	job := fs.String("job", "", "job name: the namespace of this deployment in storage")
	node := fs.String("node", "", "node name recorded when this agent takes a task's ownership and named when it fences another (default: the hostname)")
	localDir := fs.String("local-dir", "", "task-local store; put it on the app's filesystem so snapshots are hard-linked")
	var roots stringList
	fs.Var(&roots, "allow-root", "absolute directory that checkpoint dirs and restore targets must resolve inside (repeatable; at least one is required; / allows any, explicitly)")
	var uids, gids idList
	fs.Var(&uids, "allow-uid", "only peers (SO_PEERCRED) with this user id, or a group of --allow-gid, may connect (repeatable; none of either: anyone who can open the socket)")
	fs.Var(&gids, "allow-gid", "only peers with this group id, or a user of --allow-uid, may connect (repeatable)")
	maxConns := fs.Int("max-connections", 256, "open client connections at once; beyond it new ones are refused as unavailable")
	idleTimeout := fs.Duration("idle-timeout", 10*time.Minute, "close a connection that sent nothing and awaits no reply for this long (0: never)")
	retain := fs.Int("retain", 2, "complete checkpoints kept per task (at least 1)")
	grace := fs.Duration("gc-grace", time.Hour, "age an unreferenced object must reach before GC deletes it (at least "+manifests.MinGCGrace.String()+")")
	reuseMaxAge := fs.Duration("reuse-check-max-age", 0, "before a commit, every reused object must have been seen in storage with its size (listing or stat) at most this long ago (0: 5m, at most --gc-grace/4; at most --gc-grace/2)")
	scrubRate := fs.Int64("scrub-rate", 0, "background scrub: re-read and re-hash the job's live objects at up to this many bytes/s, healing damaged ones from local copies (0: off)")
	gcInterval := fs.Duration("gc-interval", time.Minute, "least time between two GC sweeps after checkpoints (negative: never)")
	conc := fs.Int("upload-concurrency", 4, "parallel hashing and transfers per checkpoint")
	maxConc := fs.Int("max-concurrent", 1, "checkpoints per task in their async phase at once")
	maxQueued := fs.Int("max-queued", 4, "synced checkpoints per task waiting for an async slot before requests are refused")
	shutdown := fs.Duration("shutdown-grace", 30*time.Second, "time in-flight checkpoints get to finish on SIGTERM before they are aborted")
	ckptTimeout := fs.Duration("checkpoint-timeout", 10*time.Minute, "bound on a checkpoint's async phase: past it the checkpoint fails with unavailable and the next one starts (0: none; a request's timeout_ms may lower it)")
	patience := fs.Duration("commit-patience", 2*time.Minute, "how long a manifest commit retries storage errors once every object is uploaded")
	uploadRate := fs.Int64("upload-rate", 0, "bandwidth limit for uploads in bytes/s, shared by all transfers of the agent (0: unlimited)")
	metricsAddr := fs.String("metrics-addr", "", "serve /metrics, /healthz, /readyz and the status page / on this HOST:PORT")
	pprofOn := fs.Bool("pprof", false, "also serve /debug/pprof/ on the metrics address")
	drillEvery := fs.Duration("drill-interval", 0, "run a restore drill from storage for every task this often (0: never)")
	drillRate := fs.Int64("drill-rate", 0, "bandwidth limit for drills in bytes/s (0: unlimited)")
	scratch := fs.String("drill-dir", "", "scratch directory for drills (default: the system temp dir)")
	var standbyFor stringList
	fs.Var(&standbyFor, "standby-for", "a task of the job this agent follows without owning it: its newest checkpoint is kept in --local-dir, so that a restore of it on this node is local (repeatable, or comma-separated)")
	standbyEvery := fs.Duration("standby-interval", 10*time.Second, "how often each followed task's copy is brought up to date")
	standbyRate := fs.Int64("standby-rate", 0, "bandwidth limit for standby downloads in bytes/s (0: unlimited)")
	createStorage := fs.Bool("create-storage", false, "create a file:// storage directory that does not exist yet (other commands refuse a missing one)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	config := fs.String("config", "", "JSON file of flag values, keyed by flag name (flags given on the command line win)")
	tenants := fs.String("tenants", "", "node-agent mode: YAML or JSON file of tenants, each matched by peer uid/gid (and cgroup) to its job, storage, allow_roots and tasks pattern; replaces --storage, --job, --allow-root, --allow-uid, --allow-gid")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *config != "" {
		if err := applyConfig(fs, *config); err != nil {
			return usageError{err}
		}
	}
	if *tenants != "" {
		return runNodeAgent(ctx, fs, *tenants)
	}
	if err := checkArgs(fs, "socket", "storage", "job", "local-dir"); err != nil {
		return err
	}
	if len(roots) == 0 {
		return usageError{errors.New("--allow-root is required: any process that can open the socket may name a dir to checkpoint or restore into, and the allowed roots confine them; give the app's data directory, or --allow-root / to allow any dir explicitly")}
	}
	for _, r := range roots {
		if !filepath.IsAbs(r) {
			return usageError{fmt.Errorf("--allow-root %q is relative: give an absolute path", r)}
		}
	}
	if *maxConns < 1 {
		return usageError{fmt.Errorf("--max-connections must be at least 1, got %d", *maxConns)}
	}
	if *ckptTimeout < 0 {
		return usageError{fmt.Errorf("--checkpoint-timeout must not be negative (0: none)")}
	}
	if *ckptTimeout == 0 {
		*ckptTimeout = -1 // none
	}
	if *idleTimeout < 0 {
		return usageError{fmt.Errorf("--idle-timeout must not be negative (0: never)")}
	}
	idle := *idleTimeout
	if idle == 0 {
		idle = -1 // never
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	if err := checkRetain(fs); err != nil {
		return err
	}
	if err := manifests.CheckGCGrace("--gc-grace", *grace); err != nil {
		return usageError{err}
	}
	if *gcInterval == 0 {
		return usageError{fmt.Errorf("--gc-interval 0s: give the least time between two GC sweeps, or a negative value to disable sweeps")}
	}
	warnLoweredGraceFloor()
	if *uploadRate < 0 || *drillRate < 0 || *scrubRate < 0 || *standbyRate < 0 {
		return usageError{fmt.Errorf("--upload-rate, --drill-rate, --scrub-rate and --standby-rate must not be negative")}
	}
	if *standbyEvery <= 0 {
		return usageError{fmt.Errorf("--standby-interval must be positive")}
	}
	var followed []string
	for _, v := range standbyFor {
		for _, task := range strings.Split(v, ",") {
			if task = strings.TrimSpace(task); task != "" {
				if err := manifests.ValidName("task", task); err != nil {
					return usageError{fmt.Errorf("--standby-for: %w", err)}
				}
				followed = append(followed, task)
			}
		}
	}
	// Telemetry first: the store's metrics decorator registers with it.
	tel, err := telemetry.New(ctx, telemetry.Options{Job: *job, Storage: *store, Version: version})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	if *createStorage {
		if err := createFileStorage(*store); err != nil {
			return err
		}
	}
	base, err := openStore(ctx, *store)
	if err != nil {
		return err
	}
	defer base.Close()
	st := ratelimit.New(base, ratelimit.Limits{Upload: *uploadRate})
	cfg := agent.Config{
		Socket: *socket, Store: st, Job: *job, Node: *node, LocalDir: *localDir, AllowRoots: roots, Telemetry: tel,
		AllowUIDs: uids, AllowGIDs: gids, MaxConnections: *maxConns, IdleTimeout: idle,
		Retain: *retain, GCGrace: *grace, GCInterval: *gcInterval, ReuseCheckMaxAge: *reuseMaxAge, ScrubRate: *scrubRate,
		UploadConcurrency: *conc, MaxConcurrent: *maxConc, MaxQueued: *maxQueued,
		ShutdownGrace: *shutdown, CommitPatience: *patience, CheckpointTimeout: *ckptTimeout, Version: version, Logger: log,
	}
	cfg.Restore = func(ctx context.Context, r agent.RestoreRequest) (*restore.Result, error) {
		res, err := restore.Run(ctx, restore.Options{Store: st, Job: *job, Task: r.Task, Checkpoint: r.Checkpoint,
			JobConsistent: r.JobConsistent, Target: r.Target, TargetParent: r.Parent, LocalDir: *localDir})
		recordRestore(ctx, tel, r.Task, res, err)
		return res, err
	}
	if *drillEvery > 0 {
		drillStore := ratelimit.New(base, ratelimit.Limits{Download: *drillRate})
		cfg.DrillInterval = *drillEvery
		cfg.Drill = func(ctx context.Context, task string) (*restore.DrillResult, error) {
			return restore.Drill(ctx, restore.DrillOptions{Store: drillStore, Job: *job, Task: task, ScratchDir: *scratch, Check: engines.Check})
		}
	}
	if len(followed) > 0 {
		standbyStore := ratelimit.New(base, ratelimit.Limits{Download: *standbyRate})
		cfg.StandbyFor, cfg.StandbyInterval = followed, *standbyEvery
		cfg.Standby = func(ctx context.Context, task string) (*restore.RefreshResult, error) {
			return restore.Refresh(ctx, restore.RefreshOptions{Store: standbyStore, Job: *job, Task: task, LocalDir: *localDir})
		}
	}
	a, err := agent.New(cfg)
	if err != nil {
		return usageError{err}
	}
	if *metricsAddr != "" {
		addr, _, err := tel.Serve(ctx, *metricsAddr, telemetry.ServerOptions{Ready: a.ReadyCheck, Pprof: *pprofOn, Page: statuspage.Render, Logger: log})
		if err != nil {
			return err
		}
		log.Info("metrics and status page", "url", "http://"+addr.String()+"/")
	}
	return a.Run(ctx)
}

// recordRestore publishes a restore's duration and sources.
func recordRestore(ctx context.Context, tel *telemetry.Telemetry, task string, res *restore.Result, err error) {
	if res == nil || !res.Restored {
		if err != nil {
			tel.RestoreEnded(ctx, telemetry.RestoreRecord{Task: task})
		}
		return
	}
	tel.RestoreEnded(ctx, telemetry.RestoreRecord{Task: task, Checkpoint: res.Checkpoint, BytesLocal: res.BytesLocal,
		BytesRemote: res.BytesRemote, Duration: time.Duration(res.DurationMS) * time.Millisecond, OK: true})
}

// applyConfig sets every flag the config file names and the command line
// did not set. Unknown keys are errors: a typo must not pass silently.
func applyConfig(fs *flag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var kv map[string]any
	if err := json.Unmarshal(data, &kv); err != nil {
		return fmt.Errorf("--config %s: not a JSON object: %w", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for k, v := range kv {
		name := strings.ReplaceAll(k, "_", "-")
		if fs.Lookup(name) == nil || name == "config" {
			return fmt.Errorf("--config %s: unknown setting %q", path, k)
		}
		if set[name] {
			continue
		}
		vals := []any{v}
		if list, ok := v.([]any); ok {
			vals = list
		}
		for _, one := range vals {
			var s string
			switch x := one.(type) {
			case string:
				s = x
			case float64, bool:
				s = fmt.Sprint(x)
			default:
				return fmt.Errorf("--config %s: setting %q: unsupported value %v", path, k, one)
			}
			if err := fs.Set(name, s); err != nil {
				return fmt.Errorf("--config %s: setting %q: %w", path, k, err)
			}
		}
	}
	return nil
}

func runTrigger(ctx context.Context, args []string) error {
	fs := newFlags("trigger", "--socket PATH --task T --checkpoint N --dir DIR [--json]",
		"ckpt trigger --socket /run/ckpt/ckpt.sock --task orders-3 --checkpoint 42 --dir /data/orders-3/.ckpt-42")
	socket := fs.String("socket", "", "the agent's Unix socket")
	task := fs.String("task", "", "task name")
	n := fs.Uint64("checkpoint", 0, "checkpoint number (positive, increasing per task)")
	dir := fs.String("dir", "", "absolute path of the snapshot directory (an engine checkpoint)")
	engine := fs.String("engine", "", "engine that made the snapshot (pebble, rocksdb, generic)")
	asJSON := fs.Bool("json", false, "print the completed (or failed) event as JSON")
	if err := parse(fs, args, "socket", "task", "checkpoint", "dir"); err != nil {
		return err
	}
	if err := loadPlugins(ctx); err != nil {
		return err
	}
	if _, err := engines.Lookup(*engine); err != nil {
		return usageError{fmt.Errorf("--engine: %w", err)}
	}
	return trigger(ctx, *socket, *task, *n, *dir, *engine, *asJSON)
}

// createFileStorage creates the directory of a file:// storage URL (for
// --create-storage); other schemes are left alone.
func createFileStorage(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "file" || !filepath.IsAbs(u.Path) {
		return nil // storage.Open reports what is wrong with it
	}
	if err := os.MkdirAll(u.Path, 0o755); err != nil {
		return fmt.Errorf("--create-storage: %w", err)
	}
	return nil
}
