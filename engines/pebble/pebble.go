// Package pebble is ckpt's engine for Pebble stores. Importing it registers
// the engine "pebble" in engines.Default. Besides classifying and checking
// a store's files, it rescales (engines.Rescaler, rescale*.go): it builds
// a new task's store from the key ranges of old tasks' checkpoints.
package pebble

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/engines"
)

// Name is the engine's name in requests and manifests.
const Name = "pebble"

func init() { engines.Register(Engine{}) }

// Engine is the Pebble engine: SSTs and blob files are shared; MANIFEST-*,
// CURRENT, OPTIONS-*, marker.* and the WAL are private. Check opens the
// store read-only and iterates every key.
type Engine struct{}

// Name implements engines.Engine.
func (Engine) Name() string { return Name }

// Classify implements engines.Engine.
func (Engine) Classify(name string) engines.Kind { return engines.SharedBySuffix(name) }

// Check implements engines.Engine: it opens dir read-only and reads every
// key, so a missing or corrupt file that the checksums could not reveal (a
// store assembled from the wrong files) fails here.
func (Engine) Check(ctx context.Context, dir string) (engines.Result, error) {
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: quiet{}})
	if err != nil {
		return engines.Result{}, fmt.Errorf("open restored pebble store: %w", err)
	}
	defer db.Close()
	it, err := db.NewIterWithContext(ctx, nil)
	if err != nil {
		return engines.Result{}, fmt.Errorf("read restored pebble store: %w", err)
	}
	var keys int64
	for valid := it.First(); valid; valid = it.Next() {
		keys++
		if keys%4096 == 0 && ctx.Err() != nil {
			it.Close()
			return engines.Result{Keys: keys}, ctx.Err()
		}
	}
	if err := it.Close(); err != nil {
		return engines.Result{Keys: keys}, fmt.Errorf("read restored pebble store: %w", err)
	}
	return engines.Result{Checked: true, Keys: keys}, nil
}

// quiet drops Pebble's informational logs (WAL replay lines).
type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
