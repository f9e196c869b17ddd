#!/bin/sh
# Builds what the ckpt image ships: a static ckpt binary with its version
# stamped, and the pure-Go plugins. The Dockerfile runs this script, and
# e2e/deploy_test.go runs it too and checks that every binary is static.
#
#   deploy/build.sh OUTDIR [VERSION]
#
# OUTDIR/ckpt and OUTDIR/plugins/ckpt-plugin-{s3,azblob}. VERSION (default:
# dev) is what `ckpt version` prints. The RocksDB plugin needs cgo and is
# not built here (see deploy/README.md).
set -eu
out="${1:?usage: deploy/build.sh OUTDIR [VERSION]}"
version="${2:-dev}"
case "$out" in /*) ;; *) out="$(pwd)/$out" ;; esac
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
mkdir -p "$out/plugins"
go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$out/ckpt" ./cmd/ckpt
go build -trimpath -ldflags "-s -w" -o "$out/plugins/" ./plugins/ckpt-plugin-s3 ./plugins/ckpt-plugin-azblob
