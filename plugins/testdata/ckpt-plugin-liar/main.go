// Command ckpt-plugin-liar is a storage plugin that breaks the protocol on
// purpose, for the host's tests: it is served with go-plugin directly, not
// with plugins/sdk, so that it can send what the SDK never would. The
// first path segment of a key or a prefix picks the lie:
//
//	Get  short/     a trailer that claims more bytes than were sent
//	     badcrc/    a trailer whose CRC-32C does not match the bytes
//	     notrailer/ the stream ends without a trailer
//	     empty/     an empty message, then the bytes and a good trailer
//	     odd/       an error without ckpt's error detail (DATA_LOSS)
//	     other keys: "hello" and a good trailer
//	Stat negsize/   a negative size;  otherkey/  another key's info
//	List unsorted/  keys out of order; dup/ a key twice; badkey/ a key
//	     with a ".." segment; outside/ a key outside the prefix;
//	     negsize/ a negative size; other prefixes: one good object
//	Put  the body is drained and dropped (success); Delete odd/: DATA_LOSS
package main

import (
	"context"
	"hash/crc32"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/plugins/proto"
)

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: wire.Handshake,
		Plugins: plugin.PluginSet{wire.PluginName: &wire.GRPCPlugin{Register: func(s *grpc.Server) {
			pluginpb.RegisterInfoServer(s, info{})
			pluginpb.RegisterStorageServer(s, liar{})
		}}},
		GRPCServer: plugin.DefaultGRPCServer,
	})
}

type info struct {
	pluginpb.UnimplementedInfoServer
}

func (info) Describe(context.Context, *pluginpb.DescribeRequest) (*pluginpb.DescribeResponse, error) {
	return &pluginpb.DescribeResponse{Kind: "storage", Schemes: []string{"liar"}, Protocol: wire.ProtocolVersion}, nil
}

type liar struct {
	pluginpb.UnimplementedStorageServer
}

func lie(key string) string {
	s, _, _ := strings.Cut(key, "/")
	return s
}

func (liar) Open(context.Context, *pluginpb.OpenRequest) (*pluginpb.OpenResponse, error) {
	return &pluginpb.OpenResponse{Handle: 1, Name: "liar://"}, nil
}

func (liar) Close(context.Context, *pluginpb.CloseRequest) (*pluginpb.CloseResponse, error) {
	return &pluginpb.CloseResponse{}, nil
}

func (liar) Probe(context.Context, *pluginpb.ProbeRequest) (*pluginpb.ProbeResponse, error) {
	return &pluginpb.ProbeResponse{}, nil
}

func (liar) Put(stream pluginpb.Storage_PutServer) error {
	for {
		if _, err := stream.Recv(); err == io.EOF {
			return stream.SendAndClose(&pluginpb.PutResponse{})
		} else if err != nil {
			return err
		}
	}
}

func chunk(b []byte) *pluginpb.GetResponse {
	return &pluginpb.GetResponse{Msg: &pluginpb.GetResponse_Chunk{Chunk: b}}
}

func trailer(size int64, crc uint32) *pluginpb.GetResponse {
	return &pluginpb.GetResponse{Msg: &pluginpb.GetResponse_Trailer{Trailer: &pluginpb.GetTrailer{Size: size, Crc32C: crc}}}
}

func (liar) Get(r *pluginpb.GetRequest, stream pluginpb.Storage_GetServer) error {
	body := []byte("hello")
	sum := crc32.Checksum(body, wire.Castagnoli)
	var msgs []*pluginpb.GetResponse
	switch lie(r.Key) {
	case "short":
		msgs = []*pluginpb.GetResponse{chunk(body), trailer(int64(len(body))+3, sum)}
	case "badcrc":
		msgs = []*pluginpb.GetResponse{chunk(body), trailer(int64(len(body)), sum^1)}
	case "notrailer":
		msgs = []*pluginpb.GetResponse{chunk(body)}
	case "empty":
		msgs = []*pluginpb.GetResponse{{}, chunk(body), trailer(int64(len(body)), sum)}
	case "odd":
		return status.Error(codes.DataLoss, "the disk ate it")
	default:
		msgs = []*pluginpb.GetResponse{chunk(body), trailer(int64(len(body)), sum)}
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return nil
}

func (liar) Stat(_ context.Context, r *pluginpb.StatRequest) (*pluginpb.ObjectInfo, error) {
	o := &pluginpb.ObjectInfo{Key: r.Key, Size: 5, ModTime: timestamppb.Now()}
	switch lie(r.Key) {
	case "negsize":
		o.Size = -1
	case "otherkey":
		o.Key = "some/other/key"
	}
	return o, nil
}

func (liar) List(r *pluginpb.ListRequest, stream pluginpb.Storage_ListServer) error {
	now := timestamppb.New(time.Now())
	obj := func(key string, size int64) *pluginpb.ObjectInfo {
		return &pluginpb.ObjectInfo{Key: key, Size: size, ModTime: now}
	}
	p := r.Prefix
	var objs []*pluginpb.ObjectInfo
	switch lie(p) {
	case "unsorted":
		objs = []*pluginpb.ObjectInfo{obj(p+"b", 1), obj(p+"a", 1)}
	case "dup":
		objs = []*pluginpb.ObjectInfo{obj(p+"a", 1), obj(p+"a", 1)}
	case "badkey":
		objs = []*pluginpb.ObjectInfo{obj(p+"../../etc/passwd", 1)}
	case "outside":
		objs = []*pluginpb.ObjectInfo{obj("zzz/elsewhere", 1)}
	case "negsize":
		objs = []*pluginpb.ObjectInfo{obj(p+"a", -7)}
	default:
		objs = []*pluginpb.ObjectInfo{obj(p+"a", 1)}
	}
	return stream.Send(&pluginpb.ListResponse{Objects: objs})
}

func (liar) Delete(_ context.Context, r *pluginpb.DeleteRequest) (*pluginpb.DeleteResponse, error) {
	for _, k := range r.Keys {
		if lie(k) == "odd" {
			return nil, status.Error(codes.DataLoss, "the disk ate it")
		}
	}
	return &pluginpb.DeleteResponse{}, nil
}
