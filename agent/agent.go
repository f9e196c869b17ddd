// Package agent is the ckpt sidecar: the Unix-socket server, one session per
// task, and the checkpoint coordinator that runs the sync phase (hard links,
// the only part the app waits for) and the async phase (upload, manifest
// commit, local copy, retention and GC) of every checkpoint.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/ckpt-io/ckpt/engines"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/checkpoint"
	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/internal/safefs"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/retry"
	"github.com/ckpt-io/ckpt/telemetry"
	"github.com/ckpt-io/ckpt/uploader"
)

// Config configures an agent. Zero values take the documented defaults.
type Config struct {
	Socket string        // Unix socket path (required)
	Store  storage.Store // where checkpoints go (required)
	Job    string        // the job namespace in storage (required)
	// Node names this agent in ownership records and fencing messages
	// (default: the hostname).
	Node     string
	LocalDir string // the task-local store (required)
	// AllowRoots confines checkpoint dirs and restore targets: a dir must
	// resolve, after symlinks, inside one of them, and is then opened below
	// it through no symlink. At least one absolute root is required; "/"
	// allows any dir, explicitly. The roots are resolved (they must exist)
	// and opened once, when the agent starts.
	AllowRoots []string
	// AllowUIDs and AllowGIDs, when either is set, restrict who may
	// connect: a peer whose uid (SO_PEERCRED) is not in AllowUIDs and whose
	// gid is not in AllowGIDs gets forbidden and is disconnected. Both
	// empty: anyone who can open the socket may use it.
	AllowUIDs, AllowGIDs []uint32
	// MaxConnections bounds the open client connections; beyond it a new
	// one gets unavailable and is closed (default 256).
	MaxConnections int
	// IdleTimeout closes a connection that has sent nothing and awaits no
	// reply for that long (default 10m; negative: never).
	IdleTimeout time.Duration
	// Retain is how many complete checkpoints each task keeps (default 2).
	Retain int
	// GCGrace is the age an unreferenced object must reach before GC
	// deletes it (default 1h; below gc.MinGrace it is refused).
	GCGrace time.Duration
	// ReuseCheckMaxAge bounds how old the observation of a reused object
	// may be when a checkpoint confirms it before its commit: every object
	// a manifest reuses was seen in storage with its size, by a listing of
	// the job's shared prefix or a Stat, no longer than this before the
	// check that precedes the commit (see uploader.Presence). Default:
	// uploader.DefaultPresenceMaxAge (5m), at most GCGrace/4; an explicit
	// value must not exceed GCGrace/2.
	ReuseCheckMaxAge time.Duration
	// ScrubRate, when positive, runs a background scrub that re-reads and
	// re-hashes the live objects of the job's retained manifests at up to
	// this many bytes per second, and heals damaged ones from local copies.
	ScrubRate int64
	// GCInterval is the least time between two job-wide GC sweeps started by
	// completed checkpoints (default 1m; negative: never sweep).
	GCInterval time.Duration
	// UploadConcurrency bounds parallel hashing and transfers of one
	// checkpoint (default 4).
	UploadConcurrency int
	// ManifestFormat is the manifest format written (default
	// manifests.FormatVersion, 2: compact, new files hashed with BLAKE3).
	// 1 writes what a ckpt older than format 2 reads (JSON, SHA-256 only):
	// for a fleet that upgrades agent by agent. Both are always read.
	ManifestFormat int
	// MaxConcurrent bounds the checkpoints of one task in their async phase
	// (default 1).
	MaxConcurrent int
	// MaxQueued bounds the synced checkpoints of one task waiting for an
	// async slot; beyond it requests are refused as unavailable (default 4).
	MaxQueued int
	// CheckpointTimeout bounds a checkpoint's async phase (default 10m;
	// negative: no bound). One past it is cancelled and fails with
	// unavailable, naming the step it was in; its uploads are left to GC
	// and the task's next queued checkpoint starts. A request's timeout_ms
	// may lower it.
	CheckpointTimeout time.Duration
	// CommitPatience is how long the manifest commit keeps retrying
	// transient storage errors once every object is uploaded (default 2m).
	CommitPatience time.Duration
	// ShutdownGrace is how long a stopping agent lets in-flight checkpoints
	// finish before aborting them (default 30s).
	ShutdownGrace time.Duration
	// Engines resolves the engine a checkpoint request names (nil:
	// engines.Default); a name it does not know is refused as bad_request.
	Engines *engines.Registry
	// Version is reported by hello.
	Version string
	Logger  *slog.Logger
	// Telemetry receives metrics and history; nil records nothing.
	Telemetry *telemetry.Telemetry
	// StorageProbeInterval is how often the agent checks that storage
	// answers, for ckpt_storage_up and /healthz/storage's page (default
	// DefaultStorageProbeInterval).
	StorageProbeInterval time.Duration
	// DrillInterval, when positive, runs Drill for every task with a
	// complete checkpoint that often, and publishes the result.
	DrillInterval time.Duration
	Drill         func(ctx context.Context, task string) (*restore.DrillResult, error)
	// StandbyFor names tasks this agent follows without owning them: it
	// keeps the newest checkpoint of each in its local dir, refreshed by
	// Standby every StandbyInterval (default 10s), so that a restore of the
	// task on this node is local (see restore.Refresh).
	StandbyFor      []string
	StandbyInterval time.Duration
	Standby         func(ctx context.Context, task string) (*restore.RefreshResult, error)
	// Restore serves the restore op: it restores the checkpoint the
	// request picks (Checkpoint, 0: the newest complete one; JobConsistent:
	// the newest job-complete one) of Task into Target, a directory the
	// agent has confined to its allowed roots, and returns what it did,
	// which the restored event carries. An error wrapping a
	// *protocol.Error fails the op with its code; restore.ErrNoCheckpoint
	// gives not_found, restore.ErrTargetNotEmpty conflict, a full disk
	// (ENOSPC, EDQUOT) unavailable, anything else (EIO, EROFS included)
	// internal. nil makes the op answer unavailable.
	Restore func(ctx context.Context, r RestoreRequest) (*restore.Result, error)

	// WALInterval is how often the write-ahead log of a task whose
	// checkpoint requests name a wal_dir is shipped between checkpoints
	// (default 1s; negative: never, and wal_dir is ignored).
	WALInterval time.Duration
	// WALSegmentBytes bounds one WAL segment (default 16 MiB).
	WALSegmentBytes int64

	// Tenants, when set, puts the agent in node-agent mode: one socket
	// serves several tenants (see Tenant), each a job of its own with its
	// store, allowed roots, task pattern and local dir
	// (LocalDir/<tenant name>). A connection's peer credentials pick its
	// tenant once, at accept; a peer that matches none, or a request that
	// names another job, a task outside the tenant's pattern or a
	// directory outside its roots, gets forbidden, and every snapshot file
	// must be owned by the peer's uid. Store, Job, AllowRoots, AllowUIDs,
	// AllowGIDs, Restore and Drill must then be unset: TenantServices
	// gives each tenant's.
	Tenants []Tenant
	// TenantServices, required with Tenants, returns a tenant's store,
	// restore, drill and telemetry; localDir is the tenant's own local
	// dir. New calls it once per tenant, in order.
	TenantServices func(t Tenant, localDir string) (TenantServices, error)

	// wrapListener, when set (by tests), wraps the socket's listener.
	wrapListener func(net.Listener) net.Listener
}

