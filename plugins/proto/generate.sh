#!/bin/sh
# Regenerates the Go code of the plugin protocol from *.proto. Needs protoc
# (Debian: apt-get install -y protobuf-compiler); installs protoc-gen-go and
# protoc-gen-go-grpc into a temporary GOBIN. CI does not run this: the
# generated files are committed.
set -eu
cd "$(dirname "$0")"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOBIN=$bin go install google.golang.org/protobuf/cmd/protoc-gen-go@latest
GOBIN=$bin go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@latest
PATH=$bin:$PATH protoc -I . -I /usr/include \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	plugin.proto storage.proto engine.proto
