// Package sdk is the one package a ckpt plugin imports. A storage plugin's
// main calls ServeStorage with the function that opens its URLs; an engine
// plugin's main calls ServeEngine. The binary is named ckpt-plugin-<name>
// and installed in the agent's plugin directory (--plugin-dir).
//
//	func main() {
//		sdk.ServeStorage(func(ctx context.Context, u *url.URL) (storage.Store, error) {
//			return mystore.Open(ctx, u)
//		}, "mystore")
//	}
//
// Serve does not return. The process is started and stopped by the host;
// run by hand it says so and exits 1. Writing to stdout before Serve is
// harmless here (the SDK moves such writes to stderr, where the host logs
// them); after Serve stdout and stderr are forwarded to the host's log.
package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/plugins/proto"
	"github.com/ckpt-io/ckpt/storage"
)

// ProtocolVersion is the plugin protocol the SDK speaks.
const ProtocolVersion = wire.ProtocolVersion

// ServeStorage serves a storage backend for the given URL schemes: the
// host calls open with each URL of those schemes that storage.Open is
// given, and the store it returns must keep storage.Store's contract (run
// storage/storagetest on it). A store's Put is called as soon as a body
// starts to arrive: its body (an io.ReadSeeker and io.ReaderAt) makes
// reads wait for bytes not received yet, keeps what arrived so the store
// may rewind, and yields the last byte only after the host's size and
// CRC-32C are checked. It does not return.
func ServeStorage(open storage.Opener, schemes ...string) {
	if open == nil || len(schemes) == 0 {
		fatal("sdk.ServeStorage: an opener and at least one scheme are required")
	}
	for _, s := range schemes {
		if !validScheme(s) {
			fatal(fmt.Sprintf("sdk.ServeStorage: %q is not a URL scheme", s))
		}
	}
	srv := newStorageServer(open, schemes)
	serve(&pluginpb.DescribeResponse{Kind: "storage", Schemes: schemes, Protocol: ProtocolVersion}, func(s *grpc.Server) {
		pluginpb.RegisterStorageServer(s, srv)
	})
}

// ServeStore serves one store for every URL of the given schemes (the URL
// itself is ignored): for stores configured by their own environment. It
// does not return.
func ServeStore(st storage.Store, schemes ...string) {
	ServeStorage(func(context.Context, *url.URL) (storage.Store, error) { return noClose{st}, nil }, schemes...)
}

// ServeEngine serves an engine. It does not return.
func ServeEngine(e engines.Engine) {
	if e == nil || e.Name() == "" {
		fatal("sdk.ServeEngine: an engine with a name is required")
	}
	serve(&pluginpb.DescribeResponse{Kind: "engine", Engine: e.Name(), Protocol: ProtocolVersion}, func(s *grpc.Server) {
		pluginpb.RegisterEngineServer(s, &engineServer{e: e})
	})
}

func serve(desc *pluginpb.DescribeResponse, register func(*grpc.Server)) {
	restoreStdout()
	stop := startCPUProfile()
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: wire.Handshake,
		Plugins: plugin.PluginSet{wire.PluginName: &wire.GRPCPlugin{Register: func(s *grpc.Server) {
			pluginpb.RegisterInfoServer(s, &infoServer{desc: desc})
			register(s)
		}}},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			opts = append(opts, grpc.MaxRecvMsgSize(wire.MaxMessageSize), grpc.MaxSendMsgSize(wire.MaxMessageSize), grpc.ForceServerCodecV2(wire.Codec{}),
				grpc.InitialWindowSize(wire.StreamWindow), grpc.InitialConnWindowSize(wire.ConnWindow),
				grpc.ReadBufferSize(wire.IOBuffer), grpc.WriteBufferSize(wire.IOBuffer))
			return grpc.NewServer(opts...)
		},
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: os.Stderr, JSONFormat: true}),
	})
	stop()
	os.Exit(0)
}

// startCPUProfile profiles the plugin's CPU into the file
// $CKPT_PLUGIN_CPUPROFILE.<pid> when that variable is set (the plugin
// inherits the host's environment), until the host stops the plugin.
func startCPUProfile() (stop func()) {
	path := os.Getenv("CKPT_PLUGIN_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s.%d", path, os.Getpid()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "CKPT_PLUGIN_CPUPROFILE: %v\n", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "CKPT_PLUGIN_CPUPROFILE: %v\n", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

func fatal(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(1)
}

func validScheme(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z') {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789+-.") == ""
}

type infoServer struct {
	pluginpb.UnimplementedInfoServer
	desc *pluginpb.DescribeResponse
}

func (s *infoServer) Describe(context.Context, *pluginpb.DescribeRequest) (*pluginpb.DescribeResponse, error) {
	return s.desc, nil
}

type engineServer struct {
	pluginpb.UnimplementedEngineServer
	e engines.Engine
}

func (s *engineServer) Name(context.Context, *pluginpb.NameRequest) (*pluginpb.NameResponse, error) {
	return &pluginpb.NameResponse{Name: s.e.Name()}, nil
}

func (s *engineServer) Classify(_ context.Context, r *pluginpb.ClassifyRequest) (*pluginpb.ClassifyResponse, error) {
	out := make([]string, len(r.Names))
	for i, n := range r.Names {
		out[i] = string(s.e.Classify(n))
	}
	return &pluginpb.ClassifyResponse{Kinds: out}, nil
}

func (s *engineServer) Check(ctx context.Context, r *pluginpb.CheckRequest) (*pluginpb.CheckResponse, error) {
	if r.Dir == "" {
		return nil, wire.InvalidArgument("check: no directory")
	}
	res, err := s.e.Check(ctx, r.Dir)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return &pluginpb.CheckResponse{Checked: res.Checked, Keys: res.Keys}, nil
}

// noClose serves a store that outlives its handles.
type noClose struct{ storage.Store }

func (noClose) Close() error { return nil }

var errStop = errors.New("stop")
