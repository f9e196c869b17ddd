package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/savepoint"
)

func runRestore(ctx context.Context, args []string) error {
	if hasFlag(args, "rescale-from") {
		return runRescaleRestore(ctx, args)
	}
	fs := newFlags("restore", "--storage URL --job NAME --task T --target DIR [flags]",
		"ckpt restore --storage s3://bucket/ckpt --job orders --task orders-3 --target /data/orders-3 --local-dir /data/ckpt-local --if-not-exists --if-checkpoint-exists")
	store := fs.String("storage", "", "storage URL")
	job := fs.String("job", "", "job name")
	task := fs.String("task", "", "task name")
	target := fs.String("target", "", "directory to restore into (must be absent or empty)")
	n := fs.Uint64("checkpoint", 0, "checkpoint to restore (default: the newest complete one)")
	jobConsistent := fs.Bool("job-consistent", false, "restore the newest job-complete checkpoint: the newest one every task of the job completed (not with --checkpoint)")
	to := fs.String("to", "", "latest: the checkpoint and the write-ahead log shipped after it (the default, except with --checkpoint N or --job-consistent); checkpoint: the checkpoint alone")
	localDir := fs.String("local-dir", "", "the agent's local dir: take verified files from the local copy, and record the restore there")
	ifNotExists := fs.Bool("if-not-exists", false, "succeed and do nothing if the target already holds a store")
	ifCkpt := fs.Bool("if-checkpoint-exists", false, "succeed and do nothing if storage holds no checkpoint of the task")
	par := fs.Int("parallelism", 8, "files restored at once")
	verifyLocal := fs.String("verify-local", "sha256", "how to check local files: sha256 (hash every byte) or identity (trust a file that is still the inode its checkpoint completed with, unwritten since; faster, blind to disk corruption)")
	fromSavepoint := fs.String("savepoint", "", "restore the savepoint at this storage URL (written by ckpt savepoint) instead of a job's checkpoint; with --storage and --job, that job (which must hold no checkpoint of the task) starts from it: its next checkpoint uploads only what changed")
	fs.String("rescale-from", "", "T1,T2,...: build a new task's Pebble store from these old tasks' job-complete checkpoints, keeping --key-range START:END (--engine pebble; see ckpt restore --rescale-from T --help)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	required := []string{"storage", "job", "task", "target"}
	if *fromSavepoint != "" {
		required = []string{"target"}
	}
	if err := checkArgs(fs, required...); err != nil {
		return err
	}
	if *par < 1 {
		return usageError{fmt.Errorf("--parallelism must be at least 1")}
	}
	if *jobConsistent && *n != 0 {
		return usageError{fmt.Errorf("--job-consistent picks the checkpoint: do not give --checkpoint too")}
	}
	for _, n := range []struct{ kind, name string }{{"job", *job}, {"task", *task}} {
		if n.name != "" {
			if err := manifests.ValidName(n.kind, n.name); err != nil {
				return usageError{err}
			}
		}
	}
	if *to != "" && *to != restore.ToLatest && *to != restore.ToCheckpoint {
		return usageError{fmt.Errorf("--to must be latest or checkpoint, got %q", *to)}
	}
	if *to == restore.ToLatest && *jobConsistent {
		return usageError{errors.New("--job-consistent restores the job-wide checkpoint: --to latest would extend one task past it")}
	}
	if *verifyLocal != "sha256" && *verifyLocal != "identity" {
		return usageError{fmt.Errorf("--verify-local must be sha256 or identity, got %q", *verifyLocal)}
	}
	if *ifNotExists && *fromSavepoint == "" {
		// A store already on the volume needs no storage: decided first.
		res, err := restore.SkipIfPresent(*job, *task, *target, *localDir)
		if err != nil {
			return err
		}
		if res != nil {
			return printRestore(res, *asJSON)
		}
	}
	if *fromSavepoint != "" {
		if *n != 0 || (*store == "") != (*job == "") {
			return usageError{errors.New("--savepoint names the checkpoint: do not give --checkpoint; give --storage and --job together (to start that job from the savepoint) or neither")}
		}
		sp, err := openStore(ctx, *fromSavepoint)
		if err != nil {
			return err
		}
		defer sp.Close()
		rec, err := savepoint.Read(ctx, sp)
		if err != nil {
			return err
		}
		e, err := rec.Entry(*task)
		if err != nil {
			return usageError{err}
		}
		if *jobConsistent && !rec.JobConsistent {
			return fmt.Errorf("--job-consistent: the savepoint at %s holds checkpoint %d of task %s alone, not a job-complete checkpoint of every task", sp, rec.Checkpoint, e.Task)
		}
		*task, *n, *jobConsistent = e.Task, rec.Checkpoint, false
		if *store == "" {
			*store, *job = *fromSavepoint, rec.Job
		} else {
			// Start the job from the savepoint: its checkpoint becomes the
			// task's first in the job, and the restore below is the job's.
			js, err := openStore(ctx, *store)
			if err != nil {
				return err
			}
			_, err = savepoint.Seed(ctx, savepoint.SeedOptions{Savepoint: sp, Task: e.Task, Target: js, Job: *job})
			js.Close()
			if err != nil {
				return err
			}
		}
	}
	st, err := openStore(ctx, *store)
	if err != nil {
		return err
	}
	defer st.Close()
	bar := newProgress(!*asJSON, "restore")
	res, err := restore.Run(ctx, restore.Options{
		Store: st, Job: *job, Task: *task, Target: *target, Checkpoint: *n, JobConsistent: *jobConsistent, LocalDir: *localDir,
		To:          restore.DefaultTo(*to, *n, *jobConsistent),
		IfNotExists: *ifNotExists, IfCheckpointExists: *ifCkpt, Parallelism: *par, Progress: bar.update,
		TrustUnchangedLocal: *verifyLocal == "identity",
	})
	bar.done()
	if err != nil {
		return err
	}
	defer res.Wait() // the local copy, re-created after a move
	return printRestore(res, *asJSON)
}

// printRestore prints a restore's result: JSON, or one line.
func printRestore(res *restore.Result, asJSON bool) error {
	if res.LocalRecordError != "" {
		fmt.Fprintf(os.Stderr, "warning: %s\n", res.LocalRecordError)
	}
	if asJSON {
		return printJSON(res)
	}
	if !res.Restored {
		fmt.Printf("nothing restored: %s\n", res.Reason)
		return nil
	}
	fmt.Printf("restored %s checkpoint %d into %s: %d files, %d B (%d B local, %d B remote) in %d ms\n",
		res.Task, res.Checkpoint, res.Target, res.Files, res.Bytes, res.BytesLocal, res.BytesRemote, res.DurationMS)
	if p := res.WALPosition; p != nil {
		fmt.Printf("write-ahead log: %d segments, %d B, to manifest %d (%s at %d); newest write recovered %d ms ago\n",
			res.WALSegments, res.WALBytes, p.Seq, p.Log, p.Offset, res.RecoveredWriteAgeMS)
	}
	if res.WALStopped != "" {
		fmt.Fprintf(os.Stderr, "note: the write-ahead log was not applied to its end: %s\n", res.WALStopped)
	}
	return nil
}

// listEntry is one row of `ckpt list --json`.
type listEntry struct {
	Task           string    `json:"task"`
	Checkpoint     uint64    `json:"checkpoint"`
	Created        time.Time `json:"created"`
	CheckpointSize int64     `json:"checkpoint_size"`
	FullSize       int64     `json:"full_size"`
	Files          int       `json:"files"`
	FilesUploaded  int       `json:"files_uploaded"`
	FilesReused    int       `json:"files_reused"`
	// JobComplete: the checkpoint lists its job's tasks and every one of
	// them has a complete checkpoint with that number and list.
	JobComplete bool `json:"job_complete"`
	// JobIncompleteReason says why a job-wide checkpoint is not complete.
	JobIncompleteReason string `json:"job_incomplete_reason,omitempty"`
	// Epoch is the ownership epoch of the agent that committed it (0:
	// before ownership existed). Fenced manifests are never listed.
	Epoch uint64 `json:"epoch"`
}

func runList(ctx context.Context, args []string) error {
	fs := newFlags("list", "--storage URL --job NAME [--task T] [--json]", "ckpt list --storage file:///var/lib/ckpt --job orders --json")
	store := fs.String("storage", "", "storage URL")
	job := fs.String("job", "", "job name")
	task := fs.String("task", "", "only this task")
	asJSON := fs.Bool("json", false, "print a JSON array, oldest first")
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
	cat, err := manifests.Scan(ctx, st, *job, *task)
	if err != nil {
		return err
	}
	if len(cat.Refs) == 0 {
		msg, err := nothingStored(ctx, st, *job, *task)
		if err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, msg)
	}
	// A listing keeps each manifest's totals: the file tables are walked
	// (and checked), never held.
	var ms []*manifests.Manifest
	files := map[*manifests.Manifest]int{}
	problems, err := manifests.EachRetainedHeader(ctx, st, *job, cat.Retained(*task), func(m *manifests.Manifest, n int) error {
		files[m] = n
		ms = append(ms, m)
		return nil
	})
	if err != nil {
		return err
	}
	// An unreadable manifest hides nothing else: it is a warning on stderr
	// (also with --json, whose stdout stays the array of readable ones).
	for _, p := range problems {
		fmt.Fprintf(os.Stderr, "warning: not listed: %s (ckpt verify fails on it; ckpt gc stops until it is fixed or removed)\n", p.Problem)
	}
	// Job completeness needs the other tasks' manifests: the whole job.
	jobCat := cat
	if *task != "" {
		if jobCat, err = manifests.Scan(ctx, st, *job, ""); err != nil {
			return err
		}
	}
	jobs := manifests.NewJobReader(st, jobCat)
	for _, m := range ms {
		jobs.Add(m)
	}
	out := []listEntry{}
	incomplete := map[uint64]string{}
	for _, m := range ms {
		e := listEntry{Task: m.Task, Checkpoint: m.Checkpoint, Created: m.Created, CheckpointSize: m.CheckpointSize,
			FullSize: m.FullSize, Files: files[m], FilesUploaded: m.FilesUploaded, FilesReused: m.FilesReused, Epoch: m.Epoch}
		if m.Tasks != nil {
			js, err := jobs.Status(ctx, m.Checkpoint)
			if err != nil {
				return err
			}
			e.JobComplete = js.Complete && js.Includes(m.Task)
			if !e.JobComplete {
				e.JobIncompleteReason = js.Reason
				if js.Reason == "" {
					e.JobIncompleteReason = fmt.Sprintf("task %s is not among the tasks of checkpoint %d", m.Task, m.Checkpoint)
				}
				incomplete[m.Checkpoint] = e.JobIncompleteReason
			}
		}
		out = append(out, e)
	}
	// Oldest first, across tasks.
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		if out[i].Task != out[j].Task {
			return out[i].Task < out[j].Task
		}
		return out[i].Checkpoint < out[j].Checkpoint
	})
	if *asJSON {
		return printJSON(out)
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tCHECKPOINT\tCREATED\tCHECKPOINT SIZE\tFULL SIZE\tFILES\tUPLOADED\tREUSED\tEPOCH\tJOB-COMPLETE")
	for _, e := range out {
		jc := "-"
		switch {
		case e.JobComplete:
			jc = "yes"
		case e.JobIncompleteReason != "":
			jc = "no"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", e.Task, e.Checkpoint, e.Created.Format(time.RFC3339), e.CheckpointSize, e.FullSize, e.Files, e.FilesUploaded, e.FilesReused, e.Epoch, jc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ns := make([]uint64, 0, len(incomplete))
	for n := range incomplete {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	for _, n := range ns {
		fmt.Printf("checkpoint %d is not job-complete: %s\n", n, incomplete[n])
	}
	return nil
}

func validNames(job, task string) error {
	if err := manifests.ValidName("job", job); err != nil {
		return usageError{err}
	}
	if task != "" {
		if err := manifests.ValidName("task", task); err != nil {
			return usageError{err}
		}
	}
	return nil
}

func runVerify(ctx context.Context, args []string) error {
	fs := newFlags("verify", "--storage URL --job NAME [--task T] [--checkpoint N] [--json]", "ckpt verify --storage file:///var/lib/ckpt --job orders --task orders-3")
	store := fs.String("storage", "", "storage URL")
	job := fs.String("job", "", "job name")
	task := fs.String("task", "", "only this task")
	n := fs.Uint64("checkpoint", 0, "only this checkpoint (needs --task)")
	par := fs.Int("parallelism", 8, "objects read at once")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parse(fs, args, "storage", "job"); err != nil {
		return err
	}
	if err := validNames(*job, *task); err != nil {
		return err
	}
	if *n != 0 && *task == "" {
		return usageError{fmt.Errorf("--checkpoint needs --task")}
	}
	st, err := openStore(ctx, *store)
	if err != nil {
		return err
	}
	defer st.Close()
	cat, err := manifests.Scan(ctx, st, *job, *task)
	if err != nil {
		return err
	}
	type result struct {
		Checkpoints int                 `json:"checkpoints"`
		Objects     int                 `json:"objects"`
		Bytes       int64               `json:"bytes"`
		OK          bool                `json:"ok"`
		Problems    []manifests.Problem `json:"problems"`
	}
	res := result{Problems: []manifests.Problem{}}
	// One manifest in memory at a time, as stored (walked, not decoded);
	// each object read once, whichever checkpoints share it.
	v := manifests.NewVerifier(st, *par)
	for _, r := range cat.Retained(*task) {
		if *n != 0 && r.Checkpoint != *n {
			continue
		}
		res.Checkpoints++
		probs, err := v.CheckRef(ctx, *job, r)
		if err != nil {
			return err
		}
		res.Problems = append(res.Problems, probs...)
	}
	res.Objects, res.Bytes = v.Objects, v.Bytes
	if *n != 0 && res.Checkpoints == 0 {
		return fmt.Errorf("checkpoint %d of task %s is not a complete retained checkpoint (see ckpt list)", *n, *task)
	}
	if res.Checkpoints == 0 && len(cat.Refs) == 0 {
		// Nothing verified is no success: a misspelled --job or --task.
		msg, err := nothingStored(ctx, st, *job, *task)
		if err != nil {
			return err
		}
		if *asJSON {
			printJSON(res) // "ok": false
		}
		return errors.New(msg)
	}
	res.OK = len(res.Problems) == 0
	if *asJSON {
		printJSON(res)
	} else {
		for _, p := range res.Problems {
			fmt.Fprintln(os.Stderr, "PROBLEM:", p)
		}
		fmt.Printf("verified %d checkpoints: %d objects, %d bytes read, %d problems\n", res.Checkpoints, res.Objects, res.Bytes, len(res.Problems))
	}
	if !res.OK {
		return errReported
	}
	return nil
}

func runGC(ctx context.Context, args []string) error {
	fs := newFlags("gc", "--storage URL --job NAME [--retain N] [--grace DURATION] [--dry-run] [--json]",
		"ckpt gc --storage s3://bucket/ckpt --job orders --retain 2 --grace 1h --dry-run")
	store := fs.String("storage", "", "storage URL")
	job := fs.String("job", "", "job name")
	retain := fs.Int("retain", 0, "first retire all but the newest N (at least 1) complete checkpoints of each task (not given: leave retention to the agents)")
	grace := fs.Duration("grace", time.Hour, "age an unreferenced object (or a retirement) must reach before it is deleted (at least "+gc.MinGrace.String()+")")
	dry := fs.Bool("dry-run", false, "report what would be deleted, change nothing")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parse(fs, args, "storage", "job"); err != nil {
		return err
	}
	if err := validNames(*job, ""); err != nil {
		return err
	}
	if err := checkRetain(fs); err != nil {
		return err
	}
	if err := gc.CheckGrace("--grace", *grace); err != nil {
		return usageError{err}
	}
	warnLoweredGraceFloor()
	st, err := openStore(ctx, *store)
	if err != nil {
		return err
	}
	defer st.Close()
	rep, err := gc.Collect(ctx, st, *job, gc.Options{Retain: *retain, Grace: *grace, DryRun: *dry})
	if err != nil {
		return err
	}
	if rep.RetainedCheckpoints == 0 {
		if cat, err := manifests.Scan(ctx, st, *job, ""); err == nil && len(cat.Refs) == 0 {
			if msg, err := nothingStored(ctx, st, *job, ""); err == nil {
				fmt.Fprintln(os.Stderr, msg)
			}
		}
	}
	if *asJSON {
		return printJSON(rep)
	}
	verb, marked := "deleted", "marked"
	if *dry {
		verb, marked = "would delete", "would mark"
		for _, k := range rep.Deleted {
			fmt.Println(k)
		}
		for _, k := range rep.Marked {
			fmt.Println("mark", k)
		}
	}
	fmt.Printf("%s %d objects (%d B); %s %d objects (%d B) for deletion by a collection at least %v later (%d marked earlier, pending); live: %d objects (%d B) in %d retained checkpoints\n",
		verb, rep.DeletedObjects, rep.DeletedBytes, marked, rep.MarkedObjects, rep.MarkedBytes, gc.MarkDelay(), rep.PendingObjects,
		rep.LiveObjects, rep.LiveBytes, rep.RetainedCheckpoints)
	return nil
}

// checkRetain refuses a --retain below 1 given on the command line (or by
// --config): a task always keeps its newest complete checkpoint, and a
// silent correction would hide the mistake.
func checkRetain(fs *flag.FlagSet) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "retain" {
			return
		}
		if n, _ := strconv.Atoi(f.Value.String()); n < 1 {
			err = usageError{fmt.Errorf("--retain %s: must be at least 1 (a task always keeps its newest complete checkpoint)", f.Value)}
		}
	})
	return err
}

// warnLoweredGraceFloor says on stderr when the test-only escape hatch has
// lowered the GC grace floor.
func warnLoweredGraceFloor() {
	if floor, lowered, _ := gc.GraceFloor(); lowered {
		fmt.Fprintf(os.Stderr, "warning: %s lowers the GC grace floor to %v; this is for tests only, and unsafe with uploads in flight\n",
			gc.UnsafeMinGraceEnv, floor)
	}
}
