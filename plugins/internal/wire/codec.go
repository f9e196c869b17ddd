package wire

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec Codec delegates to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Field numbers of the body chunk in the oneofs of PutRequest and
// GetResponse (plugins/proto/storage.proto).
const (
	PutChunkField = 2
	GetChunkField = 1
)

// Codec is the gRPC codec of host and plugin: protobuf, with one
// shortcut for body chunks, which are most of the bytes. Protobuf copies
// a message into a new buffer to send it and a bytes field into a new
// (zeroed) slice to receive it; Codec sends an *OutChunk's bytes as they
// are (gRPC returns the buffer to ChunkPool once written) and decodes a
// chunk into an *InChunk as a window of one pooled buffer. The bytes on
// the wire are the same protobuf either way, so a peer with the plain
// codec interoperates.
type Codec struct{}

var protoCodec = encoding.GetCodecV2("proto")

// Name is the content subtype: this is protobuf.
func (Codec) Name() string { return "proto" }

// Marshal encodes v.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	c, ok := v.(*OutChunk)
	if !ok {
		return protoCodec.Marshal(v)
	}
	data := *c.Buf
	hdr := protowire.AppendTag(nil, c.Field, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(len(data)))
	return mem.BufferSlice{mem.SliceBuffer(hdr), mem.NewBuffer(c.Buf, ChunkPool)}, nil
}

// Unmarshal decodes data into v.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	c, ok := v.(*InChunk)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	c.Free()
	n := data.Len()
	bp := ChunkPool.Get(n)
	data.CopyTo(*bp)
	b := *bp
	num, typ, tn := protowire.ConsumeTag(b)
	if tn > 0 && num == c.Field && typ == protowire.BytesType {
		if chunk, vn := protowire.ConsumeBytes(b[tn:]); vn > 0 && tn+vn == len(b) {
			c.buf, c.Data = bp, chunk
			return nil
		}
	}
	// Not a lone chunk (a header, a trailer): plain protobuf.
	defer ChunkPool.Put(bp)
	proto.Reset(c.Msg)
	if err := proto.Unmarshal(b, c.Msg); err != nil {
		return fmt.Errorf("decode %T: %w", c.Msg, err)
	}
	return nil
}

// OutChunk is a body chunk to send with SendMsg: the message
// {Field: bytes} of the stream's oneof. Buf must come from ChunkPool, and
// belongs to gRPC once SendMsg is called (it is returned to the pool
// after it is written, or dropped if the stream fails first).
type OutChunk struct {
	Field protowire.Number
	Buf   *[]byte
}

// InChunk receives a message of a body stream with RecvMsg: a chunk
// (field Field) lands in Data, a window of a pooled buffer that stays
// valid until Free or the next RecvMsg into this InChunk; any other
// message is decoded into Msg and Data is nil.
type InChunk struct {
	Field protowire.Number
	Msg   proto.Message
	Data  []byte
	buf   *[]byte
}

// Free returns the chunk's buffer to the pool; Data is nil after.
func (c *InChunk) Free() {
	if c.buf != nil {
		ChunkPool.Put(c.buf)
	}
	c.buf, c.Data = nil, nil
}

// ChunkPool holds the buffers of body chunks (up to ChunkSize and a
// message's framing); it does not zero them, since each is filled before
// it is read.
var ChunkPool mem.BufferPool = &chunkPool{}

type chunkPool struct{ p sync.Pool }

const chunkCap = ChunkSize + 64

func (p *chunkPool) Get(n int) *[]byte {
	if n > chunkCap {
		b := make([]byte, n)
		return &b
	}
	bp, ok := p.p.Get().(*[]byte)
	if !ok {
		b := make([]byte, chunkCap)
		bp = &b
	}
	*bp = (*bp)[:n]
	return bp
}

func (p *chunkPool) Put(bp *[]byte) {
	if cap(*bp) == chunkCap {
		*bp = (*bp)[:chunkCap]
		p.p.Put(bp)
	}
}
