package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/client"
)

func trigger(ctx context.Context, socket, task string, n uint64, dir, engine string, wait time.Duration, asJSON bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return usageError{err}
	}
	c, err := client.Dial(ctx, socket, client.WithDialWait(0))
	if err != nil && wait > 0 && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)) {
		// Say why nothing happens for a while: a mistyped --socket waits too.
		fmt.Fprintf(os.Stderr, "no agent listens on %s yet (%v); waiting up to %v for one (--wait)\n", socket, errors.Unwrap(err), wait)
		c, err = client.Dial(ctx, socket, client.WithDialWait(wait))
	}
	if err != nil {
		return err
	}
	defer c.Close()
	report := func(ev client.Event, err error) error {
		if asJSON && len(ev.Raw) > 0 {
			var v any
			if json.Unmarshal(ev.Raw, &v) == nil {
				printJSON(v)
			}
		}
		if err != nil {
			if asJSON {
				return errReported
			}
			return err
		}
		if !asJSON {
			fmt.Printf("checkpoint %d of %s completed: checkpoint size %d B, full size %d B, %d files uploaded, %d reused, %d ms\n",
				ev.Checkpoint, ev.Task, ev.CheckpointSize, ev.FullSize, ev.FilesUploaded, ev.FilesReused, ev.DurationMS)
		}
		return nil
	}
	p, err := c.Checkpoint(ctx, task, n, abs, engine)
	if err != nil {
		if ce, ok := err.(*client.Error); ok && asJSON {
			printJSON(map[string]any{"event": "failed", "task": task, "checkpoint": n, "error": ce})
			return errReported
		}
		return err
	}
	if !asJSON {
		fmt.Fprintf(os.Stderr, "synced in %d ms; uploading\n", p.Synced.SyncMS)
	}
	return report(p.Wait(ctx))
}
