package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/statuspage"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/client"
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

// agentOptions are the settings of `ckpt agent`, filled by parseAgentFlags.
type agentOptions struct {
	socket, store, job, node, localDir string
	roots                              stringList
	uids, gids                         idList
	maxConns                           int
	idleTimeout                        time.Duration
	retain                             int
	grace, reuseMaxAge, gcInterval     time.Duration
	scrubRate                          int64
	conc, maxConc, maxQueued           int
	manifestFormat                     int
	shutdown, patience, ckptTimeout    time.Duration
	uploadRate                         int64
	metricsAddr                        string
	pprof                              bool
	drillEvery                         time.Duration
	drillRate, drillMaxBytes           int64
	drillSampleBytes                   int64
	scratch                            string
	standbyFor                         stringList
	standbyEvery                       time.Duration
	standbyRate                        int64
	followed                           []string // standbyFor, split and checked
	createStorage                      bool
	logLevel                           string
	config                             string
	tenants                            string
	walInterval                        time.Duration
	walSegmentBytes                    int64
}

// defineAgentFlags defines every flag of `ckpt agent` on fs, one line each,
// and returns the options they fill. Each flag may also come from the
// environment as CKPT_<FLAG> and from --config (see parseAgentFlags).
func defineAgentFlags(fs *flag.FlagSet) *agentOptions {
	o := &agentOptions{}
	fs.StringVar(&o.socket, "socket", "", "Unix socket to serve the protocol on (created with mode 0660)")
	fs.StringVar(&o.store, "storage", "", "storage URL: file:///dir, s3://bucket/prefix or gs://bucket/prefix")
	fs.StringVar(&o.job, "job", "", "job name: the namespace of this deployment in storage")
	fs.StringVar(&o.node, "node", "", "node name recorded when this agent takes a task's ownership and named when it fences another (default: the hostname)")
	fs.StringVar(&o.localDir, "local-dir", "", "task-local store; put it on the app's filesystem so snapshots are hard-linked")
	fs.Var(&o.roots, "allow-root", "absolute directory that checkpoint dirs and restore targets must resolve inside (repeatable; at least one is required; / allows any, explicitly)")
	fs.Var(&o.uids, "allow-uid", "only peers (SO_PEERCRED) with this user id, or a group of --allow-gid, may connect (repeatable; none of either: anyone who can open the socket)")
	fs.Var(&o.gids, "allow-gid", "only peers with this group id, or a user of --allow-uid, may connect (repeatable)")
	fs.IntVar(&o.maxConns, "max-connections", 256, "open client connections at once; beyond it new ones are refused as unavailable")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 10*time.Minute, "close a connection that sent nothing and awaits no reply for this long (0: never)")
	fs.IntVar(&o.retain, "retain", 2, "complete checkpoints kept per task (at least 1)")
	fs.DurationVar(&o.grace, "gc-grace", time.Hour, "age an unreferenced object must reach before GC deletes it (at least "+gc.MinGrace.String()+")")
	fs.DurationVar(&o.reuseMaxAge, "reuse-check-max-age", 0, "before a commit, every reused object must have been seen in storage with its size (listing or stat) at most this long ago (0: 5m, at most --gc-grace/4; at most --gc-grace/2)")
	fs.Int64Var(&o.scrubRate, "scrub-rate", 0, "background scrub: re-read and re-hash the job's live objects at up to this many bytes/s, healing damaged ones from local copies (0: off)")
	fs.DurationVar(&o.gcInterval, "gc-interval", time.Minute, "least time between two GC sweeps after checkpoints (negative: never)")
	fs.IntVar(&o.conc, "upload-concurrency", 4, "parallel hashing and transfers per checkpoint")
	fs.IntVar(&o.manifestFormat, "manifest-format", manifests.FormatVersion, "manifest format to write: 2 (compact, BLAKE3 for new files) or 1 (what ckpt releases before format 2 read; keep it until every agent and restore of the job reads format 2)")
	fs.IntVar(&o.maxConc, "max-concurrent", 1, "checkpoints per task in their async phase at once")
	fs.IntVar(&o.maxQueued, "max-queued", 4, "synced checkpoints per task waiting for an async slot before requests are refused")
	fs.DurationVar(&o.shutdown, "shutdown-grace", 30*time.Second, "time in-flight checkpoints get to finish on SIGTERM before they are aborted")
	fs.DurationVar(&o.ckptTimeout, "checkpoint-timeout", 10*time.Minute, "bound on a checkpoint's async phase: past it the checkpoint fails with unavailable and the next one starts (0: none; a request's timeout_ms may lower it)")
	fs.DurationVar(&o.patience, "commit-patience", 2*time.Minute, "how long a manifest commit retries storage errors once every object is uploaded")
	fs.Int64Var(&o.uploadRate, "upload-rate", 0, "bandwidth limit for uploads in bytes/s, shared by all transfers of the agent (0: unlimited)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve /metrics, /healthz, /readyz and the status page / on this HOST:PORT")
	fs.BoolVar(&o.pprof, "pprof", false, "also serve /debug/pprof/ on the metrics address")
	fs.DurationVar(&o.drillEvery, "drill-interval", 0, "run a restore drill from storage for every task this often (0: never)")
	fs.Int64Var(&o.drillRate, "drill-rate", 0, "bandwidth limit for drills in bytes/s (0: unlimited)")
	fs.Int64Var(&o.drillMaxBytes, "drill-max-bytes", 0, "refuse a drill of a checkpoint whose full size exceeds this many bytes (0: no cap; every drill is also refused when --drill-dir lacks the free space for it)")
	fs.Int64Var(&o.drillSampleBytes, "drill-sample-bytes", 0, "drill a sample instead of the whole checkpoint: files picked at random until this many bytes (plus at most one file), read from storage and checked against the manifest, nothing written (0: restore the whole checkpoint into --drill-dir)")
	fs.StringVar(&o.scratch, "drill-dir", "", "scratch directory for drills (default: the system temp dir)")
	fs.Var(&o.standbyFor, "standby-for", "a task of the job this agent follows without owning it: its newest checkpoint is kept in --local-dir, so that a restore of it on this node is local (repeatable, or comma-separated)")
	fs.DurationVar(&o.standbyEvery, "standby-interval", 10*time.Second, "how often each followed task's copy is brought up to date")
	fs.Int64Var(&o.standbyRate, "standby-rate", 0, "bandwidth limit for standby downloads in bytes/s (0: unlimited)")
	fs.BoolVar(&o.createStorage, "create-storage", false, "create a file:// storage directory that does not exist yet (other commands refuse a missing one)")
	fs.DurationVar(&o.walInterval, "wal-interval", time.Second, "ship the write-ahead log of tasks whose checkpoint requests name a wal_dir this often between checkpoints (0: never)")
	fs.Int64Var(&o.walSegmentBytes, "wal-segment-bytes", 16<<20, "most bytes of one shipped WAL segment (a single larger record is a segment of its own)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.config, "config", "", "YAML or JSON file of flag values, keyed by flag name (the command line and CKPT_<FLAG> variables win)")
	fs.StringVar(&o.tenants, "tenants", "", "node-agent mode: YAML or JSON file of tenants, each matched by peer uid/gid (and cgroup) to its job, storage, allow_roots and tasks pattern; replaces --storage, --job, --allow-root, --allow-uid, --allow-gid (see deploy/node-agent)")
	return o
}