func (c *Config) defaults() error {
	if len(c.Tenants) > 0 {
		return c.tenantsConfig()
	}
	if c.Socket == "" || c.Store == nil || c.Job == "" || c.LocalDir == "" {
		return errors.New("agent: socket, storage, job and local dir are required")
	}
	if err := manifests.ValidName("job", c.Job); err != nil {
		return err
	}
	if len(c.AllowRoots) == 0 {
		return errors.New("agent: at least one allowed root is required: it confines the dirs a peer of the socket may checkpoint or restore into (\"/\" allows any, explicitly)")
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = 256
	}
	if c.MaxConnections < 1 {
		return fmt.Errorf("max connections must be at least 1, got %d", c.MaxConnections)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.Retain == 0 {
		c.Retain = 2
	}
	if c.Retain < 1 {
		return fmt.Errorf("retain must be at least 1, got %d", c.Retain)
	}
	if c.GCGrace == 0 {
		c.GCGrace = time.Hour
	}
	if err := gc.CheckGrace("gc grace", c.GCGrace); err != nil {
		return err
	}
	switch {
	case c.ReuseCheckMaxAge < 0:
		return fmt.Errorf("reuse check max age must not be negative")
	case c.ReuseCheckMaxAge == 0:
		c.ReuseCheckMaxAge = min(uploader.DefaultPresenceMaxAge, c.GCGrace/4)
	case c.ReuseCheckMaxAge > c.GCGrace/2:
		return fmt.Errorf("reuse check max age %s exceeds half the gc grace %s: GC could delete a reused object seen that long ago", c.ReuseCheckMaxAge, c.GCGrace)
	}
	if c.ScrubRate < 0 {
		return fmt.Errorf("scrub rate must not be negative")
	}
	if c.GCInterval == 0 {
		c.GCInterval = time.Minute
	}
	if c.UploadConcurrency == 0 {
		c.UploadConcurrency = 4
	}
	if c.ManifestFormat == 0 {
		c.ManifestFormat = manifests.FormatVersion
	}
	if c.ManifestFormat != manifests.Format1 && c.ManifestFormat != manifests.Format2 {
		return fmt.Errorf("manifest format %d: this ckpt writes formats 1 and 2", c.ManifestFormat)
	}
	if err := c.queueAndWAL(); err != nil {
		return err
	}
	if c.StandbyInterval <= 0 {
		c.StandbyInterval = 10 * time.Second
	}
	for _, task := range c.StandbyFor {
		if err := manifests.ValidName("task", task); err != nil {
			return fmt.Errorf("standby: %w", err)
		}
	}
	if c.CheckpointTimeout == 0 {
		c.CheckpointTimeout = 10 * time.Minute
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Engines == nil {
		c.Engines = engines.Default
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	for i, r := range c.AllowRoots {
		if !filepath.IsAbs(r) {
			return fmt.Errorf("allow root %q is relative: give an absolute path", r)
		}
		resolved, err := filepath.EvalSymlinks(r)
		if err != nil {
			return fmt.Errorf("allow root %q: %w (it must exist)", r, err)
		}
		c.AllowRoots[i] = resolved
	}
	return nil
}

// tenantsConfig checks a node agent's config: each tenant brings its own
// storage, job, roots and services.
func (c *Config) tenantsConfig() error {
	switch {
	case c.Socket == "" || c.LocalDir == "":
		return errors.New("agent: socket and local dir are required")
	case c.Store != nil || c.Job != "" || len(c.AllowRoots) > 0 || len(c.AllowUIDs) > 0 || len(c.AllowGIDs) > 0:
		return errors.New("agent: with tenants, each tenant names its storage, job and allowed roots, and its credentials decide who may connect: give no storage, job, allowed roots, allowed uids or gids besides")
	case c.Restore != nil || c.Drill != nil || c.TenantServices == nil:
		return errors.New("agent: with tenants, restores and drills come from TenantServices, which is required")
	case len(c.StandbyFor) > 0 || c.Standby != nil:
		return errors.New("agent: standby copies follow tasks of one job: not with tenants")
	}
	return nil
}

// queueAndWAL sets and checks the limits of the checkpoint queue and of
// WAL shipping.
func (c *Config) queueAndWAL() error {
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 1
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = 4
	}
	if c.UploadConcurrency < 1 || c.MaxConcurrent < 1 || c.MaxQueued < 1 {
		return fmt.Errorf("upload concurrency, max concurrent and max queued must be at least 1")
	}
	if c.CommitPatience == 0 {
		c.CommitPatience = 2 * time.Minute
	}
	if c.WALInterval == 0 {
		c.WALInterval = time.Second
	}
	if c.WALSegmentBytes == 0 {
		c.WALSegmentBytes = 16 << 20
	}
	if c.WALSegmentBytes < 0 {
		return fmt.Errorf("wal segment bytes must be positive, got %d", c.WALSegmentBytes)
	}
	return nil
}

// RestoreRequest is a restore op as Config.Restore receives it, its target
// confined and resolved.
type RestoreRequest struct {
	Task          string
	Checkpoint    uint64
	JobConsistent bool
	// To is the request's "to" ("" for the default: see restore.DefaultTo).
	To     string
	Target string
	// Parent is Target's parent directory, opened under an allowed root
	// (filepath.Dir(Target) is only its name): the restore must create and
	// place Target relative to it (restore.Options.TargetParent), never
	// walk Target's path again.
	Parent *os.File
}

// Agent serves checkpoint requests for the tasks of one job, or, in
// node-agent mode (Config.Tenants), one core Agent per tenant behind one
// socket.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	local   *localrecovery.Store
	agentID string
	roots   []root // the allowed roots, open
	// presence confirms reused objects before commits (job-wide index).
	presence *uploader.Presence
	// txn runs the storage transaction of each checkpoint and keeps what
	// is known of each task in storage (ownership, retained manifests).
	txn *checkpoint.Committer

	mu       sync.Mutex
	tasks    map[string]*task
	draining bool
	// followed are the tasks this agent keeps warm copies of (StandbyFor,
	// and those a follow request added); nudge starts a pass at once.
	followed []string
	nudge    chan struct{}

	jobs       sync.WaitGroup // async phases and sweeps
	jobsCtx    context.Context
	cancelJobs context.CancelFunc

	sweepMu   sync.Mutex
	sweeping  bool
	lastSweep time.Time

	ready chan struct{}
	// listening is set while the socket accepts connections (for /readyz).
	listening bool
	// acceptErr is the last accept's error while accepts fail; nil once
	// one succeeds (for /readyz).
	acceptErr error

	conns atomic.Int64 // open client connections

	owners ownerCache // ownership records read for the job view

	wal walShips // WAL shipping between checkpoints (wal.go)

	// cores, in node-agent mode, are the tenants' agents: this one only
	// listens and hands each connection to the core of its peer's tenant.
	cores []*Agent
	// tenant, on a core, is the tenant it serves (nil in sidecar mode).
	tenant *Tenant
	// volume, in sidecar mode, is the identity of the volume the local dir
	// is on (localrecovery.Store.VolumeID): the agent's identity as an
	// owner, made on first use (see volumeID). Empty in node-agent mode,
	// where the node is.
	volumeMu sync.Mutex
	volume   string
}

// New checks cfg and prepares an agent; Run serves it.
func New(cfg Config) (*Agent, error) {
	if len(cfg.Tenants) > 0 {
		return newNode(cfg)
	}
	cfg.AllowRoots = append([]string(nil), cfg.AllowRoots...)
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	local, err := localrecovery.Open(cfg.LocalDir, cfg.Job)
	if err != nil {
		return nil, err
	}
	roots, err := openRoots(cfg.AllowRoots)
	if err != nil {
		return nil, err
	}
	for _, r := range cfg.AllowRoots {
		if r == "/" {
			cfg.Logger.Warn("allow root / lets any peer of the socket checkpoint any directory the agent can read and restore into any the agent can write; name the app's data directories with --allow-root instead")
		}
	}
	interval := cfg.GCInterval.String()
	if cfg.GCInterval < 0 {
		interval = "never"
	}
	cfg.Logger.Info("gc settings", "gc_grace", cfg.GCGrace.String(), "gc_interval", interval, "retain", cfg.Retain)
	if floor, lowered, _ := gc.GraceFloor(); lowered {
		cfg.Logger.Warn("the GC grace floor is lowered for tests: unsafe with uploads in flight", "env", gc.UnsafeMinGraceEnv, "floor", floor.String())
	}
	id := make([]byte, 6)
	rand.Read(id)
	host, _ := os.Hostname()
	if cfg.Node == "" {
		cfg.Node = host
	}
	a := &Agent{
		cfg: cfg, log: cfg.Logger, local: local, roots: roots,
		presence: uploader.NewPresence(cfg.Store, manifests.SharedPrefix(cfg.Job), cfg.ReuseCheckMaxAge),
		agentID:  host + "-" + hex.EncodeToString(id),
		tasks:    map[string]*task{},
		ready:    make(chan struct{}),
		followed: slices.Clone(cfg.StandbyFor),
		nudge:    make(chan struct{}, 1),
	}
	a.txn = checkpoint.New(checkpoint.Config{
		Store: cfg.Store, Job: cfg.Job, Node: cfg.Node, AgentID: a.agentID, Local: local, Presence: a.presence,
		Retain: cfg.Retain, UploadConcurrency: cfg.UploadConcurrency, ManifestFormat: cfg.ManifestFormat,
		CommitPatience: cfg.CommitPatience, Log: cfg.Logger,
		Volume: a.volumeID, Succeeds: a.succeeds, Note: a.noteOutcome,
		Replaced: func(ctx context.Context, reason string) { a.cfg.Telemetry.ReuseReplaced(ctx, reason) },
	})
	return a, nil
}

// Ready is closed once the socket accepts connections.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Run serves until ctx is cancelled (SIGTERM), then stops accepting, lets
// in-flight checkpoints finish within the shutdown grace, aborts the rest,
// and returns nil. It returns an error only if it cannot start.
func (a *Agent) Run(ctx context.Context) error {
	cores := a.cores
	if cores == nil {
		cores = []*Agent{a}
	}
	for _, c := range cores {
		unlock, err := c.start(ctx)
		if err != nil {
			return err
		}
		defer unlock()
	}
	l, err := listen(a.cfg.Socket)
	if err != nil {
		return err
	}
	connCtx, cancelConns := context.WithCancel(context.WithoutCancel(ctx))
	var ln net.Listener = l
	if a.cfg.wrapListener != nil {
		ln = a.cfg.wrapListener(l)
	}
	var conns sync.WaitGroup
	acceptDone, stopAccept := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(acceptDone)
		a.accept(ln, stopAccept, func(s *session) {
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer a.conns.Add(-1)
				s.a.serveConn(connCtx, s)
			}()
		})
	}()
	if a.cores == nil {
		a.log.Info("agent ready", "socket", a.cfg.Socket, "storage", a.cfg.Store.String(), "job", a.cfg.Job, "local_dir", a.cfg.LocalDir, "agent_id", a.agentID, "node", a.cfg.Node)
	} else {
		for _, c := range cores {
			c.log.Info("tenant ready", "job", c.cfg.Job, "storage", c.cfg.Store.String(), "local_dir", c.cfg.LocalDir, "allow_roots", c.cfg.AllowRoots, "tasks", c.tenant.Tasks, "agent_id", c.agentID)
		}
		a.log.Info("node agent ready", "socket", a.cfg.Socket, "tenants", len(cores), "local_dir", a.cfg.LocalDir)
	}
	a.mu.Lock()
	a.listening = true
	a.mu.Unlock()
	close(a.ready)
	if a.cores == nil {
		// The status page's job view: a scan of the job, while it is viewed.
		a.cfg.Telemetry.SetJobSource(JobViewInterval, a.jobView)
		defer a.cfg.Telemetry.SetJobSource(0, nil)
	}
	for _, c := range cores {
		c.background(ctx)
	}

	<-ctx.Done()
	a.log.Info("agent stopping", "grace", a.cfg.ShutdownGrace.String())
	for _, c := range append([]*Agent{a}, a.cores...) {
		c.mu.Lock()
		c.draining = true
		c.mu.Unlock()
	}
	close(stopAccept)
	ln.Close()
	<-acceptDone

	// Every core drains within the same grace.
	deadline := time.After(a.cfg.ShutdownGrace)
	var drainers sync.WaitGroup
	for _, c := range cores {
		drainers.Add(1)
		go func() {
			defer drainers.Done()
			c.drain(deadline)
		}()
	}
	drainers.Wait()
	cancelConns()
	conns.Wait()
	for _, c := range cores {
		c.local.Wait() // discarded local copies still being removed
	}
	a.log.Info("agent stopped")
	return nil
}

