//go:build rocksdb

// Command ckpt-plugin-rocksdb serves the RocksDB engine to ckpt: it
// classifies RocksDB's files (table and blob files shared, everything else
// private) and checks a restored store by opening it read-only with
// RocksDB and verifying its checksums (package rocksengine). It links
// RocksDB through cgo, so it is built apart from ckpt, with the tag:
//
//	apt-get install librocksdb-dev   # RocksDB 7.8 headers and library
//	go build -tags rocksdb -o DIR/ ./plugins/...
//
// Without -tags rocksdb this package is left out of the build, and ckpt's
// built-in rocksdb engine (same file classes, no check) is used instead.
package main

import (
	"github.com/ckpt-io/ckpt/plugins/ckpt-plugin-rocksdb/rocksengine"
	"github.com/ckpt-io/ckpt/plugins/sdk"
)

func main() {
	sdk.ServeEngine(rocksengine.Engine{})
}