// agentFlagSet is the agent's flag set with its usage text.
func agentFlagSet() (*flag.FlagSet, *agentOptions) {
	fs := newFlags("agent", "--socket PATH --storage URL --job NAME --local-dir DIR --allow-root DIR... [flags]",
		"ckpt agent --socket /run/ckpt/ckpt.sock --storage s3://bucket/ckpt --job orders --local-dir /data/ckpt-local --allow-root /data\n"+
			"  CKPT_STORAGE=gs://bucket/ckpt CKPT_ALLOW_ROOT=/data,/cache ckpt agent --config /etc/ckpt/agent.yaml")
	o := defineAgentFlags(fs)
	usage := fs.Usage
	fs.Usage = func() {
		usage()
		fmt.Fprintln(fs.Output(), "\nEvery flag may also come from the environment as CKPT_<FLAG> (upper case, - as _;\n"+
			"repeatable flags comma-separated) and from --config. The command line wins over the\n"+
			"environment, the environment over --config.")
	}
	return fs, o
}

// parseAgentFlags parses the agent's settings without starting anything:
// args first, then environ's CKPT_<FLAG> variables for flags args did not
// set, then the --config file for flags neither set, and checks them. It
// returns the names of CKPT_ variables that are no setting of ckpt, to be
// warned about.
func parseAgentFlags(args, environ []string) (*agentOptions, []string, error) {
	fs, o := agentFlagSet()
	if err := parseFlags(fs, args); err != nil {
		return nil, nil, err
	}
	unknown, err := applyEnv(fs, environ)
	if err != nil {
		return nil, nil, usageError{err}
	}
	if o.config != "" {
		if err := applyConfig(fs, o.config); err != nil {
			return nil, nil, usageError{err}
		}
	}
	if err := o.check(fs); err != nil {
		return nil, nil, err
	}
	return o, unknown, nil
}