// start prepares a core to serve: it takes its local dir (one agent per
// local dir, for as long as it runs: another would take this one's
// checkpoints in flight for a crash's leftovers) and tidies it.
func (a *Agent) start(ctx context.Context) (unlock func(), err error) {
	unlock, err = localrecovery.Lock(a.cfg.LocalDir)
	if err != nil {
		return nil, err
	}
	if err := a.recoverLocal(); err != nil {
		unlock()
		return nil, err
	}
	a.jobsCtx, a.cancelJobs = context.WithCancel(context.WithoutCancel(ctx))
	return unlock, nil
}

// background starts a core's drills and scrubs, which stop with ctx.
func (a *Agent) background(ctx context.Context) {
	a.jobs.Add(1)
	go a.probeStorage(ctx)
	a.walStart(ctx)
	if a.cfg.DrillInterval > 0 && a.cfg.Drill != nil {
		a.jobs.Add(1)
		go a.drills(ctx)
	}
	if a.cfg.ScrubRate > 0 {
		a.jobs.Add(1)
		go a.scrubs(ctx)
	}
	if a.cfg.Standby != nil {
		a.jobs.Add(1)
		go a.standbys(ctx)
	}
}

// drain lets a stopping core's in-flight work finish until deadline, then
// aborts what is left and waits for it.
func (a *Agent) drain(deadline <-chan time.Time) {
	drained := make(chan struct{})
	go func() { a.jobs.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-deadline:
		a.log.Warn("shutdown grace over: aborting in-flight checkpoints")
		a.cancelJobs()
		<-drained
	}
	a.cancelJobs()
}

