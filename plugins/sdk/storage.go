package sdk

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"sync"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/plugins/proto"
	"github.com/ckpt-io/ckpt/storage"
)

// memBodyLimit is the largest Put body held in memory; larger ones go to
// an unlinked temporary file, so memory stays flat whatever the object
// size and the store gets a re-readable body.
const memBodyLimit = 4 << 20

type storageServer struct {
	pluginpb.UnimplementedStorageServer
	open    storage.Opener
	schemes map[string]bool

	mu     sync.Mutex
	next   uint64
	stores map[uint64]storage.Store
}

func newStorageServer(open storage.Opener, schemes []string) *storageServer {
	s := &storageServer{open: open, schemes: map[string]bool{}, stores: map[uint64]storage.Store{}}
	for _, sc := range schemes {
		s.schemes[sc] = true
	}
	return s
}

func (s *storageServer) store(h uint64) (storage.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.stores[h]
	if !ok {
		return nil, wire.InvalidArgument("no open store with handle %d", h)
	}
	return st, nil
}

func (s *storageServer) Open(ctx context.Context, r *pluginpb.OpenRequest) (*pluginpb.OpenResponse, error) {
	u, err := url.Parse(r.Url)
	if err != nil {
		return nil, wire.InvalidArgument("storage URL: %v", err)
	}
	if !s.schemes[u.Scheme] {
		return nil, wire.InvalidArgument("storage URL scheme %q is not served by this plugin", u.Scheme)
	}
	st, err := s.open(ctx, u)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	_, cleans := storage.AsCleaner(st)
	s.mu.Lock()
	s.next++
	h := s.next
	s.stores[h] = st
	s.mu.Unlock()
	return &pluginpb.OpenResponse{Handle: h, Name: st.String(), CleansIncomplete: cleans}, nil
}

func (s *storageServer) Close(_ context.Context, r *pluginpb.CloseRequest) (*pluginpb.CloseResponse, error) {
	s.mu.Lock()
	st, ok := s.stores[r.Handle]
	delete(s.stores, r.Handle)
	s.mu.Unlock()
	if ok {
		if err := st.Close(); err != nil {
			return nil, wire.ToStatus(err)
		}
	}
	return &pluginpb.CloseResponse{}, nil
}

func (s *storageServer) Put(stream pluginpb.Storage_PutServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return wire.InvalidArgument("put: the first message is not a header")
	}
	if h.Size < 0 {
		return wire.InvalidArgument("put %s: negative size %d", h.Key, h.Size)
	}
	st, err := s.store(h.Handle)
	if err != nil {
		return err
	}
	body, err := newPipeBody(h.Key, h.Size)
	if err != nil {
		return wire.ToStatus(err)
	}
	defer body.release()
	// The store reads the body while it arrives: an upload starts with the
	// first chunk instead of after the last (see pipeBody).
	go body.receive(stream)
	if h.Create {
		err = st.Create(ctx, h.Key, body, h.Size)
	} else {
		err = st.Put(ctx, h.Key, body, h.Size)
	}
	if err != nil {
		if rerr := body.failed(); rerr != nil {
			return rerr // the body's fault, which failed the store's read
		}
		return wire.ToStatus(err)
	}
	if rerr := body.wait(); rerr != nil {
		// The body was short, long or corrupt, or the stream broke: the
		// store never saw its last byte, so it wrote nothing.
		return rerr
	}
	return stream.SendAndClose(&pluginpb.PutResponse{})
}

func (s *storageServer) Get(r *pluginpb.GetRequest, stream pluginpb.Storage_GetServer) error {
	ctx := stream.Context()
	st, err := s.store(r.Handle)
	if err != nil {
		return err
	}
	if r.Offset < 0 || r.Length < 0 {
		return wire.InvalidArgument("get %s: negative offset or length", r.Key)
	}
	rc, err := st.Get(ctx, r.Key)
	if err != nil {
		return wire.ToStatus(err)
	}
	defer rc.Close()
	var src io.Reader = rc
	if r.Offset > 0 {
		if sk, ok := rc.(io.Seeker); ok {
			_, err = sk.Seek(r.Offset, io.SeekStart)
		} else {
			_, err = io.CopyN(io.Discard, rc, r.Offset)
		}
		if errors.Is(err, io.EOF) {
			err = nil // an offset past the end reads nothing
		}
		if err != nil {
			return wire.ToStatus(fmt.Errorf("get %s: skip to %d: %w", r.Key, r.Offset, err))
		}
	}
	if r.Length > 0 {
		src = io.LimitReader(src, r.Length)
	}
	crc := crc32.New(wire.Castagnoli)
	var n int64
	for {
		// Each chunk has its own pooled buffer: gRPC sends it as it is and
		// returns it to the pool once written (see wire.Codec).
		bp := wire.ChunkPool.Get(wire.ChunkSize)
		m, err := io.ReadFull(src, *bp)
		if m > 0 {
			crc.Write((*bp)[:m])
			n += int64(m)
			*bp = (*bp)[:m]
			if serr := stream.SendMsg(&wire.OutChunk{Field: wire.GetChunkField, Buf: bp}); serr != nil {
				return serr
			}
		} else {
			wire.ChunkPool.Put(bp)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return wire.ToStatus(fmt.Errorf("get %s: %w", r.Key, err))
		}
	}
	return stream.Send(&pluginpb.GetResponse{Msg: &pluginpb.GetResponse_Trailer{Trailer: &pluginpb.GetTrailer{Size: n, Crc32C: crc.Sum32()}}})
}

