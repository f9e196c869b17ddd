#!/usr/bin/env bash
# Builds the Java client with the JDK alone (no build tool, no registry),
# into the directory given (default: build):
#   OUT/ckpt-client.jar        the library
#   OUT/test/                  the library and the conformance driver
# Users with Maven can use pom.xml instead.
set -euo pipefail
cd "$(dirname "$0")"
out="${1:-build}"
rm -rf "$out"
mkdir -p "$out/classes" "$out/test"
javac --release 17 -Xlint:all -Werror -d "$out/classes" $(find src/main/java -name '*.java')
jar --create --file "$out/ckpt-client.jar" -C "$out/classes" .
javac --release 17 -Xlint:all -Werror -cp "$out/classes" -d "$out/test" $(find src/test/java -name '*.java')
cp -r "$out/classes/." "$out/test/"