// accept accepts connections until the listener is closed, and hands each
// one admitted to serve. A failed accept (EMFILE, ENFILE, ENOBUFS, a
// connection aborted before it was accepted) is retried with backoff, as
// net/http's Server.Serve does, and makes the agent unready until an accept
// succeeds again.
func (a *Agent) accept(l net.Listener, stop <-chan struct{}, serve func(*session)) {
	const (
		firstDelay = 5 * time.Millisecond
		maxDelay   = time.Second
		logEvery   = 10 * time.Second
	)
	var delay time.Duration
	var failures int
	var lastLog time.Time
	for {
		nc, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-stop:
				return
			default:
			}
			delay = min(max(2*delay, firstDelay), maxDelay)
			failures++
			a.mu.Lock()
			a.acceptErr = err
			a.mu.Unlock()
			if time.Since(lastLog) >= logEvery {
				a.log.Error("accept failed: the socket takes no connections; retrying", "err", err, "failures", failures, "retry_in", delay.String())
				lastLog = time.Now()
			}
			t := time.NewTimer(delay)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		if failures > 0 {
			a.log.Info("accepting connections again", "failures", failures)
			a.mu.Lock()
			a.acceptErr = nil
			a.mu.Unlock()
			delay, failures, lastLog = 0, 0, time.Time{}
		}
		if s, ok := a.admit(nc); ok {
			serve(s)
		}
	}
}

