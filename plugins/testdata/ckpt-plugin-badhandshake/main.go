// Command ckpt-plugin-badhandshake is a go-plugin server that a ckpt host
// must refuse. Installed as ckpt-plugin-badcookie it expects another magic
// cookie value; as ckpt-plugin-v2 it speaks plugin protocol version 2.
package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

func main() {
	hs := plugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "CKPT_PLUGIN_MAGIC_COOKIE", MagicCookieValue: "ckpt-plugin-7d3f9a1c5e2b4068"}
	if strings.HasSuffix(filepath.Base(os.Args[0]), "-v2") {
		hs.ProtocolVersion = 2
	} else {
		hs.MagicCookieValue = "not-the-ckpt-cookie"
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: hs,
		Plugins:         plugin.PluginSet{"ckpt": grpcPlugin{}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}

type grpcPlugin struct{ plugin.NetRPCUnsupportedPlugin }

func (grpcPlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error { return nil }
func (grpcPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, nil
}