// check refuses settings the agent cannot start with, as usage errors.
func (o *agentOptions) check(fs *flag.FlagSet) error {
	required := []string{"socket", "storage", "job", "local-dir"}
	if o.tenants != "" {
		if err := checkTenantFlags(fs); err != nil {
			return err
		}
		required = []string{"socket", "local-dir"}
	}
	if err := checkArgs(fs, required...); err != nil {
		return err
	}
	if len(o.roots) == 0 && o.tenants == "" {
		return usageError{errors.New("--allow-root is required: any process that can open the socket may name a dir to checkpoint or restore into, and the allowed roots confine them; give the app's data directory, or --allow-root / to allow any dir explicitly")}
	}
	for _, r := range o.roots {
		if !filepath.IsAbs(r) {
			return usageError{fmt.Errorf("--allow-root %q is relative: give an absolute path", r)}
		}
	}
	if o.maxConns < 1 {
		return usageError{fmt.Errorf("--max-connections must be at least 1, got %d", o.maxConns)}
	}
	if o.ckptTimeout < 0 {
		return usageError{fmt.Errorf("--checkpoint-timeout must not be negative (0: none)")}
	}
	if o.idleTimeout < 0 {
		return usageError{fmt.Errorf("--idle-timeout must not be negative (0: never)")}
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(o.logLevel)); err != nil {
		return usageError{fmt.Errorf("--log-level %q: use debug, info, warn or error", o.logLevel)}
	}
	if err := checkRetain(fs); err != nil {
		return err
	}
	if err := gc.CheckGrace("--gc-grace", o.grace); err != nil {
		return usageError{err}
	}
	if o.gcInterval == 0 {
		return usageError{fmt.Errorf("--gc-interval 0s: give the least time between two GC sweeps, or a negative value to disable sweeps")}
	}
	if o.drillMaxBytes < 0 {
		return usageError{fmt.Errorf("--drill-max-bytes must not be negative (0: no cap)")}
	}
	if o.drillSampleBytes < 0 {
		return usageError{fmt.Errorf("--drill-sample-bytes must not be negative (0: drill the whole checkpoint)")}
	}
	if o.uploadRate < 0 || o.drillRate < 0 || o.scrubRate < 0 || o.standbyRate < 0 {
		return usageError{fmt.Errorf("--upload-rate, --drill-rate, --scrub-rate and --standby-rate must not be negative")}
	}
	if o.walInterval < 0 {
		return usageError{fmt.Errorf("--wal-interval must not be negative (0: never)")}
	}
	if o.walSegmentBytes < 4096 {
		return usageError{fmt.Errorf("--wal-segment-bytes must be at least 4096, got %d", o.walSegmentBytes)}
	}
	if o.standbyEvery <= 0 {
		return usageError{fmt.Errorf("--standby-interval must be positive")}
	}
	o.followed = nil
	for _, v := range o.standbyFor {
		for _, task := range strings.Split(v, ",") {
			if task = strings.TrimSpace(task); task != "" {
				if err := manifests.ValidName("task", task); err != nil {
					return usageError{fmt.Errorf("--standby-for: %w", err)}
				}
				o.followed = append(o.followed, task)
			}
		}
	}
	return nil
}