// drills runs restore drills on schedule until ctx is done.
func (a *Agent) drills(ctx context.Context) {
	defer a.jobs.Done()
	tick := time.NewTicker(a.cfg.DrillInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, st := range a.status("") {
			if st.LastCompleted == 0 || ctx.Err() != nil {
				continue
			}
			res, err := a.cfg.Drill(ctx, st.Task)
			rec := telemetry.DrillRecord{Task: st.Task, At: time.Now()}
			if err != nil {
				rec.Error = err.Error()
				a.log.Error("restore drill failed", "task", st.Task, "err", err)
			} else {
				rec.Checkpoint, rec.Bytes, rec.Files = res.Checkpoint, res.Bytes, res.Files
				rec.Duration = time.Duration(res.DurationMS) * time.Millisecond
				rec.Throughput, rec.Verified = res.ThroughputBytesPerS, res.Verified
				rec.RPO = time.Duration(res.RPOMS) * time.Millisecond
				if res.Sample {
					// What was read and verified: the duration is the sample's.
					rec.Sample, rec.Bytes, rec.Files = true, res.SampleBytes, res.SampleFiles
					a.log.Info("restore drill of a sample", "task", st.Task, "checkpoint", res.Checkpoint, "sample", true,
						"sample_files", res.SampleFiles, "sample_bytes", res.SampleBytes, "files", res.Files, "bytes", res.Bytes, "seed", res.SampleSeed,
						"duration_ms", res.DurationMS, "throughput_bytes_per_s", int64(res.ThroughputBytesPerS), "verified", res.Verified)
				} else {
					a.log.Info("restore drill", "task", st.Task, "checkpoint", res.Checkpoint, "bytes", res.Bytes,
						"duration_ms", res.DurationMS, "rpo_ms", res.RPOMS, "throughput_bytes_per_s", int64(res.ThroughputBytesPerS), "verified", res.Verified)
				}
			}
			a.cfg.Telemetry.DrillEnded(ctx, rec)
		}
	}
}

