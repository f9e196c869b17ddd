package main

import (
	"context"
	"fmt"
	"os"

	"github.com/ckpt-io/ckpt/demo"
)

func runDemo(ctx context.Context, args []string) error {
	fs := newFlags("demo", "[--dir DIR] [--json] [--checkpoints N] [--state-bytes B]", "ckpt demo --json")
	dir := fs.String("dir", "", "keep everything the demo makes in this directory (absent or empty); default: a temporary directory, removed at the end")
	asJSON := fs.Bool("json", false, "print one JSON value with every checkpoint and restore")
	n := fs.Int("checkpoints", 10, "checkpoints to take (at least 8)")
	state := fs.Int64("state-bytes", 48<<20, "size of the keyed state")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *state < 1<<20 {
		return usageError{fmt.Errorf("--state-bytes must be at least 1 MiB")}
	}
	_, err := demo.Run(ctx, demo.Options{Dir: *dir, JSON: *asJSON, Out: os.Stdout, Checkpoints: *n, StateBytes: *state})
	return err
}
