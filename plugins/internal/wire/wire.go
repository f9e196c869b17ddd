// Package wire is what the plugin host and the plugin SDK share: the
// go-plugin handshake, the gRPC glue and the error codec.
package wire

import (
	"context"
	"errors"
	"hash/crc32"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ckpt-io/ckpt/plugins/proto"
	"github.com/ckpt-io/ckpt/storage"
)

// ProtocolVersion is the plugin protocol this build speaks. A change that
// an older host or plugin cannot follow increments it.
const ProtocolVersion = 1

// ChunkSize bounds the body bytes in one message of Put and Get.
const ChunkSize = 1 << 20

// MaxMessageSize is the largest gRPC message either side accepts: a chunk
// and its framing, or a page of a listing.
const MaxMessageSize = 8 << 20

// Flow control: a stream may have StreamWindow bytes in flight (a few
// chunks, so a transfer does not stall on every chunk's round trip; 4 MiB
// per stream bounds memory), a connection ConnWindow; the transport reads
// and writes the socket IOBuffer bytes at a time.
const (
	StreamWindow = 4 << 20
	ConnWindow   = 16 << 20
	IOBuffer     = 256 << 10
)

// Handshake is go-plugin's handshake: a plugin refuses to run without the
// cookie in its environment (it is not meant to be run by hand), and host
// and plugin must speak the same protocol version.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "CKPT_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "ckpt-plugin-7d3f9a1c5e2b4068",
}

// PluginName is the one name in the go-plugin plugin set.
const PluginName = "ckpt"

// Castagnoli is the CRC-32C table both sides checksum bodies with.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// GRPCPlugin is go-plugin's glue: on the plugin side Register adds the
// services to the server; on the host side the client is the connection.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Register func(*grpc.Server)
}

// GRPCServer registers the plugin's services.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	p.Register(s)
	return nil
}

// GRPCClient returns the connection itself; the host makes its stubs.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return c, nil
}

// ToStatus turns an error of a store or an engine into a gRPC status that
// keeps what callers test for: the sentinels as codes (NotFound,
// AlreadyExists, Canceled, DeadlineExceeded, PermissionDenied for what
// storage.IsPermissionDenied reports), the classes of storage.Store
// (transient, throttled) and the HTTP status and error code in the
// ErrorDetail.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err // made by the SDK itself
	}
	code := codes.Unknown
	switch {
	case errors.Is(err, storage.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, storage.ErrExists):
		code = codes.AlreadyExists
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	if code == codes.Unknown && storage.IsPermissionDenied(err) {
		code = codes.PermissionDenied // the host's error says PermissionDenied
	}
	var oe *storage.OpenError
	if errors.As(err, &oe) && code == codes.Unknown {
		code = codes.FailedPrecondition
	}
	d := &pluginpb.ErrorDetail{Message: err.Error(), Transient: storage.IsTransient(err), Throttled: storage.IsThrottled(err),
		HttpStatus: int32(storage.HTTPStatus(err)), ErrorCode: storage.ErrorCode(err)}
	s, serr := status.New(code, err.Error()).WithDetails(d)
	if serr != nil {
		return status.Error(code, err.Error())
	}
	return s.Err()
}

// Detail returns the ErrorDetail of a status, if it carries one.
func Detail(s *status.Status) *pluginpb.ErrorDetail {
	for _, d := range s.Details() {
		if e, ok := d.(*pluginpb.ErrorDetail); ok {
			return e
		}
	}
	return nil
}

// InvalidArgument is a status for a request the plugin refuses.
func InvalidArgument(format string, a ...any) error {
	return status.Errorf(codes.InvalidArgument, format, a...)
}
