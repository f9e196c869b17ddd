package sdk

import (
	"context"
	"errors"
	"hash/crc32"
	"io"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/plugins/proto"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// putStream is the server side of a Put stream: it hands out msgs, then
// io.EOF (the host closed its side).
type putStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*pluginpb.PutRequest
	resp *pluginpb.PutResponse
}

func (s *putStream) Context() context.Context { return s.ctx }

func (s *putStream) Recv() (*pluginpb.PutRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

// RecvMsg decodes the next message with wire.Codec, as gRPC would.
func (s *putStream) RecvMsg(m any) error {
	r, err := s.Recv()
	if err != nil {
		return err
	}
	b, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	return wire.Codec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
}

func (s *putStream) SendAndClose(r *pluginpb.PutResponse) error {
	s.resp = r
	return nil
}

// putMsgs frames body as the host does, in chunks of chunk bytes, with
// the declared size and the trailer's CRC given.
func putMsgs(h uint64, key string, body []byte, size int64, chunk int, crc uint32) []*pluginpb.PutRequest {
	msgs := []*pluginpb.PutRequest{{Msg: &pluginpb.PutRequest_Header{Header: &pluginpb.PutHeader{Handle: h, Key: key, Size: size}}}}
	for len(body) > 0 {
		n := min(chunk, len(body))
		msgs = append(msgs, &pluginpb.PutRequest{Msg: &pluginpb.PutRequest_Chunk{Chunk: body[:n]}})
		body = body[n:]
	}
	return append(msgs, &pluginpb.PutRequest{Msg: &pluginpb.PutRequest_Trailer{Trailer: &pluginpb.PutTrailer{Crc32C: crc}}})
}

// TestPutBodyIsCheckedBeforeTheStoreHasIt: a body that is short, long or
// corrupt fails the Put with InvalidArgument, and the store never
// commits it, in memory and spooled, though it reads the body while it
// arrives.
func TestPutBodyIsCheckedBeforeTheStoreHasIt(t *testing.T) {
	ctx := context.Background()
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := newStorageServer(func(context.Context, *url.URL) (storage.Store, error) { return fs, nil }, []string{"t"})
	o, err := srv.Open(ctx, &pluginpb.OpenRequest{Url: "t://x"})
	if err != nil {
		t.Fatal(err)
	}
	// An empty body's end is not reported before its trailer is checked.
	for name, msgs := range map[string][]*pluginpb.PutRequest{
		"with a byte too many": putMsgs(o.Handle, "k", []byte{1}, 0, 1, 0),
		"with a wrong CRC-32C": putMsgs(o.Handle, "k", nil, 0, 1, 1),
	} {
		if err := srv.Put(&putStream{ctx: ctx, msgs: msgs}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("empty body %s: %v, want InvalidArgument", name, err)
		}
		if _, err := fs.Stat(ctx, "k"); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("empty body %s: the store committed it (%v)", name, err)
		}
	}
	for _, size := range []int{3 << 20, 9 << 20} { // in memory; spooled
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i * 7)
		}
		sum := crc32.Checksum(body, wire.Castagnoli)
		for _, tc := range []struct {
			name string
			msgs []*pluginpb.PutRequest
			want string
		}{
			{"a corrupt body", putMsgs(o.Handle, "k", body, int64(size), 1<<20, sum^1), "CRC-32C"},
			{"a short body", putMsgs(o.Handle, "k", body[:size-1], int64(size), 1<<20, crc32.Checksum(body[:size-1], wire.Castagnoli)), "received"},
			{"a long body", putMsgs(o.Handle, "k", append(body, 1), int64(size), 1<<20, sum), "more than"},
			{"a body without a trailer", putMsgs(o.Handle, "k", body, int64(size), 1<<20, sum)[:size>>20+1], "without a trailer"},
		} {
			err := srv.Put(&putStream{ctx: ctx, msgs: tc.msgs})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%d bytes, %s: %v, want InvalidArgument saying %q", size, tc.name, err, tc.want)
			}
			if _, err := fs.Stat(ctx, "k"); !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("%d bytes, %s: the store committed it (%v)", size, tc.name, err)
			}
		}
		st := &putStream{ctx: ctx, msgs: putMsgs(o.Handle, "k", body, int64(size), 1<<20, sum)}
		if err := srv.Put(st); err != nil || st.resp == nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		rc, err := fs.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(rc)
		rc.Close()
		if string(got) != string(body) {
			t.Fatalf("%d bytes: stored %d bytes that differ", size, len(got))
		}
		fs.Delete(ctx, "k")
	}
}
