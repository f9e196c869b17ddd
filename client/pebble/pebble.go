// Package pebble checkpoints a Pebble store (github.com/cockroachdb/pebble)
// through a ckpt agent. It is apart from package client so that apps on
// other engines do not link Pebble.
//
// Checkpoints are incremental only for what is in SSTs: a file the agent
// has shipped once is reused by every later checkpoint that still holds
// it. The WAL is a private file, shipped whole with every checkpoint. So
// Snapshot flushes the memtable first (as RocksDB's checkpoint does by
// default, and Flink relies on): the writes since the last checkpoint
// become a new SST, shipped once, and the WAL left in the snapshot is
// nearly empty. Without the flush every checkpoint carries the whole
// unflushed WAL (up to a few memtables' worth) and a restore replays it.
// WithoutFlush turns the flush off.
//
// Pebble also recycles WAL files: a new WAL is often an old file
// rewritten from its start, and Pebble's checkpoint copies the file whole,
// stale tail included (records of an older log, which replay skips). So
// even a flushed checkpoint would ship up to a memtable of dead bytes.
// Snapshot trims each WAL of the snapshot (a copy, never the store's own
// file) after its last valid record.
//
// Checkpoint also names the store's directory as the request's wal_dir:
// from the checkpoint's completion on, the agent ships the store's new
// WAL records every few seconds (its --wal-interval), so a restore can
// recover writes made after the checkpoint. WithoutWAL turns that off.
package pebble

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/record"

	"github.com/ckpt-io/ckpt/client"
)

// Engine is the engine name checkpoints of Pebble stores carry.
const Engine = "pebble"

// Option changes how Checkpoint and Snapshot make the Pebble checkpoint.
type Option func(*options)

type options struct {
	noFlush bool
	noWAL   bool
}

// WithoutFlush makes the Pebble checkpoint without flushing the memtable
// first. The app then waits less (no memtable written to an SST), but the
// snapshot's WAL holds every write not yet flushed, and it is uploaded
// whole with each checkpoint: checkpoints stop being incremental for
// those bytes. Use it only when the app flushes itself just before, or
// writes so little between checkpoints that the WAL stays small.
func WithoutFlush() Option { return func(o *options) { o.noFlush = true } }

// WithoutWAL makes Checkpoint name no wal_dir: the agent ships no WAL
// between checkpoints for this task (and stops shipping it once this
// checkpoint completes), so a restore recovers the checkpoint only.
func WithoutWAL() Option { return func(o *options) { o.noWAL = true } }

// Checkpoint checkpoints an open Pebble DB through the agent c: it makes a
// Pebble checkpoint (Snapshot: the memtable flushed, unless WithoutFlush,
// and a flushed WAL) in a fresh directory next to the store (dbDir is the
// store's directory, so the SSTs are hard links on the same filesystem),
// hands it to the agent as checkpoint n of task, and removes the directory
// as soon as the agent answers synced; the directory is handed off, so the
// agent moves it in one rename rather than linking each file. The app
// waits for the flush, the Pebble checkpoint and that rename; the upload
// goes on in the agent, and Pending.Wait returns its outcome. An error
// event from the agent is returned as a *client.Error. The request names
// dbDir as its wal_dir unless WithoutWAL is given.
func Checkpoint(ctx context.Context, c *client.Client, db *pebble.DB, dbDir, task string, n uint64, opts ...Option) (*client.Pending, error) {
	dir, err := Snapshot(db, dbDir, n, opts...)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir) // gone already when handed off; removed here when refused
	req := client.Request{Task: task, Checkpoint: n, Dir: dir, Engine: Engine, Handoff: true}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if !o.noWAL {
		if req.WALDir, err = filepath.Abs(dbDir); err != nil {
			return nil, fmt.Errorf("pebble checkpoint %d: wal dir: %w", n, err)
		}
	}
	return c.Send(ctx, req)
}

// Snapshot makes the Pebble checkpoint that Checkpoint hands off: it
// flushes the memtable (unless WithoutFlush; see the package comment for
// why), then makes a Pebble checkpoint with a flushed WAL in a fresh
// directory next to the store (dbDir), named for checkpoint n, and trims
// the recycled tail off its WAL files; a directory of that name left by a
// crash is removed first. It returns the directory, which the caller owns.
func Snapshot(db *pebble.DB, dbDir string, n uint64, opts ...Option) (string, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dir := filepath.Join(filepath.Dir(filepath.Clean(dbDir)), fmt.Sprintf(".%s.ckpt-%d", filepath.Base(dbDir), n))
	if err := os.RemoveAll(dir); err != nil { // left by a crash of an earlier attempt
		return "", fmt.Errorf("pebble checkpoint dir: %w", err)
	}
	if !o.noFlush {
		if err := db.Flush(); err != nil {
			return "", fmt.Errorf("pebble checkpoint %d: flush the memtable: %w", n, err)
		}
	}
	if err := db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return "", fmt.Errorf("pebble checkpoint %d: %w", n, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("pebble checkpoint %d: %w", n, err)
	}
	for _, e := range entries {
		num, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok {
			continue
		}
		logNum, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			continue // a WAL failover segment (NNNNNN-NNN.log): left whole
		}
		if err := trimWAL(filepath.Join(dir, e.Name()), logNum); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("pebble checkpoint %d: %w", n, err)
		}
	}
	return dir, nil
}

// trimWAL truncates the WAL file path (log number logNum, a copy in a
// checkpoint) after its last record that reads whole. What follows is the
// stale tail of a recycled file, or a torn record: replay stops there
// anyway. A file whose records do not read to such an end (an I/O error)
// is left as it is.
func trimWAL(path string, logNum uint64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("trim WAL: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("trim WAL: %w", err)
	}
	r := newRecordReader(record.NewReader, f, logNum)
	var end int64
	for {
		rec, err := r.Next()
		if err == nil {
			_, err = io.Copy(io.Discard, rec)
		}
		if err != nil {
			if err != io.EOF && !record.IsInvalidRecord(err) && !errors.Is(err, record.ErrInvalidChunk) {
				return nil // not a tail: keep every byte
			}
			break
		}
		end = r.Offset()
	}
	if end >= fi.Size() {
		return nil
	}
	if err := f.Truncate(end); err != nil {
		return fmt.Errorf("trim WAL %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("trim WAL %s: %w", path, err)
	}
	return nil
}

// newRecordReader calls record.NewReader with a log number of the type
// it takes (one of Pebble's internal types, which cannot be named here).
func newRecordReader[N ~uint64](newReader func(io.Reader, N) *record.Reader, r io.Reader, logNum uint64) *record.Reader {
	return newReader(r, N(logNum))
}
