#!/usr/bin/env bash
# Runs every fuzz target of the module for a bounded time each
# (FUZZTIME, default 10s). Seed corpora live in the tests (f.Add) and in
# testdata/fuzz/ of each package; a failing input is written there by go
# test and should be committed with its fix.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-10s}"
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "== fuzz $target ($pkg, $fuzztime)"
    # go test's fuzzing coordinator can end a run that found nothing with
    # "context deadline exceeded" when a worker answers late at the time
    # limit (a loaded machine); such a run wrote no failing input and is
    # run once more. Any other failure fails at once.
    if ! out=$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" 2>&1); then
      echo "$out"
      if grep -q "Failing input written" <<<"$out" || ! grep -q "context deadline exceeded" <<<"$out"; then
        exit 1
      fi
      echo "== fuzz $target: the coordinator timed out with no failing input; once more"
      go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
    else
      echo "$out" | tail -3
    fi
  done
done
