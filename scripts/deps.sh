#!/usr/bin/env bash
# The Debian packages the test suite needs, installed when missing:
#   chromium          the status page test renders the page in it
#   restic rclone     ckpt-bench's peers (and ldb from rocksdb-tools)
#   rocksdb-tools
#   librocksdb-dev    ckpt-plugin-rocksdb links RocksDB through cgo
#   nodejs npm        the Azure Blob plugin's tests install Azurite with npm
#   python3 python3-pip        the Python client, its conformance run, and
#   openjdk-17-jdk-headless    the Java client's (clients/, e2e/clients_rocksdb_test.go)
# The S3, GCS and Azure servers are not packages: the tests install them
# at pinned versions into .bin/ on first use.
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v restic >/dev/null || missing+=(restic)
command -v rclone >/dev/null || missing+=(rclone)
command -v ldb >/dev/null || missing+=(rocksdb-tools)
[ -e /usr/include/rocksdb/c.h ] || missing+=(librocksdb-dev)
command -v npm >/dev/null || missing+=(nodejs npm)
command -v python3 >/dev/null || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update
  $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi
