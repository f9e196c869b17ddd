package main

import (
	"context"
	"fmt"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/restore"
)

func runDrill(ctx context.Context, args []string) error {
	fs := newFlags("drill", "--storage URL --job NAME [--task T] [--json]",
		"ckpt drill --storage s3://bucket/ckpt --job orders --task orders-3 --json   (without --task: every task of the newest job-complete checkpoint, in parallel)")
	store := fs.String("storage", "", "storage URL")
	job := fs.String("job", "", "job name")
	task := fs.String("task", "", "task name (none: drill every task of the job's newest job-complete checkpoint at once, the job's recovery time)")
	scratch := fs.String("scratch", "", "directory for the scratch restore (default: the system temp dir)")
	par := fs.Int("parallelism", 8, "files restored at once")
	noCheck := fs.Bool("no-engine-check", false, "do not open the restored store with its engine")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parse(fs, args, "storage", "job"); err != nil {
		return err
	}
	if err := validNames(*job, *task); err != nil {
		return err
	}
	st, err := openStore(ctx, *store)
	if err != nil {
		return err
	}
	defer st.Close()
	if *task == "" {
		return jobDrill(ctx, restore.JobDrillOptions{Store: st, Job: *job, ScratchDir: *scratch, Parallelism: *par}, !*noCheck, *asJSON)
	}
	o := restore.DrillOptions{Store: st, Job: *job, Task: *task, ScratchDir: *scratch, Parallelism: *par}
	if !*noCheck {
		o.Check = engines.Check
	}
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
	fmt.Printf("drill of %s checkpoint %d: %d files, %s restored from storage and verified in %d ms (%s/s)",
		res.Task, res.Checkpoint, res.Files, human.Bytes(res.Bytes), res.DurationMS, human.Bytes(int64(res.ThroughputBytesPerS)))
	if res.EngineChecked {
		fmt.Printf("; the store opens, %d keys", res.Keys)
	}
	fmt.Println()
	return nil
}

// jobDrill is `ckpt drill` without --task: every task of the newest
// job-complete checkpoint, restored at once.
func jobDrill(ctx context.Context, o restore.JobDrillOptions, check, asJSON bool) error {
	if check {
		o.Check = engines.Check
	}
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
