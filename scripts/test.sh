#!/usr/bin/env bash
# The test suite: every package, with the race detector on the packages
# whose concurrency matters most (agent, uploader, manifests), and the
# end-to-end tests that build the ckpt binary and run it as a process.
set -euo pipefail
cd "$(dirname "$0")/.."
go test -count=1 -timeout 15m ./...
go test -count=1 -race -timeout 10m ./agent/ ./uploader/ ./manifests/
