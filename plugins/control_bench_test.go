package plugins_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ckpt-io/ckpt/plugins"
	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/plugins/proto"
)

// BenchmarkBoundaryMemstore moves 64 MiB objects through the memstore
// plugin: the boundary alone (gRPC over the Unix socket with mutual TLS,
// chunking, CRC-32C), no backend behind it.
func BenchmarkBoundaryMemstore(b *testing.B) {
	ctx := context.Background()
	h, err := plugins.Discover(ctx, plugins.Options{Dir: install(b, "memstore")})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	s, err := h.OpenStorage(ctx, "mem://bench")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := make([]byte, 64<<20)
	if err := s.Put(ctx, "k", bytes.NewReader(data), int64(len(data))); err != nil {
		b.Fatal(err)
	}
	b.Run("put", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for range b.N {
			if err := s.Put(ctx, "k", bytes.NewReader(data), int64(len(data))); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("get", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for range b.N {
			rc, err := s.Get(ctx, "k")
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, rc); err != nil {
				b.Fatal(err)
			}
			rc.Close()
		}
	})
}

// BenchmarkControlGRPCOverTLS is the control for the boundary: one gRPC
// stream of 1 MiB messages over a Unix socket with TLS (ECDSA P-256,
// AES-GCM, as go-plugin's AutoMTLS), both ends in this process, no
// checksums, no store, buffers reused: the most any plugin transport of
// this shape can move here.
func BenchmarkControlGRPCOverTLS(b *testing.B) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	pool := x509.NewCertPool()
	c, _ := x509.ParseCertificate(der)
	pool.AddCert(c)
	sock := filepath.Join(b.TempDir(), "s")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})),
		grpc.MaxSendMsgSize(wire.MaxMessageSize), grpc.InitialWindowSize(wire.StreamWindow), grpc.InitialConnWindowSize(wire.ConnWindow),
		grpc.ReadBufferSize(wire.IOBuffer), grpc.WriteBufferSize(wire.IOBuffer))
	const total = 64 << 20
	pluginpb.RegisterStorageServer(srv, controlServer{})
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "localhost"})),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageSize)),
		grpc.WithInitialWindowSize(wire.StreamWindow), grpc.WithInitialConnWindowSize(wire.ConnWindow),
		grpc.WithReadBufferSize(wire.IOBuffer), grpc.WithWriteBufferSize(wire.IOBuffer))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := pluginpb.NewStorageClient(conn)
	b.SetBytes(total)
	for range b.N {
		stream, err := client.Get(context.Background(), &pluginpb.GetRequest{Length: total})
		if err != nil {
			b.Fatal(err)
		}
		var n int64
		for {
			m, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n += int64(len(m.GetChunk()))
		}
		if n != total {
			b.Fatalf("received %d bytes", n)
		}
	}
}

type controlServer struct {
	pluginpb.UnimplementedStorageServer
}

func (controlServer) Get(r *pluginpb.GetRequest, stream pluginpb.Storage_GetServer) error {
	chunk := make([]byte, wire.ChunkSize)
	for n := int64(0); n < r.Length; n += int64(len(chunk)) {
		if err := stream.Send(&pluginpb.GetResponse{Msg: &pluginpb.GetResponse_Chunk{Chunk: chunk}}); err != nil {
			return err
		}
	}
	return nil
}
