package plugins_test

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/ckpt-io/ckpt/plugins"
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
