package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckpt-io/ckpt/savepoint"
	"github.com/ckpt-io/ckpt/storage"
)

func runSavepoint(ctx context.Context, args []string) error {
	fs := newFlags("savepoint", "--storage URL --job J --task T [--checkpoint N | --job-consistent] [--with-wal] --to URL2 [--overwrite] [--json]",
		"ckpt savepoint --storage s3://bucket/ckpt --job orders --task orders-3 --to gs://archive/orders-before-upgrade --json")
	store := fs.String("storage", "", "the job's storage URL (only read)")
	job := fs.String("job", "", "job name")
	task := fs.String("task", "", "task name")
	n := fs.Uint64("checkpoint", 0, "checkpoint to save (default: the newest complete one)")
	jobConsistent := fs.Bool("job-consistent", false, "save every task of the task's newest job-complete checkpoint (not with --checkpoint)")
	to := fs.String("to", "", "the savepoint's storage URL: a prefix, bucket or backend apart from the job's, never touched by its retention or GC")
	overwrite := fs.Bool("overwrite", false, "replace a savepoint already at --to")
	conc := fs.Int("concurrency", 8, "objects copied at once")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	withWAL := fs.Bool("with-wal", false, "also save the write-ahead log shipped after the checkpoint: a restore of the savepoint goes to its newest write (not with --job-consistent)")
	if err := parse(fs, args, "storage", "job", "task", "to"); err != nil {
		return err
	}
	if *jobConsistent && *n != 0 {
		return usageError{errors.New("--job-consistent picks the checkpoint: do not give --checkpoint too")}
	}
	if *conc < 1 {
		return usageError{fmt.Errorf("--concurrency must be at least 1")}
	}
	if err := validNames(*job, *task); err != nil {
		return err
	}
	src, err := openStore(ctx, *store)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := savepoint.CheckApart(storage.LocationOf(src), *to); err != nil {
		return usageError{err}
	}
	dst, err := openStore(ctx, *to)
	if err != nil {
		return err
	}
	defer dst.Close()
	res, err := savepoint.Create(ctx, savepoint.Options{Source: src, Job: *job, Task: *task, Checkpoint: *n,
		JobConsistent: *jobConsistent, Target: dst, Overwrite: *overwrite, Concurrency: *conc, WithWAL: *withWAL})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(res)
	}
	fmt.Printf("savepoint of %s checkpoint %d (%d tasks, %d files, %d B) written to %s in %d ms: %d objects, %d copied server-side, %d already there\n",
		res.Job, res.Checkpoint, res.Tasks, res.Files, res.Bytes, res.Savepoint, res.DurationMS, res.Objects, res.CopiedServerSide, res.Reused)
	return nil
}
