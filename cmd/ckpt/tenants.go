package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/statuspage"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/ratelimit"
	"github.com/ckpt-io/ckpt/telemetry"
)

// sidecarOnly are the agent flags that a tenants file replaces: each tenant
// names its storage, job and roots, and its credentials decide who
// connects; standby copies follow tasks of one job.
var sidecarOnly = []string{"storage", "job", "allow-root", "allow-uid", "allow-gid", "standby-for"}

// checkTenantFlags refuses, with --tenants, the flags the tenants file
// replaces, however they were given (command line, CKPT_<FLAG>, --config).
func checkTenantFlags(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range sidecarOnly {
		if set[name] {
			return usageError{fmt.Errorf("--%s cannot be combined with --tenants: the tenants file names each tenant's storage, job, allow_roots and credentials", name)}
		}
	}
	return nil
}

// runNodeAgent is `ckpt agent --tenants FILE`: one agent serving the
// tenants of the file on one socket, with the other agent settings of o
// (already checked) shared by all of them.
func runNodeAgent(ctx context.Context, o *agentOptions, ckptTimeout, idle time.Duration, log *slog.Logger) error {
	tenants, err := agent.LoadTenants(o.tenants)
	if err != nil {
		return usageError{err}
	}
	// The node's telemetry counts what no tenant owns (connections refused
	// at accept); each tenant records under its job (ForJob).
	var names []string
	for _, t := range tenants {
		names = append(names, t.Name)
	}
	tel, err := telemetry.New(ctx, telemetry.Options{Storage: "tenants " + strings.Join(names, ", "), Version: version})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())

	// One store per distinct storage URL, shared by its tenants, with its
	// own --upload-rate limit.
	type opened struct{ base, up, drill storage.Store }
	stores := map[string]opened{}
	defer func() {
		for _, s := range stores {
			s.base.Close()
		}
	}()
	var openErr error // a store that cannot be opened: exit 1, not bad usage
	cfg := agent.Config{
		Socket: o.socket, Node: o.node, LocalDir: o.localDir, Telemetry: tel, Tenants: tenants,
		MaxConnections: o.maxConns, IdleTimeout: idle,
		Retain: o.retain, GCGrace: o.grace, GCInterval: o.gcInterval, ReuseCheckMaxAge: o.reuseMaxAge, ScrubRate: o.scrubRate,
		UploadConcurrency: o.conc, MaxConcurrent: o.maxConc, MaxQueued: o.maxQueued, ManifestFormat: o.manifestFormat,
		ShutdownGrace: o.shutdown, CommitPatience: o.patience, CheckpointTimeout: ckptTimeout, Version: version, Logger: log,
		WALInterval: o.walIntervalCfg(), WALSegmentBytes: o.walSegmentBytes,
		DrillInterval: o.drillEvery,
	}
	cfg.TenantServices = func(t agent.Tenant, tenantDir string) (agent.TenantServices, error) {
		s, ok := stores[t.Storage]
		if !ok {
			if o.createStorage {
				if err := createFileStorage(t.Storage); err != nil {
					return agent.TenantServices{}, err
				}
			}
			// As in sidecar mode: a tenant's storage that does not answer
			// is an outage of that tenant alone (its checkpoints answer
			// unavailable until it answers); a URL ckpt cannot use stops
			// the agent.
			base, err := openAgentStore(ctx, t.Storage, log.With("tenant", t.Name))
			if err != nil {
				openErr = fmt.Errorf("tenant %q: %w", t.Name, err)
				return agent.TenantServices{}, err
			}
			s = opened{base: base, up: ratelimit.New(base, ratelimit.Limits{Upload: o.uploadRate}),
				drill: ratelimit.New(base, ratelimit.Limits{Download: o.drillRate})}
			stores[t.Storage] = s
		}
		jtel := tel.ForJob(t.Job, t.Storage)
		svc := agent.TenantServices{Store: s.up, Telemetry: jtel}
		job := t.Job
		svc.Restore = func(ctx context.Context, r agent.RestoreRequest) (*restore.Result, error) {
			res, err := restore.Run(ctx, restore.Options{Store: s.up, Job: job, Task: r.Task, Checkpoint: r.Checkpoint,
				JobConsistent: r.JobConsistent, To: restore.DefaultTo(r.To, r.Checkpoint, r.JobConsistent), Target: r.Target, TargetParent: r.Parent, LocalDir: tenantDir})
			recordRestore(ctx, jtel, r.Task, res, err)
			return res, err
		}
		if o.drillEvery > 0 {
			svc.Drill = func(ctx context.Context, task string) (*restore.DrillResult, error) {
				return restore.Drill(ctx, restore.DrillOptions{Store: s.drill, Job: job, Task: task, ScratchDir: o.scratch, Check: engines.Check,
					SampleBytes: o.drillSampleBytes})
			}
		}
		return svc, nil
	}
	a, err := agent.New(cfg)
	if openErr != nil {
		return openErr
	}
	if err != nil {
		return usageError{err}
	}
	if o.metricsAddr != "" {
		bound, _, err := tel.Serve(ctx, o.metricsAddr, telemetry.ServerOptions{Ready: a.ReadyCheck, Pprof: o.pprof, Page: statuspage.Render, Logger: log})
		if err != nil {
			return err
		}
		log.Info("metrics and status page", "url", "http://"+bound.String()+"/")
	}
	return a.Run(ctx)
}
