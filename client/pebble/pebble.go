// Package pebble checkpoints a Pebble store (github.com/cockroachdb/pebble)
// through a ckpt agent. It is apart from package client so that apps on
// other engines do not link Pebble.
package pebble

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/client"
)

// Engine is the engine name checkpoints of Pebble stores carry.
const Engine = "pebble"

// Checkpoint checkpoints an open Pebble DB through the agent c: it makes a
// Pebble checkpoint with a flushed WAL in a fresh directory next to the
// store (Snapshot; dbDir is the store's directory, so the SSTs are hard
// links on the same filesystem), hands it to the agent as checkpoint n of
// task, and removes the directory as soon as the agent answers synced; the
// directory is handed off, so the agent moves it in one rename rather than
// linking each file. The app waits for the Pebble checkpoint and that
// rename; the upload goes on in the agent, and Pending.Wait returns its
// outcome. An error event from the agent is returned as a *client.Error.
func Checkpoint(ctx context.Context, c *client.Client, db *pebble.DB, dbDir, task string, n uint64) (*client.Pending, error) {
	dir, err := Snapshot(db, dbDir, n)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir) // gone already when handed off; removed here when refused
	return c.Send(ctx, client.Request{Task: task, Checkpoint: n, Dir: dir, Engine: Engine, Handoff: true})
}

// Snapshot makes the Pebble checkpoint that Checkpoint hands off: one with
// a flushed WAL, in a fresh directory next to the store (dbDir), named for
// checkpoint n; a directory of that name left by a crash is removed first.
// It returns the directory, which the caller owns.
func Snapshot(db *pebble.DB, dbDir string, n uint64) (string, error) {
	dir := filepath.Join(filepath.Dir(filepath.Clean(dbDir)), fmt.Sprintf(".%s.ckpt-%d", filepath.Base(dbDir), n))
	if err := os.RemoveAll(dir); err != nil { // left by a crash of an earlier attempt
		return "", fmt.Errorf("pebble checkpoint dir: %w", err)
	}
	if err := db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return "", fmt.Errorf("pebble checkpoint %d: %w", n, err)
	}
	return dir, nil
}
