#!/usr/bin/env bash
# Builds the Java client with the JDK alone (no build tool, no registry):
#   build/ckpt-client.jar        the library
#   build/test/                  the library and the conformance driver
# Users with Maven can use pom.xml instead.
set -euo pipefail
cd "$(dirname "$0")"
rm -rf build
mkdir -p build/classes build/test
javac --release 17 -Xlint:all -Werror -d build/classes $(find src/main/java -name '*.java')
jar --create --file build/ckpt-client.jar -C build/classes .
javac --release 17 -Xlint:all -Werror -cp build/classes -d build/test $(find src/test/java -name '*.java')
cp -r build/classes/. build/test/