// ReadyCheck reports nil when the agent's socket serves: it is open and
// accepts connections, and the agent is not shutting down. Storage is not
// asked (see StorageCheck): a storage outage must not make the app, whose
// readiness a native sidecar's is part of, unready; checkpoints answer
// unavailable meanwhile.
func (a *Agent) ReadyCheck(ctx context.Context) error {
	a.mu.Lock()
	listening, draining, acceptErr := a.listening, a.draining, a.acceptErr
	a.mu.Unlock()
	switch {
	case draining:
		return errors.New("shutting down")
	case !listening:
		return errors.New("socket not open yet")
	case acceptErr != nil:
		return fmt.Errorf("cannot accept connections: %w", acceptErr)
	}
	return nil
}

// recoverLocal tidies the local store after a restart: attempts that were
// in flight when the previous agent stopped are removed.
func (a *Agent) recoverLocal() error {
	entries, err := os.ReadDir(a.local.Root())
	if err != nil {
		return fmt.Errorf("local store: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() && manifests.ValidName("task", e.Name()) == nil {
			l, err := a.local.Recover(e.Name())
			if err != nil {
				return err
			}
			if l != nil { // known without the network: refuse stale numbers at once
				a.taskLocked(e.Name())
				a.txn.Recovered(e.Name(), l)
			}
		}
	}
	return nil
}

