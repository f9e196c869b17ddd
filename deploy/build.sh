#!/bin/sh
# Builds what the ckpt image ships: a static ckpt binary with its version,
# commit and date stamped, and the pure-Go plugins. The Dockerfile runs this
# script, and e2e/image_test.go runs it too and checks that every binary is
# static and `ckpt version --json` prints what was stamped.
#
#   deploy/build.sh OUTDIR [VERSION [COMMIT [DATE]]]
#
# OUTDIR/ckpt and OUTDIR/plugins/ckpt-plugin-{s3,azblob}. VERSION (default:
# dev) is what `ckpt version` prints. COMMIT and DATE default to $COMMIT and
# $DATE, else to the checkout's HEAD revision and its commit time (RFC 3339)
# when git knows them; left empty, the binary reports the revision and time
# the Go toolchain recorded, or "unknown". The RocksDB plugin needs cgo and
# is not built here (see deploy/README.md).
set -eu
out="${1:?usage: deploy/build.sh OUTDIR [VERSION [COMMIT [DATE]]]}"
version="${2:-dev}"
case "$out" in /*) ;; *) out="$(pwd)/$out" ;; esac
cd "$(dirname "$0")/.."
commit="${3:-${COMMIT:-}}"
date="${4:-${DATE:-}}"
if [ -z "$commit" ] && git rev-parse --verify -q HEAD >/dev/null 2>&1; then
	commit="$(git rev-parse HEAD)"
	if [ -n "$(git status --porcelain 2>/dev/null)" ]; then commit="$commit-dirty"; fi
	[ -n "$date" ] || date="$(git show -s --format=%cI HEAD)"
fi
export CGO_ENABLED=0
mkdir -p "$out/plugins"
go build -trimpath -ldflags "-s -w -X main.version=$version -X main.commit=$commit -X main.date=$date" -o "$out/ckpt" ./cmd/ckpt
go build -trimpath -ldflags "-s -w" -o "$out/plugins/" ./plugins/ckpt-plugin-s3 ./plugins/ckpt-plugin-azblob
