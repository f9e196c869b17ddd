package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ckpt-io/ckpt/client"
)

func trigger(ctx context.Context, socket, task string, n uint64, dir, engine string, asJSON bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return usageError{err}
	}
	c, err := client.Dial(ctx, socket)
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
