//go:build rocksdb

// Package rocksengine is the RocksDB engine that ckpt-plugin-rocksdb
// serves: it classifies a RocksDB checkpoint's files and checks a restored
// store by reading it through RocksDB itself (grocksdb, cgo, linked against
// the system's librocksdb). It builds only with -tags rocksdb, so that cgo
// and librocksdb stay out of the ckpt binary and out of builds on machines
// without librocksdb-dev.
package rocksengine

/*
#cgo CXXFLAGS: -std=c++17
#cgo LDFLAGS: -lrocksdb -lstdc++
#include <stdlib.h>
#include "verify.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unsafe"

	"github.com/linxGnu/grocksdb"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/plugins/ckpt-plugin-rocksdb/blobfile"
)

// Name is the engine's name in checkpoint requests and manifests.
const Name = "rocksdb"

// Engine is the RocksDB engine. The zero value is ready to use; it holds
// no state between calls.
type Engine struct{}

var _ engines.Engine = Engine{}

// Name implements engines.Engine.
func (Engine) Name() string { return Name }

// Classify implements engines.Engine. RocksDB writes table files (*.sst)
// and blob files (*.blob) once and never changes them: they are shared.
// MANIFEST-*, CURRENT, OPTIONS-*, IDENTITY, the WAL (*.log) and any file
// RocksDB may add later are private. These are exactly the answers of the
// built-in rocksdb engine (engines.SharedBySuffix), so agents with and
// without this plugin classify one store's files the same way.
func (Engine) Classify(name string) manifests.Kind { return engines.SharedBySuffix(name) }

// checkEvery is how many keys the scan reads between looks at ctx.
const checkEvery = 4096

// Check implements engines.Engine. It proves a restored directory is a
// RocksDB store whose bytes are intact, in two passes, and changes
// nothing in dir (RocksDB's info log goes to a temporary directory):
//
//  1. every *.sst file in dir is opened with RocksDB's SstFileReader and
//     the checksum of each of its blocks is verified (block-based tables,
//     RocksDB's default format), and every record of every *.blob file is
//     checked against its CRC; a mismatch is an error naming the file;
//  2. the store is opened read-only with the options of its newest
//     OPTIONS file and every column family is read through with checksum
//     verification, which also reads every live value in blob files and
//     replays the WAL; Keys is the number of keys read.
//
// Stores that need a custom comparator or merge operator cannot be read
// by this generic reader and fail the check with RocksDB's message.
// ctx is checked between files and every few thousand keys.
func (Engine) Check(ctx context.Context, dir string) (engines.Result, error) {
	if err := ctx.Err(); err != nil {
		return engines.Result{}, err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return engines.Result{}, fmt.Errorf("rocksdb check: %w", err)
	}
	if !fi.IsDir() {
		return engines.Result{}, fmt.Errorf("rocksdb check: %s is not a directory", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "CURRENT")); err != nil {
		return engines.Result{}, fmt.Errorf("rocksdb check: %s is not a RocksDB store (no CURRENT file): was it restored from a checkpoint made with engine rocksdb?", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return engines.Result{}, fmt.Errorf("rocksdb check: %w", err)
	}
	for _, e := range entries {
		sst, blob := strings.HasSuffix(e.Name(), ".sst"), strings.HasSuffix(e.Name(), ".blob")
		if !sst && !blob {
			continue
		}
		if err := ctx.Err(); err != nil {
			return engines.Result{}, err
		}
		path := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() {
			return engines.Result{}, fmt.Errorf("rocksdb check: %s is not a regular file", path)
		}
		if sst {
			err = verifySST(path)
		} else {
			err = verifyBlob(ctx, path)
		}
		if err != nil {
			return engines.Result{}, err
		}
	}
	keys, err := scan(ctx, dir)
	if err != nil {
		return engines.Result{}, err
	}
	return engines.Result{Checked: true, Keys: keys}, nil
}

// verifySST verifies every block checksum of one table file.
func verifySST(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	msg := C.ckpt_verify_sst(cpath)
	if msg == nil {
		return nil
	}
	defer C.free(unsafe.Pointer(msg))
	return fmt.Errorf("rocksdb check: table file %s is corrupt: %s", filepath.Base(path), C.GoString(msg))
}

// verifyBlob checks every record of one blob file against its CRC.
func verifyBlob(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("rocksdb check: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("rocksdb check: %w", err)
	}
	if err := blobfile.Verify(ctx, f, fi.Size()); err != nil {
		if errors.Is(err, blobfile.ErrCorrupt) {
			return fmt.Errorf("rocksdb check: blob file %s is corrupt: %v", filepath.Base(path), err)
		}
		return fmt.Errorf("rocksdb check: blob file %s: %w", filepath.Base(path), err)
	}
	return nil
}

// scan opens the store in dir read-only and reads every key of every
// column family with checksums verified, returning the number of keys.
func scan(ctx context.Context, dir string) (keys int64, err error) {
	logDir, err := os.MkdirTemp("", "ckpt-rocksdb-check-")
	if err != nil {
		return 0, fmt.Errorf("rocksdb check: temporary log directory: %w", err)
	}
	defer os.RemoveAll(logDir)

	opts, cfNames, cfOpts, release, err := loadOptions(dir)
	if err != nil {
		return 0, err
	}
	defer release()
	opts.SetCreateIfMissing(false)
	opts.SetDbLogDir(logDir)
	opts.SetInfoLogLevel(grocksdb.ErrorInfoLogLevel)
	db, cfs, err := grocksdb.OpenDbForReadOnlyColumnFamilies(opts, dir, cfNames, cfOpts, false)
	if err != nil {
		return 0, fmt.Errorf("rocksdb check: open %s read-only: %w", dir, err)
	}
	defer func() {
		for _, cf := range cfs {
			cf.Destroy()
		}
		db.Close()
	}()
	ro := grocksdb.NewDefaultReadOptions()
	defer ro.Destroy()
	ro.SetVerifyChecksums(true)
	ro.SetFillCache(false)
	for i, cf := range cfs {
		n, err := scanCF(ctx, db, ro, cf)
		keys += n
		if err != nil {
			return keys, fmt.Errorf("rocksdb check: read column family %q of %s: %w", cfNames[i], dir, err)
		}
	}
	return keys, nil
}

func scanCF(ctx context.Context, db *grocksdb.DB, ro *grocksdb.ReadOptions, cf *grocksdb.ColumnFamilyHandle) (int64, error) {
	it := db.NewIteratorCF(ro, cf)
	defer it.Close()
	var n int64
	for it.SeekToFirst(); it.Valid(); it.Next() {
		n++
		if n%checkEvery == 0 {
			if err := ctx.Err(); err != nil {
				return n, err
			}
		}
	}
	return n, it.Err()
}

// loadOptions returns the options to open the store with: RocksDB's
// defaults for the database, and for each column family the options of the
// store's newest OPTIONS file (or, without one, RocksDB's defaults for
// every column family the MANIFEST lists). release frees them.
func loadOptions(dir string) (opts *grocksdb.Options, names []string, cfOpts []*grocksdb.Options, release func(), err error) {
	opts = grocksdb.NewDefaultOptions()
	if hasOptionsFile(dir) {
		env := grocksdb.NewDefaultEnv()
		cache := grocksdb.NewLRUCache(8 << 20)
		lo, lerr := grocksdb.LoadLatestOptions(dir, env, true, cache)
		if lerr != nil {
			opts.Destroy()
			cache.Destroy()
			env.Destroy()
			return nil, nil, nil, nil, fmt.Errorf("rocksdb check: read the OPTIONS file of %s: %w", dir, lerr)
		}
		names = lo.ColumnFamilyNames()
		all := lo.ColumnFamilyOpts()
		cfOpts = make([]*grocksdb.Options, len(all))
		for i := range all {
			cfOpts[i] = &all[i]
		}
		return opts, names, cfOpts, func() { lo.Destroy(); cache.Destroy(); env.Destroy(); opts.Destroy() }, nil
	}
	names, err = grocksdb.ListColumnFamilies(opts, dir)
	if err != nil {
		opts.Destroy()
		return nil, nil, nil, nil, fmt.Errorf("rocksdb check: list the column families of %s: %w", dir, err)
	}
	if len(names) == 0 {
		opts.Destroy()
		return nil, nil, nil, nil, errors.New("rocksdb check: the MANIFEST lists no column family")
	}
	sort.Strings(names)
	cfOpts = make([]*grocksdb.Options, len(names))
	for i := range names {
		cfOpts[i] = opts
	}
	return opts, names, cfOpts, opts.Destroy, nil
}

func hasOptionsFile(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, "OPTIONS-*"))
	return len(m) > 0
}