// resolveDir applies confinement: dir must resolve inside an allowed root,
// and is opened there, once (invariant 10). Symlinks in dir are resolved
// once, for the check; the resolved path is then opened below its root's
// fd, component by component, through no symlink (safefs.Beneath), so a
// component swapped after the check fails the open instead of leading
// outside. The caller works through the returned handle only and closes it.
func (a *Agent) resolveDir(dir string) (*safefs.Dir, *protocol.Error) {
	if !filepath.IsAbs(dir) {
		return nil, errorf(protocol.CodeBadRequest, "dir %s is not an absolute path", dir)
	}
	outside := protocol.CodeBadRequest
	if a.tenant != nil {
		// A tenant's peer is refused by name first: a path plainly outside
		// its roots is not even looked up.
		outside = protocol.CodeForbidden
		if !a.lexicallyInside(dir) {
			return nil, errorf(outside, "dir %s is outside the allowed roots of tenant %s", dir, a.tenant.Name)
		}
	}
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, errorf(protocol.CodeBadRequest, "dir %s: %v", dir, err)
	}
	for _, r := range a.roots {
		rel, err := filepath.Rel(r.path, resolved)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			continue
		}
		d, err := safefs.Beneath(r.f, r.path, rel)
		switch {
		case errors.Is(err, safefs.ErrUnsafe):
			return nil, errorf(protocol.CodeBadRequest, "dir %s is not a directory, or a component of it is a symlink or was swapped for one while it was opened: %v", dir, err)
		case err != nil:
			return nil, errorf(protocol.CodeBadRequest, "dir %s: %v", dir, err)
		}
		return d, nil
	}
	return nil, errorf(outside, "dir %s resolves to %s, outside the allowed roots (--allow-root)", dir, resolved)
}

// root is an allowed root, opened once when the agent starts.
type root struct {
	path string
	f    *os.File
}

// openRoots opens the allowed roots (Config.defaults requires at least
// one and resolves them). They stay open for the agent's life: every
// request dir is opened relative to them.
func openRoots(paths []string) ([]root, error) {
	roots := make([]root, 0, len(paths))
	for _, p := range paths {
		f, err := safefs.OpenRoot(p)
		if err != nil {
			for _, r := range roots {
				r.f.Close()
			}
			return nil, fmt.Errorf("allow root %q: %w", p, err)
		}
		roots = append(roots, root{path: p, f: f})
	}
	return roots, nil
}

func (a *Agent) handle(ctx context.Context, c *conn, req protocol.Request) {
	if e := a.permit(req); e != nil {
		c.send(refused(req, e))
		return
	}
	switch req.Op {
	case protocol.OpHello:
		c.send(protocol.Event{Event: "hello", ID: req.ID, Protocol: protocol.ProtocolVersion, Version: a.cfg.Version})
	case protocol.OpStatus:
		c.send(protocol.Event{Event: "status", ID: req.ID, Tasks: a.status(req.Task)})
	case protocol.OpCheckpoint:
		if a.walRequest(c, req) {
			a.checkpoint(c, req)
		}
	case protocol.OpAbort:
		a.abort(c, req)
	case protocol.OpRestore:
		a.restore(ctx, c, req)
	case protocol.OpFollow:
		a.follow(c, req)
	default: // DecodeRequest lets no other op through
		c.send(protocol.Event{Event: "error", ID: req.ID, Error: errorf(protocol.CodeInternal, "op %q has no handler", req.Op)})
	}
}

