// Package engine knows the storage engines whose snapshots ckpt carries:
// how to check that a restored directory opens as a working store.
package engine

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Check opens the store in dir with the named engine, read-only, and reads
// every key, proving the restored files form a store the engine accepts.
// Engines ckpt cannot open ("generic", "rocksdb", "") are not checked: ok
// is false and err nil.
func Check(ctx context.Context, name, dir string) (ok bool, keys int64, err error) {
	switch name {
	case "pebble":
		db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: quiet{}})
		if err != nil {
			return false, 0, fmt.Errorf("open restored pebble store: %w", err)
		}
		defer db.Close()
		it, err := db.NewIterWithContext(ctx, nil)
		if err != nil {
			return false, 0, fmt.Errorf("read restored pebble store: %w", err)
		}
		for valid := it.First(); valid; valid = it.Next() {
			keys++
			if keys%4096 == 0 && ctx.Err() != nil {
				it.Close()
				return false, keys, ctx.Err()
			}
		}
		if err := it.Close(); err != nil {
			return false, keys, fmt.Errorf("read restored pebble store: %w", err)
		}
		return true, keys, nil
	}
	return false, 0, nil
}

// quiet drops Pebble's informational logs (WAL replay lines).
type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
