package main

import (
	"context"
	"fmt"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/restore"
)

func runDrill(ctx context.Context, args []string) error {
	if hasFlag(args, "rescale-from") {
		return runRescaleDrill(ctx, args)
	}
	fs := newFlags("drill", "--storage URL --job NAME [--task T] [--engine E] [--sample-bytes N [--seed S]] [--json]",
		"ckpt drill --storage s3://bucket/ckpt --job orders --task orders-3 --engine rocksdb --plugin-dir /usr/lib/ckpt/plugins --json   (without --task: every task of the newest job-complete checkpoint, in parallel)")
	store := fs.String("storage", "", "storage URL")
	job := fs.String("job", "", "job name")
	task := fs.String("task", "", "task name (none: drill every task of the job's newest job-complete checkpoint at once, the job's recovery time)")
	scratch := fs.String("scratch", "", "directory for the scratch restore (default: the system temp dir)")
	par := fs.Int("parallelism", 8, "files restored at once")
	noCheck := fs.Bool("no-engine-check", false, "do not open the restored store with its engine")
	engine := fs.String("engine", "", "check the restored store with this engine (pebble, rocksdb, or one a plugin serves) instead of the one its manifest names")
	sampleBytes := fs.Int64("sample-bytes", 0, "drill a sample: read files of the checkpoint picked at random until this many bytes (plus at most one file) from storage and check each against the manifest, restoring nothing (0: restore the whole checkpoint)")
	seed := fs.Uint64("seed", 0, "with --sample-bytes: seed of the random pick, to repeat a sample (0: a random seed, reported)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parse(fs, args, "storage", "job"); err != nil {
		return err
	}
	if *sampleBytes < 0 {
		return usageError{fmt.Errorf("--sample-bytes must not be negative (0: drill the whole checkpoint)")}
	}
	if *sampleBytes > 0 && (*task == "" || *engine != "") {
		return usageError{fmt.Errorf("--sample-bytes drills a sample of one task's files and opens no engine: give --task, and no --engine")}
	}
	if *seed != 0 && *sampleBytes == 0 {
		return usageError{fmt.Errorf("--seed seeds the pick of a sample: give --sample-bytes too")}
	}
	if err := validNames(*job, *task); err != nil {
		return err
	}
	if *noCheck && *engine != "" {
		return usageError{fmt.Errorf("--engine names the engine that checks the store: do not give --no-engine-check too")}
	}
	st, err := openStore(ctx, *store) // also starts the plugins, engines among them
	if err != nil {
		return err
	}
	defer st.Close()
	check, err := drillCheck(*engine, *noCheck)
	if err != nil {
		return err
	}
	if *task == "" {
		return jobDrill(ctx, restore.JobDrillOptions{Store: st, Job: *job, ScratchDir: *scratch, Parallelism: *par, Check: check}, *asJSON)
	}
	o := restore.DrillOptions{Store: st, Job: *job, Task: *task, ScratchDir: *scratch, Parallelism: *par, Check: check,
		SampleBytes: *sampleBytes, SampleSeed: *seed}
	bar := newProgress(!*asJSON, "drill")
	o.Progress = bar.update
	res, err := restore.Drill(ctx, o)
	bar.done()
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(res)
	}
	if res.Sample {
		fmt.Printf("sample drill of %s checkpoint %d: %d of %d files, %s of %s, read from storage and verified in %d ms (%s/s), seed %d; nothing restored, the store not opened\n",
			res.Task, res.Checkpoint, res.SampleFiles, res.Files, human.Bytes(res.SampleBytes), human.Bytes(res.Bytes), res.DurationMS,
			human.Bytes(int64(res.ThroughputBytesPerS)), res.SampleSeed)
		return nil
	}
	fmt.Printf("drill of %s checkpoint %d: %d files, %s restored from storage and verified in %d ms (%s/s)",
		res.Task, res.Checkpoint, res.Files, human.Bytes(res.Bytes), res.DurationMS, human.Bytes(int64(res.ThroughputBytesPerS)))
	fmt.Printf("; recovery point %d ms (%d WAL segments, %s, over the checkpoint)", res.RPOMS, res.WALSegments, human.Bytes(res.WALBytes))
	switch {
	case res.EngineChecked:
		fmt.Printf("; the store opens, %d keys", res.Keys)
	case !*noCheck:
		fmt.Printf("; not opened: the checkpoint names no engine that can open stores here (made without --engine or \"engine\"?); give --engine to check it")
	}
	fmt.Println()
	return nil
}

// drillCheck returns how a drill checks the store it restored: with the
// engine its manifest names, with the engine --engine names (an unknown
// name is a usage error), or not at all.
func drillCheck(engine string, noCheck bool) (func(ctx context.Context, engine, dir string) (engines.Result, error), error) {
	if noCheck {
		return nil, nil
	}
	if engine == "" {
		return engines.Check, nil
	}
	e, err := engines.Lookup(engine)
	if err != nil {
		return nil, usageError{fmt.Errorf("--engine: %w (an engine plugin is found with --plugin-dir)", err)}
	}
	return func(ctx context.Context, _ string, dir string) (engines.Result, error) {
		r, err := e.Check(ctx, dir)
		if err == nil && !r.Checked {
			// Asked to check, it must: a built-in name without its plugin
			// (rocksdb) opens nothing.
			return r, fmt.Errorf("engine %s cannot open stores in this process: its plugin (ckpt-plugin-%s) is not in --plugin-dir", engine, engine)
		}
		return r, err
	}, nil
}

// jobDrill is `ckpt drill` without --task: every task of the newest
// job-complete checkpoint, restored at once.
func jobDrill(ctx context.Context, o restore.JobDrillOptions, asJSON bool) error {
	res, err := restore.JobDrill(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(res)
	}
	for _, d := range res.TaskDrills {
		fmt.Printf("  %s checkpoint %d: %d files, %s in %d ms\n", d.Task, d.Checkpoint, d.Files, human.Bytes(d.Bytes), d.DurationMS)
	}
	fmt.Printf("drill of job %s checkpoint %d: %d tasks, %d files, %s restored from storage in parallel and verified in %d ms (the job's recovery time)\n",
		o.Job, res.Checkpoint, res.Tasks, res.Files, human.Bytes(res.Bytes), res.DurationMS)
	return nil
}
