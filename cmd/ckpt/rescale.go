package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/restore"
)

// hasFlag reports whether args set the flag name (as --name or -name,
// with or without =value).
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if !strings.HasPrefix(a, "-") {
			continue // a value, such as a task named rescale-from
		}
		a = strings.TrimLeft(a, "-")
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// rescaleFlags are the flags of a rescale restore, shared by restore and
// drill.
type rescaleFlags struct {
	store, job, from, keyRange, engine *string
	n                                  *uint64
	par                                *int
	partial                            *bool
}

func addRescaleFlags(fs interface {
	String(name, value, usage string) *string
	Uint64(name string, value uint64, usage string) *uint64
	Int(name string, value int, usage string) *int
	Bool(name string, value bool, usage string) *bool
}) rescaleFlags {
	return rescaleFlags{
		store:    fs.String("storage", "", "storage URL"),
		job:      fs.String("job", "", "job name"),
		from:     fs.String("rescale-from", "", "the old tasks whose stores hold the key range, comma-separated"),
		keyRange: fs.String("key-range", "", "START:END, hex bounds of the new task's keys [START, END); either may be empty for open"),
		engine:   fs.String("engine", "", "the stores' engine (only pebble can be rescaled)"),
		n:        fs.Uint64("checkpoint", 0, "checkpoint to read (default: the newest one job-complete for every old task)"),
		par:      fs.Int("parallelism", 8, "files fetched at once"),
		partial:  fs.Bool("partial", false, "build the store from the --rescale-from tasks even if other tasks of the checkpoint hold keys in the range (their keys are then missing); without it such a rescale fails, naming them"),
	}
}

// options checks the flags (usage errors) and returns the rescale request.
func (f rescaleFlags) options() (restore.RescaleOptions, error) {
	if e, err := engines.Lookup(*f.engine); err != nil || !isRescaler(e) {
		return restore.RescaleOptions{}, usageError{fmt.Errorf("--engine %q: only %s stores can be rescaled (give --engine %s)", *f.engine, rescalers(), rescalers())}
	}
	if *f.par < 1 {
		return restore.RescaleOptions{}, usageError{errors.New("--parallelism must be at least 1")}
	}
	start, end, err := restore.ParseKeyRange(*f.keyRange)
	if err != nil {
		return restore.RescaleOptions{}, usageError{fmt.Errorf("--key-range: %w", err)}
	}
	from := strings.Split(*f.from, ",")
	seen := map[string]bool{}
	for _, t := range from {
		if err := validNames(*f.job, t); err != nil {
			return restore.RescaleOptions{}, err
		}
		if seen[t] {
			return restore.RescaleOptions{}, usageError{fmt.Errorf("--rescale-from names task %s twice", t)}
		}
		seen[t] = true
	}
	return restore.RescaleOptions{Job: *f.job, From: from, Start: start, End: end, Engine: *f.engine,
		Checkpoint: *f.n, Parallelism: *f.par, Partial: *f.partial}, nil
}

// isRescaler reports whether e can rescale its stores.
func isRescaler(e engines.Engine) bool {
	_, ok := e.(engines.Rescaler)
	return ok
}

// rescalers names the engines of this build that can rescale (pebble).
func rescalers() string {
	var out []string
	for _, n := range engines.Default.Names() {
		if e, err := engines.Lookup(n); err == nil && isRescaler(e) {
			out = append(out, n)
		}
	}
	return strings.Join(out, ", ")
}

// runRescaleRestore is `ckpt restore --rescale-from`.
func runRescaleRestore(ctx context.Context, args []string) error {
	fs := newFlags("restore", "--rescale-from T1,T2,... --key-range START:END --engine pebble --storage URL --job NAME --target DIR [flags]",
		"ckpt restore --storage s3://bucket/ckpt --job orders --rescale-from orders-0,orders-1 --key-range 4000:8000 --engine pebble --target /data/orders-new-1 --json")
	f := addRescaleFlags(fs)
	target := fs.String("target", "", "directory to build the new store in (must be absent or empty)")
	task := fs.String("task", "", "the new task's name, reported in the result (optional)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parse(fs, args, "storage", "job", "rescale-from", "key-range", "engine", "target"); err != nil {
		return err
	}
	o, err := f.options()
	if err != nil {
		return err
	}
	if *task != "" {
		if err := validNames(*f.job, *task); err != nil {
			return err
		}
	}
	o.Target = *target
	st, err := openStore(ctx, *f.store)
	if err != nil {
		return err
	}
	defer st.Close()
	o.Store = st
	res, err := restore.Rescale(ctx, o)
	if err != nil {
		return err
	}
	res.Task = *task
	if *asJSON {
		return printJSON(res)
	}
	fmt.Printf("rescaled %s checkpoint %d into %s: %d keys in [%s, %s), %s fetched (%d files; %d outside the range not fetched), old tables' bytes in the range %s, verified, in %d ms\n",
		strings.Join(res.From, ","), res.Checkpoint, res.Target, res.Keys, bound(res.Start), bound(res.End), human.Bytes(res.Bytes),
		res.FilesFetched, res.FilesSkipped, human.Bytes(res.BytesInRange), res.DurationMS)
	return nil
}

// bound shows a hex bound of a key range; "" is open.
func bound(hex string) string {
	if hex == "" {
		return "open"
	}
	return hex
}

// runRescaleDrill is `ckpt drill --rescale-from`.
func runRescaleDrill(ctx context.Context, args []string) error {
	fs := newFlags("drill", "--rescale-from T1,T2,... --key-range START:END --engine pebble --storage URL --job NAME [--json]",
		"ckpt drill --storage s3://bucket/ckpt --job orders --rescale-from orders-0,orders-1 --key-range 4000:8000 --engine pebble --json")
	f := addRescaleFlags(fs)
	scratch := fs.String("scratch", "", "directory for the scratch restores (default: the system temp dir)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parse(fs, args, "storage", "job", "rescale-from", "key-range", "engine"); err != nil {
		return err
	}
	o, err := f.options()
	if err != nil {
		return err
	}
	st, err := openStore(ctx, *f.store)
	if err != nil {
		return err
	}
	defer st.Close()
	o.Store = st
	res, err := restore.RescaleDrill(ctx, o, *scratch)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(res)
	}
	fmt.Printf("rescale drill of %s checkpoint %d: %s fetched in %d ms, verified; plain restores of the same checkpoints: %s in %d ms\n",
		strings.Join(o.From, ","), res.Checkpoint, human.Bytes(res.Bytes), res.DurationMS, human.Bytes(res.PlainBytes), res.PlainDurationMS)
	if res.BytesInRange > 0 {
		fmt.Printf("  the old tables hold %s in the range: fetched %.2fx that; a plain restore of as much state takes %.0f ms, the rescale %.2fx that\n",
			human.Bytes(res.BytesInRange), res.BytesRatio, res.PlainSameStateMS, res.TimeRatio)
	} else {
		fmt.Println("  the old tables hold nothing in the range (its keys, if any, were in the WAL): no ratios")
	}
	return nil
}
