#!/usr/bin/env bash
# The test suite: every package, with the race detector on the packages
# whose concurrency matters most (agent, checkpoint, gc, uploader, manifests, wal), and the
# end-to-end tests that build the ckpt binary and run it as a process
# (the crash matrix, TestCrashMatrix, builds its own binary with -tags
# ckpt_failpoints and kills it at every failpoint; -short skips it), then
# the RocksDB engine plugin's tests (-tags rocksdb, librocksdb-dev), and the
# failpoint build of the packages the disk-fault suite covers.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
export CKPTTEST_REQUIRE_CLIENTS=1 # the clients' conformance runs may not skip (not CKPT_: agents would warn of an unknown variable)
go test -count=1 -timeout 15m ./...
go test -count=1 -race -timeout 10m ./agent/ ./checkpoint/ ./gc/ ./uploader/ ./manifests/ ./wal/
# The RocksDB engine plugin links librocksdb-dev through cgo, so it and its
# end-to-end tests build only with -tags rocksdb: among them the non-Go apps,
# RocksDB stores written by ldb and checkpointed through the Python and Java
# clients (e2e/clients_rocksdb_test.go). The clients' conformance suite runs
# in `go test ./...` above (clients/conformance).
go test -count=1 -timeout 10m -tags rocksdb -run RocksDB ./plugins/ckpt-plugin-rocksdb/... ./e2e/
# The disk-fault suite: failpoints fail local writes, fsyncs and renames
# with ENOSPC, EIO and EROFS (compiled in only with this tag).
go test -count=1 -timeout 10m -tags ckpt_failpoints ./localrecovery/ ./restore/ ./agent/ ./internal/failpoint/
