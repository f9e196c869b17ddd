package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
)

func runRestore(ctx context.Context, args []string) error {
	fs := newFlags("restore", "--storage URL --job NAME --task T --target DIR [flags]",
		"ckpt restore --storage s3://bucket/ckpt --job orders --task orders-3 --target /data/orders-3 --local-dir /data/ckpt-local --if-not-exists --if-checkpoint-exists")
	store := fs.String("storage", "", "storage URL")
	job := fs.String("job", "", "job name")
	task := fs.String("task", "", "task name")
	target := fs.String("target", "", "directory to restore into (must be absent or empty)")
	n := fs.Uint64("checkpoint", 0, "checkpoint to restore (default: the newest complete one)")
	localDir := fs.String("local-dir", "", "the agent's local dir: take verified files from the local copy, and record the restore there")
	ifNotExists := fs.Bool("if-not-exists", false, "succeed and do nothing if the target already holds a store")
	ifCkpt := fs.Bool("if-checkpoint-exists", false, "succeed and do nothing if storage holds no checkpoint of the task")
	par := fs.Int("parallelism", 8, "files restored at once")
	verifyLocal := fs.String("verify-local", "sha256", "how to check local files: sha256 (hash every byte) or identity (trust a file that is still the inode its checkpoint completed with, unwritten since; faster, blind to disk corruption)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parse(fs, args, "storage", "job", "task", "target"); err != nil {
		return err
	}
	if *par < 1 {
		return usageError{fmt.Errorf("--parallelism must be at least 1")}
	}
	if *verifyLocal != "sha256" && *verifyLocal != "identity" {
		return usageError{fmt.Errorf("--verify-local must be sha256 or identity, got %q", *verifyLocal)}
	}
	st, err := openStore(ctx, *store)
	if err != nil {
		return err
	}
	defer st.Close()
	bar := newProgress(!*asJSON, "restore")
	res, err := restore.Run(ctx, restore.Options{
		Store: st, Job: *job, Task: *task, Target: *target, Checkpoint: *n, LocalDir: *localDir,
		IfNotExists: *ifNotExists, IfCheckpointExists: *ifCkpt, Parallelism: *par, Progress: bar.update,
		TrustUnchangedLocal: *verifyLocal == "identity",
	})
	bar.done()
	if err != nil {
		return err
	}
	defer res.Wait() // the local copy, re-created after a move
	if res.LocalRecordError != "" {
		fmt.Fprintf(os.Stderr, "warning: %s\n", res.LocalRecordError)
	}
	if *asJSON {
		return printJSON(res)
	}
	if !res.Restored {
		fmt.Printf("nothing restored: %s\n", res.Reason)
		return nil
	}
	fmt.Printf("restored %s checkpoint %d into %s: %d files, %d B (%d B local, %d B remote) in %d ms\n",
		res.Task, res.Checkpoint, res.Target, res.Files, res.Bytes, res.BytesLocal, res.BytesRemote, res.DurationMS)
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
	ms, problems, err := manifests.LoadRetained(ctx, st, *job, cat.Retained(*task))
	if err != nil {
		return err
	}
	// An unreadable manifest hides nothing else: it is a warning on stderr
	// (also with --json, whose stdout stays the array of readable ones).
	for _, p := range problems {
		fmt.Fprintf(os.Stderr, "warning: not listed: %s (ckpt verify fails on it; ckpt gc stops until it is fixed or removed)\n", p.Problem)
	}
	out := []listEntry{}
	for _, m := range ms {
		out = append(out, listEntry{m.Task, m.Checkpoint, m.Created, m.CheckpointSize, m.FullSize, len(m.Files), m.FilesUploaded, m.FilesReused})
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
	fmt.Fprintln(tw, "TASK\tCHECKPOINT\tCREATED\tCHECKPOINT SIZE\tFULL SIZE\tFILES\tUPLOADED\tREUSED")
	for _, e := range out {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n", e.Task, e.Checkpoint, e.Created.Format(time.RFC3339), e.CheckpointSize, e.FullSize, e.Files, e.FilesUploaded, e.FilesReused)
	}
	return tw.Flush()
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
	for _, r := range cat.Retained(*task) {
		if *n != 0 && r.Checkpoint != *n {
			continue
		}
		res.Checkpoints++
		m, err := manifests.Load(ctx, st, *job, r.Task, r.Checkpoint)
		if err != nil {
			res.Problems = append(res.Problems, manifests.Problem{Task: r.Task, Checkpoint: r.Checkpoint, Problem: err.Error()})
			continue
		}
		probs, b, err := manifests.Verify(ctx, st, m, *par)
		if err != nil {
			return err
		}
		for _, f := range m.Files {
			if f.Key != "" {
				res.Objects++
			}
		}
		res.Bytes += b
		res.Problems = append(res.Problems, probs...)
	}
	if *n != 0 && res.Checkpoints == 0 {
		return fmt.Errorf("checkpoint %d of task %s is not a complete retained checkpoint (see ckpt list)", *n, *task)
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
	grace := fs.Duration("grace", time.Hour, "age an unreferenced object (or a retirement) must reach before it is deleted (at least "+manifests.MinGCGrace.String()+")")
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
	if err := manifests.CheckGCGrace("--grace", *grace); err != nil {
		return usageError{err}
	}
	warnLoweredGraceFloor()
	st, err := openStore(ctx, *store)
	if err != nil {
		return err
	}
	defer st.Close()
	rep, err := manifests.GC(ctx, st, *job, manifests.GCOptions{Retain: *retain, Grace: *grace, DryRun: *dry})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(rep)
	}
	verb := "deleted"
	if *dry {
		verb = "would delete"
		for _, k := range rep.Deleted {
			fmt.Println(k)
		}
	}
	fmt.Printf("%s %d objects (%d B); live: %d objects (%d B) in %d retained checkpoints\n",
		verb, rep.DeletedObjects, rep.DeletedBytes, rep.LiveObjects, rep.LiveBytes, rep.RetainedCheckpoints)
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
	if floor, lowered, _ := manifests.GCGraceFloor(); lowered {
		fmt.Fprintf(os.Stderr, "warning: %s lowers the GC grace floor to %v; this is for tests only, and unsafe with uploads in flight\n",
			manifests.UnsafeMinGCGraceEnv, floor)
	}
}
