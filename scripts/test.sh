#!/usr/bin/env bash
# The test suite: every package, with the race detector on the packages
# whose concurrency matters most (agent, uploader, manifests), and the
# end-to-end tests that build the ckpt binary and run it as a process.
# The e2e crash matrix (TestCrashMatrix) builds its own binary with
# -tags ckpt_failpoints and kills it at every failpoint, so the first
# run below covers it (about two minutes; -short skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
go test -count=1 -timeout 15m ./...
go test -count=1 -race -timeout 10m ./agent/ ./uploader/ ./manifests/