func (a *Agent) status(only string) []protocol.TaskStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []protocol.TaskStatus{}
	for name, t := range a.tasks {
		if only != "" && name != only {
			continue
		}
		st := a.txn.Status(name)
		out = append(out, protocol.TaskStatus{
			Task: name, LastCompleted: st.LastCompleted,
			LastCheckpointSize: st.LastSize, LastFullSize: st.LastFull,
			InFlight: len(t.inflight), Problems: st.Problems,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Task < out[j].Task })
	return out
}

func (a *Agent) restore(ctx context.Context, c *conn, req protocol.Request) {
	if a.cfg.Restore == nil {
		c.send(protocol.Event{Event: "error", ID: req.ID, Task: req.Task, Error: errorf(protocol.CodeUnavailable, "this agent does not serve restores")})
		return
	}
	// The target is confined like a checkpoint dir: it need not exist, but
	// its parent must resolve inside an allowed root, and is opened there
	// once: the restore creates and places the target relative to that fd.
	clean := filepath.Clean(req.Target)
	parent, perr := a.resolveDir(filepath.Dir(clean))
	if perr != nil {
		c.send(protocol.Event{Event: "failed", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint, Error: perr})
		return
	}
	base := filepath.Base(clean)
	var st unix.Stat_t
	if clean == "/" || unix.Fstatat(parent.Fd(), base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		parent.Close()
		c.send(protocol.Event{Event: "failed", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint,
			Error: errorf(protocol.CodeBadRequest, "target %s is a symlink", req.Target)})
		return
	}
	target := filepath.Join(parent.Path(), base)
	a.jobs.Add(1)
	go func() {
		defer a.jobs.Done()
		defer parent.Close()
		fail := func(err error) {
			code := protocol.CodeInternal
			var pe *protocol.Error
			switch {
			case errors.As(err, &pe):
				code = pe.Code
			case errors.Is(err, restore.ErrNoCheckpoint):
				code = protocol.CodeNotFound
			case errors.Is(err, restore.ErrTargetNotEmpty):
				code = protocol.CodeConflict
			case diskFull(err), retry.Transient(err):
				code = protocol.CodeUnavailable // free space, or wait for storage, then retry: nothing was placed
			}
			c.send(protocol.Event{Event: "failed", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint, Error: &protocol.Error{Code: code, Message: err.Error()}})
		}
		// Only a checkpoint in storage makes a task: a restore of a task
		// that has none takes no ownership, and so writes nothing to
		// storage and adds no task to the status page or the metrics.
		if _, err := restore.Pick(ctx, restore.Options{Store: a.cfg.Store, Job: a.cfg.Job, Task: req.Task,
			Checkpoint: req.Checkpoint, JobConsistent: req.JobConsistent}); err != nil {
			fail(err)
			return
		}
		// A restore is the first thing a task's new home does: it takes the
		// task's ownership (or, if this agent holds it, checks it still
		// does; if a newer owner fenced it, it takes the task back).
		a.mu.Lock()
		a.taskLocked(req.Task)
		a.mu.Unlock()
		resumed, err := restore.ResumePoint(ctx, restore.Options{Store: a.cfg.Store, Job: a.cfg.Job, Task: req.Task,
			Checkpoint: req.Checkpoint, JobConsistent: req.JobConsistent, To: req.To})
		if err != nil {
			fail(err)
			return
		}
		if _, err := a.txn.OwnForRestore(ctx, req.Task, resumed); err != nil {
			c.send(protocol.Event{Event: "failed", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint, Error: ownError(req, err)})
			return
		}
		res, err := a.cfg.Restore(ctx, RestoreRequest{Task: req.Task, Checkpoint: req.Checkpoint, JobConsistent: req.JobConsistent, To: req.To,
			Target: target, Parent: parent.File()})
		if err != nil {
			fail(err)
			return
		}
		if a.tenant != nil && res != nil && res.Restored {
			if err := giveTo(parent.File(), base, c.peer()); err != nil {
				c.send(protocol.Event{Event: "failed", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint,
					Error: errorf(protocol.CodeInternal, "restored %s, but could not give it to uid %d gid %d: %v (chown it, or remove it and restore again)", target, c.peer().UID, c.peer().GID, err)})
				return
			}
		}
		c.send(protocol.Event{Event: "restored", ID: req.ID, Restored: restored(res)})
	}()
}
