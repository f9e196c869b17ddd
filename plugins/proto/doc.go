// Package pluginpb holds the gRPC services of the ckpt plugin protocol
// (version 1), generated from plugin.proto, storage.proto and engine.proto.
package pluginpb

//go:generate ./generate.sh
