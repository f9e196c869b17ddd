package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/statuspage"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/ratelimit"
	"github.com/ckpt-io/ckpt/telemetry"
)

// sidecarOnly are the agent flags that a tenants file replaces: each tenant
// names its storage, job and roots, and its credentials decide who connects.
var sidecarOnly = []string{"storage", "job", "allow-root", "allow-uid", "allow-gid", "standby-for"}

// runNodeAgent is `ckpt agent --tenants FILE`: one agent serving the
// tenants of the file on one socket. It takes every other agent flag from
// fs, already parsed (command line, environment, --config).
func runNodeAgent(ctx context.Context, fs *flag.FlagSet, file string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range sidecarOnly {
		if set[name] {
			return usageError{fmt.Errorf("--%s cannot be combined with --tenants: the tenants file names each tenant's storage, job, allow_roots and credentials", name)}
		}
	}
	if err := checkArgs(fs, "socket", "local-dir"); err != nil {
		return err
	}
	tenants, err := agent.LoadTenants(file)
	if err != nil {
		return usageError{err}
	}
	get := func(name string) any { return fs.Lookup(name).Value.(flag.Getter).Get() }
	dur := func(name string) time.Duration { return get(name).(time.Duration) }
	num := func(name string) int { return get(name).(int) }
	i64 := func(name string) int64 { return get(name).(int64) }
	str := func(name string) string { return get(name).(string) }

	if num("max-connections") < 1 {
		return usageError{fmt.Errorf("--max-connections must be at least 1, got %d", num("max-connections"))}
	}
	ckptTimeout := dur("checkpoint-timeout")
	if ckptTimeout < 0 {
		return usageError{errors.New("--checkpoint-timeout must not be negative (0: none)")}
	}
	if ckptTimeout == 0 {
		ckptTimeout = -1 // none
	}
	idle := dur("idle-timeout")
	if idle < 0 {
		return usageError{errors.New("--idle-timeout must not be negative (0: never)")}
	}
	if idle == 0 {
		idle = -1
	}
	log, err := newLogger(str("log-level"))
	if err != nil {
		return err
	}
	if err := checkRetain(fs); err != nil {
		return err
	}
	if err := manifests.CheckGCGrace("--gc-grace", dur("gc-grace")); err != nil {
		return usageError{err}
	}
	if dur("gc-interval") == 0 {
		return usageError{errors.New("--gc-interval 0s: give the least time between two GC sweeps, or a negative value to disable sweeps")}
	}
	warnLoweredGraceFloor()
	if i64("upload-rate") < 0 || i64("drill-rate") < 0 || i64("scrub-rate") < 0 {
		return usageError{errors.New("--upload-rate, --drill-rate and --scrub-rate must not be negative")}
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
	localDir, scratch := str("local-dir"), str("drill-dir")
	limits := ratelimit.Limits{Upload: i64("upload-rate")}
	var openErr error // a store that cannot be opened: exit 1, not bad usage
	cfg := agent.Config{
		Socket: str("socket"), Node: str("node"), LocalDir: localDir, Telemetry: tel, Tenants: tenants,
		MaxConnections: num("max-connections"), IdleTimeout: idle,
		Retain: num("retain"), GCGrace: dur("gc-grace"), GCInterval: dur("gc-interval"), ReuseCheckMaxAge: dur("reuse-check-max-age"), ScrubRate: i64("scrub-rate"),
		UploadConcurrency: num("upload-concurrency"), MaxConcurrent: num("max-concurrent"), MaxQueued: num("max-queued"),
		ShutdownGrace: dur("shutdown-grace"), CommitPatience: dur("commit-patience"), CheckpointTimeout: ckptTimeout, Version: version, Logger: log,
		DrillInterval: dur("drill-interval"),
	}
	cfg.TenantServices = func(t agent.Tenant, tenantDir string) (agent.TenantServices, error) {
		s, ok := stores[t.Storage]
		if !ok {
			if get("create-storage").(bool) {
				if err := createFileStorage(t.Storage); err != nil {
					return agent.TenantServices{}, err
				}
			}
			base, err := openStore(ctx, t.Storage)
			if err != nil {
				openErr = fmt.Errorf("tenant %q: %w", t.Name, err)
				return agent.TenantServices{}, err
			}
			s = opened{base: base, up: ratelimit.New(base, limits), drill: ratelimit.New(base, ratelimit.Limits{Download: i64("drill-rate")})}
			stores[t.Storage] = s
		}
		jtel := tel.ForJob(t.Job, t.Storage)
		svc := agent.TenantServices{Store: s.up, Telemetry: jtel}
		job := t.Job
		svc.Restore = func(ctx context.Context, r agent.RestoreRequest) (*restore.Result, error) {
			res, err := restore.Run(ctx, restore.Options{Store: s.up, Job: job, Task: r.Task, Checkpoint: r.Checkpoint,
				JobConsistent: r.JobConsistent, Target: r.Target, TargetParent: r.Parent, LocalDir: tenantDir})
			recordRestore(ctx, jtel, r.Task, res, err)
			return res, err
		}
		if dur("drill-interval") > 0 {
			svc.Drill = func(ctx context.Context, task string) (*restore.DrillResult, error) {
				return restore.Drill(ctx, restore.DrillOptions{Store: s.drill, Job: job, Task: task, ScratchDir: scratch, Check: engines.Check})
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
	if addr := str("metrics-addr"); addr != "" {
		bound, _, err := tel.Serve(ctx, addr, telemetry.ServerOptions{Ready: a.ReadyCheck, Pprof: get("pprof").(bool), Page: statuspage.Render, Logger: log})
		if err != nil {
			return err
		}
		log.Info("metrics and status page", "url", "http://"+bound.String()+"/")
	}
	return a.Run(ctx)
}