func (s *storageServer) Stat(ctx context.Context, r *pluginpb.StatRequest) (*pluginpb.ObjectInfo, error) {
	st, err := s.store(r.Handle)
	if err != nil {
		return nil, err
	}
	info, err := st.Stat(ctx, r.Key)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return objectInfo(info), nil
}

func objectInfo(o storage.ObjectInfo) *pluginpb.ObjectInfo {
	return &pluginpb.ObjectInfo{Key: o.Key, Size: o.Size, ModTime: timestamppb.New(o.ModTime)}
}

func (s *storageServer) List(r *pluginpb.ListRequest, stream pluginpb.Storage_ListServer) error {
	st, err := s.store(r.Handle)
	if err != nil {
		return err
	}
	size := int(r.PageSize)
	if size <= 0 || size > 5000 {
		size = 1000
	}
	page := make([]*pluginpb.ObjectInfo, 0, size)
	err = st.List(stream.Context(), r.Prefix, func(o storage.ObjectInfo) error {
		page = append(page, objectInfo(o))
		if len(page) < size {
			return nil
		}
		err := stream.Send(&pluginpb.ListResponse{Objects: page})
		page = make([]*pluginpb.ObjectInfo, 0, size)
		if err != nil {
			return &sendError{err}
		}
		return nil
	})
	var se *sendError
	if errors.As(err, &se) {
		return se.err
	}
	if err != nil {
		return wire.ToStatus(err)
	}
	if len(page) > 0 {
		return stream.Send(&pluginpb.ListResponse{Objects: page})
	}
	return nil
}

type sendError struct{ err error }

func (e *sendError) Error() string { return e.err.Error() }

func (s *storageServer) Delete(ctx context.Context, r *pluginpb.DeleteRequest) (*pluginpb.DeleteResponse, error) {
	st, err := s.store(r.Handle)
	if err != nil {
		return nil, err
	}
	if err := st.Delete(ctx, r.Keys...); err != nil {
		return nil, wire.ToStatus(err)
	}
	return &pluginpb.DeleteResponse{}, nil
}

func (s *storageServer) CleanIncomplete(ctx context.Context, r *pluginpb.CleanIncompleteRequest) (*pluginpb.CleanIncompleteResponse, error) {
	st, err := s.store(r.Handle)
	if err != nil {
		return nil, err
	}
	c, ok := storage.AsCleaner(st)
	if !ok {
		return &pluginpb.CleanIncompleteResponse{}, nil
	}
	n, b, err := c.CleanIncomplete(ctx, r.Prefix, r.OlderThan.AsTime())
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return &pluginpb.CleanIncompleteResponse{Count: int64(n), Bytes: b}, nil
}

// Prober is implemented by stores that can check cheaply that they can be
// reached; the host's Probe calls it. Stores without it are probed with a
// listing that stops at the first object.
type Prober interface {
	Probe(ctx context.Context) error
}

func (s *storageServer) Probe(ctx context.Context, r *pluginpb.ProbeRequest) (*pluginpb.ProbeResponse, error) {
	if r.Handle == 0 {
		return &pluginpb.ProbeResponse{}, nil
	}
	st, err := s.store(r.Handle)
	if err != nil {
		return nil, err
	}
	if p, ok := st.(Prober); ok {
		err = p.Probe(ctx)
	} else {
		err = st.List(ctx, "", func(storage.ObjectInfo) error { return errStop })
		if errors.Is(err, errStop) {
			err = nil
		}
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return &pluginpb.ProbeResponse{}, nil
}