func runAgent(ctx context.Context, args []string) error {
	o, unknownEnv, err := parseAgentFlags(args, os.Environ())
	if err != nil {
		return err
	}
	idle := o.idleTimeout
	if idle == 0 {
		idle = -1 // never
	}
	ckptTimeout := o.ckptTimeout
	if ckptTimeout == 0 {
		ckptTimeout = -1 // none
	}
	log, err := newLogger(o.logLevel)
	if err != nil {
		return err
	}
	for _, name := range unknownEnv {
		log.Warn("unknown environment variable: no ckpt agent flag is named by it (see ckpt agent --help)", "name", name)
	}
	warnLoweredGraceFloor()
	if o.tenants != "" {
		return runNodeAgent(ctx, o, ckptTimeout, idle, log)
	}
	// Telemetry first: the store's metrics decorator registers with it.
	tel, err := telemetry.New(ctx, telemetry.Options{Job: o.job, Storage: o.store, Version: version})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	if o.createStorage {
		if err := createFileStorage(o.store); err != nil {
			return err
		}
	}
	base, err := openAgentStore(ctx, o.store, log)
	if err != nil {
		return err
	}
	defer base.Close()
	st := ratelimit.New(base, ratelimit.Limits{Upload: o.uploadRate})
	cfg := agent.Config{
		Socket: o.socket, Store: st, Job: o.job, Node: o.node, LocalDir: o.localDir, AllowRoots: o.roots, Telemetry: tel,
		AllowUIDs: o.uids, AllowGIDs: o.gids, MaxConnections: o.maxConns, IdleTimeout: idle,
		Retain: o.retain, GCGrace: o.grace, GCInterval: o.gcInterval, ReuseCheckMaxAge: o.reuseMaxAge, ScrubRate: o.scrubRate,
		UploadConcurrency: o.conc, MaxConcurrent: o.maxConc, MaxQueued: o.maxQueued, ManifestFormat: o.manifestFormat,
		ShutdownGrace: o.shutdown, CommitPatience: o.patience, CheckpointTimeout: ckptTimeout, Version: version, Logger: log,
		WALInterval: o.walIntervalCfg(), WALSegmentBytes: o.walSegmentBytes,
	}
	cfg.Restore = func(ctx context.Context, r agent.RestoreRequest) (*restore.Result, error) {
		res, err := restore.Run(ctx, restore.Options{Store: st, Job: o.job, Task: r.Task, Checkpoint: r.Checkpoint,
			JobConsistent: r.JobConsistent, To: restore.DefaultTo(r.To, r.Checkpoint, r.JobConsistent), Target: r.Target, TargetParent: r.Parent, LocalDir: o.localDir})
		recordRestore(ctx, tel, r.Task, res, err)
		return res, err
	}
	if o.drillEvery > 0 {
		drillStore := ratelimit.New(base, ratelimit.Limits{Download: o.drillRate})
		cfg.DrillInterval = o.drillEvery
		cfg.Drill = func(ctx context.Context, task string) (*restore.DrillResult, error) {
			return restore.Drill(ctx, restore.DrillOptions{Store: drillStore, Job: o.job, Task: task, ScratchDir: o.scratch, Check: engines.Check, MaxBytes: o.drillMaxBytes,
				SampleBytes: o.drillSampleBytes})
		}
	}
	{
		// Warm standbys: the tasks of --standby-for, and any a follow
		// request names.
		standbyStore := ratelimit.New(base, ratelimit.Limits{Download: o.standbyRate})
		cfg.StandbyFor, cfg.StandbyInterval = o.followed, o.standbyEvery
		// With --drill-interval, the failover restore from each copy is
		// measured at that pace (it reads the whole copy).
		measured := map[string]time.Time{}
		cfg.Standby = func(ctx context.Context, task string) (*restore.RefreshResult, error) {
			measure := o.drillEvery > 0 && time.Since(measured[task]) >= o.drillEvery
			res, err := restore.Refresh(ctx, restore.RefreshOptions{Store: standbyStore, Job: o.job, Task: task, LocalDir: o.localDir, MeasureFailover: measure})
			if res != nil && res.Failover != nil {
				measured[task] = time.Now()
			}
			return res, err
		}
	}
	a, err := agent.New(cfg)
	if err != nil {
		return usageError{err}
	}
	if o.metricsAddr != "" {
		addr, _, err := tel.Serve(ctx, o.metricsAddr, telemetry.ServerOptions{Ready: a.ReadyCheck, Storage: a.StorageCheck, Pprof: o.pprof, Page: statuspage.Render, Logger: log})
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

func runTrigger(ctx context.Context, args []string) error {
	fs := newFlags("trigger", "--socket PATH --task T --checkpoint N --dir DIR [--engine E] [--wait D] [--json]",
		"ckpt trigger --socket /run/ckpt/ckpt.sock --task orders-3 --checkpoint 42 --dir /data/orders-3/.ckpt-42")
	socket := fs.String("socket", "", "the agent's Unix socket")
	task := fs.String("task", "", "task name")
	n := fs.Uint64("checkpoint", 0, "checkpoint number (positive, increasing per task)")
	dir := fs.String("dir", "", "absolute path of the snapshot directory (an engine checkpoint)")
	engine := fs.String("engine", "", "engine that made the snapshot (pebble, rocksdb, generic); without it the checkpoint is generic, and drills cannot open it to check it")
	wait := fs.Duration("wait", client.DefaultDialWait, "how long to wait for an agent to listen on --socket (0: fail at once)")
	asJSON := fs.Bool("json", false, "print the completed (or failed) event as JSON")
	if err := parse(fs, args, "socket", "task", "checkpoint", "dir"); err != nil {
		return err
	}
	if err := manifests.ValidName("task", *task); err != nil {
		return usageError{err}
	}
	if *n == 0 {
		return usageError{errors.New("--checkpoint must be positive (checkpoint numbers start at 1 and increase per task)")}
	}
	if *wait < 0 {
		return usageError{errors.New("--wait must not be negative")}
	}
	if err := loadPlugins(ctx); err != nil {
		return err
	}
	if _, err := engines.Lookup(*engine); err != nil {
		return usageError{fmt.Errorf("--engine: %w", err)}
	}
	if *engine == "" {
		fmt.Fprintln(os.Stderr, "note: no --engine: the checkpoint is recorded as generic, and drills will not open it to check it (give --engine pebble or rocksdb)")
	}
	return trigger(ctx, *socket, *task, *n, *dir, *engine, *wait, *asJSON)
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

// walIntervalCfg is --wal-interval as agent.Config takes it: 0 (never)
// is negative there.
func (o *agentOptions) walIntervalCfg() time.Duration {
	if o.walInterval == 0 {
		return -1
	}
	return o.walInterval
}
