package plugins

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/plugins/proto"
	"github.com/ckpt-io/ckpt/storage"
)

// deleteBatch bounds the keys of one Delete call.
const deleteBatch = 1000

// OpenStorage opens a storage URL with the plugin that serves its scheme.
func (h *Host) OpenStorage(ctx context.Context, rawURL string) (storage.Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("storage URL %q: %w", rawURL, err)
	}
	p := h.storagePlugin(u.Scheme)
	if p == nil {
		return nil, fmt.Errorf("storage URL scheme %q: no plugin in %s serves it", u.Scheme, h.opts.Dir)
	}
	s := &Store{p: p, url: rawURL}
	if _, _, err := s.handle(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (h *Host) storagePlugin(scheme string) *Plugin {
	for _, p := range h.plugins {
		for _, s := range p.info.Schemes {
			if s == scheme {
				return p
			}
		}
	}
	return nil
}

// Schemes lists the URL schemes the storage plugins serve.
func (h *Host) Schemes() []string {
	var out []string
	for _, p := range h.plugins {
		out = append(out, p.info.Schemes...)
	}
	return out
}

// Store is a storage.Store served by a plugin.
type Store struct {
	p   *Plugin
	url string

	mu     sync.Mutex
	h      uint64
	gen    uint64
	name   string
	closed bool
}

var _ storage.Store = (*Store)(nil)
var _ storage.IncompleteCleaner = (*Store)(nil)

// handle returns the plugin's current process and this store's handle in
// it, opening the URL again in a process that was restarted.
func (s *Store) handle(ctx context.Context) (*session, uint64, error) {
	sess, err := s.p.connect()
	if err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, 0, fmt.Errorf("%s: store closed", s.p.label())
	}
	if s.gen == sess.gen {
		return sess, s.h, nil
	}
	r, err := pluginpb.NewStorageClient(sess.conn).Open(ctx, &pluginpb.OpenRequest{Url: s.url})
	if err != nil {
		err = s.p.fail(ctx, sess, "open storage", err)
		var pe *Error
		if errors.As(err, &pe) && !pe.Crashed {
			return nil, 0, &storage.OpenError{Msg: pe.Error(), Err: err}
		}
		return nil, 0, err
	}
	s.h, s.gen, s.name = r.Handle, sess.gen, r.Name
	return sess, s.h, nil
}

func (s *Store) client(ctx context.Context) (pluginpb.StorageClient, *session, uint64, error) {
	sess, h, err := s.handle(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	return pluginpb.NewStorageClient(sess.conn), sess, h, nil
}

// String names the store as the plugin does, with the plugin.
func (s *Store) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%s (plugin %s)", s.name, s.p.label())
}

// Close closes the store's handle in the plugin.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	h, gen := s.h, s.gen
	s.mu.Unlock()
	s.p.mu.Lock()
	sess := s.p.sess
	s.p.mu.Unlock()
	if sess == nil || sess.gen != gen || sess.client.Exited() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pluginpb.NewStorageClient(sess.conn).Close(ctx, &pluginpb.CloseRequest{Handle: h})
	return s.p.fail(ctx, sess, "close storage", err)
}

// Put implements storage.Store.
func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.put(ctx, "put", key, body, size, false)
}

// Create implements storage.Store.
func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.put(ctx, "create", key, body, size, true)
}

func (s *Store) put(ctx context.Context, op, key string, body io.Reader, size int64, create bool) error {
	what := op + " " + key
	if err := storage.ValidKey(key); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if size < 0 {
		return fmt.Errorf("%s: negative size %d", what, size)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	c, sess, h, err := s.client(ctx)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Put(sctx)
	if err != nil {
		return s.p.fail(ctx, sess, what, err)
	}
	// A failed send means the stream ended: its status comes from
	// CloseAndRecv.
	sendErr := stream.Send(&pluginpb.PutRequest{Msg: &pluginpb.PutRequest_Header{Header: &pluginpb.PutHeader{Handle: h, Key: key, Size: size, Create: create}}})
	crc := crc32.New(wire.Castagnoli)
	var n int64
	for sendErr == nil && n < size {
		// Each chunk has its own pooled buffer: gRPC sends it as it is and
		// returns it to the pool once written (see wire.Codec).
		bp := wire.ChunkPool.Get(int(min(size-n, wire.ChunkSize)))
		m, rerr := io.ReadFull(body, *bp)
		n += int64(m)
		if m > 0 {
			crc.Write((*bp)[:m])
			*bp = (*bp)[:m]
			sendErr = stream.SendMsg(&wire.OutChunk{Field: wire.PutChunkField, Buf: bp})
		} else {
			wire.ChunkPool.Put(bp)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			cancel()
			return fmt.Errorf("%s: the body holds %d bytes, %d declared", what, n, size)
		}
		if rerr != nil {
			cancel()
			return fmt.Errorf("%s: read the body: %w", what, rerr)
		}
	}
	if sendErr == nil {
		var one [1]byte
		if m, _ := io.ReadFull(body, one[:]); m > 0 {
			cancel()
			return fmt.Errorf("%s: the body holds more than the %d bytes declared", what, size)
		}
		sendErr = stream.Send(&pluginpb.PutRequest{Msg: &pluginpb.PutRequest_Trailer{Trailer: &pluginpb.PutTrailer{Crc32C: crc.Sum32()}}})
	}
	_, err = stream.CloseAndRecv()
	if err == nil && sendErr != nil {
		err = sendErr
	}
	return s.p.fail(ctx, sess, what, err)
}

// Get implements storage.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.GetRange(ctx, key, 0, 0)
}

// GetRange reads length bytes (0: to the end) of an object from offset.
func (s *Store) GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	what := "get " + key
	if err := storage.ValidKey(key); err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	c, sess, h, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.Get(sctx, &pluginpb.GetRequest{Handle: h, Key: key, Offset: offset, Length: length})
	if err != nil {
		cancel()
		return nil, s.p.fail(ctx, sess, what, err)
	}
	// The first message tells a missing key from an object: receive it
	// here, so that Get itself returns ErrNotFound.
	r := &getReader{s: s, ctx: ctx, sess: sess, what: what, stream: stream, cancel: cancel, crc: crc32.New(wire.Castagnoli),
		in: wire.InChunk{Field: wire.GetChunkField, Msg: &pluginpb.GetResponse{}}}
	if err := stream.RecvMsg(&r.in); err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: the plugin %s ended the stream without a trailer", what, s.p.label())
		}
		return nil, s.p.fail(ctx, sess, what, err)
	}
	r.pending = true
	return r, nil
}

type getReader struct {
	s       *Store
	ctx     context.Context
	sess    *session
	what    string
	stream  pluginpb.Storage_GetClient
	cancel  context.CancelFunc
	in      wire.InChunk // the last message received
	pending bool         // in is not consumed yet
	chunk   []byte       // the unread part of in.Data
	crc     interface {
		io.Writer
		Sum32() uint32
	}
	n   int64
	err error
}

func (r *getReader) Read(p []byte) (int, error) {
	for len(r.chunk) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if !r.pending {
			err := r.stream.RecvMsg(&r.in)
			if errors.Is(err, io.EOF) {
				r.err = fmt.Errorf("%s: the stream from plugin %s ended after %d bytes without a trailer: %w", r.what, r.s.p.label(), r.n, io.ErrUnexpectedEOF)
				continue
			}
			if err != nil {
				r.err = r.s.p.fail(r.ctx, r.sess, r.what, err)
				continue
			}
		}
		r.pending = false
		if r.in.Data == nil {
			m := r.in.Msg.(*pluginpb.GetResponse)
			if t := m.GetTrailer(); t != nil {
				switch {
				case t.Size != r.n:
					r.err = fmt.Errorf("%s: received %d bytes, plugin %s sent %d", r.what, r.n, r.s.p.label(), t.Size)
				case t.Crc32C != r.crc.Sum32():
					r.err = fmt.Errorf("%s: CRC-32C of the %d bytes received is %08x, plugin %s sent %08x", r.what, r.n, r.crc.Sum32(), r.s.p.label(), t.Crc32C)
				default:
					r.err = io.EOF
				}
				r.cancel()
				continue
			}
			r.chunk = m.GetChunk()
		} else {
			r.chunk = r.in.Data
		}
		r.crc.Write(r.chunk)
		r.n += int64(len(r.chunk))
	}
	n := copy(p, r.chunk)
	r.chunk = r.chunk[n:]
	return n, nil
}

func (r *getReader) Close() error {
	r.cancel()
	r.chunk = nil
	r.in.Free()
	return nil
}

// Stat implements storage.Store.
func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	if err := storage.ValidKey(key); err != nil {
		return storage.ObjectInfo{}, fmt.Errorf("stat: %w", err)
	}
	c, sess, h, err := s.client(ctx)
	if err != nil {
		return storage.ObjectInfo{}, err
	}
	o, err := c.Stat(ctx, &pluginpb.StatRequest{Handle: h, Key: key})
	if err != nil {
		return storage.ObjectInfo{}, s.p.fail(ctx, sess, "stat "+key, err)
	}
	if o.Key != key || o.Size < 0 {
		return storage.ObjectInfo{}, fmt.Errorf("stat %s: plugin %s answered for key %q with size %d: a broken plugin, report it to its author", key, s.p.label(), o.Key, o.Size)
	}
	return objectInfo(o), nil
}

func objectInfo(o *pluginpb.ObjectInfo) storage.ObjectInfo {
	return storage.ObjectInfo{Key: o.Key, Size: o.Size, ModTime: o.ModTime.AsTime()}
}

// List implements storage.Store: the plugin streams pages, and the
// stream's flow control keeps at most a few pages in flight.
func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	what := fmt.Sprintf("list %q", prefix)
	c, sess, h, err := s.client(ctx)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.List(sctx, &pluginpb.ListRequest{Handle: h, Prefix: prefix})
	if err != nil {
		return s.p.fail(ctx, sess, what, err)
	}
	last, first := "", true
	for {
		page, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return s.p.fail(ctx, sess, what, err)
		}
		for _, o := range page.Objects {
			// A listing decides what GC deletes and what a checkpoint
			// reuses: a malformed one fails the call, it is not passed on.
			var bad string
			switch {
			case storage.ValidKey(o.Key) != nil:
				bad = storage.ValidKey(o.Key).Error()
			case !strings.HasPrefix(o.Key, prefix):
				bad = "it is not under the prefix"
			case o.Size < 0:
				bad = fmt.Sprintf("negative size %d", o.Size)
			case !first && o.Key <= last:
				bad = fmt.Sprintf("out of order after %q (keys come in strictly increasing order)", last)
			}
			if bad != "" {
				return fmt.Errorf("%s: plugin %s listed key %q: %s: a broken plugin, report it to its author", what, s.p.label(), o.Key, bad)
			}
			last, first = o.Key, false
			if err := fn(objectInfo(o)); err != nil {
				return err
			}
		}
	}
}

// Delete implements storage.Store, in batches of 1000 keys.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	for len(keys) > 0 {
		n := min(len(keys), deleteBatch)
		batch := keys[:n]
		keys = keys[n:]
		c, sess, h, err := s.client(ctx)
		if err != nil {
			return err
		}
		if _, err := c.Delete(ctx, &pluginpb.DeleteRequest{Handle: h, Keys: batch}); err != nil {
			return s.p.fail(ctx, sess, fmt.Sprintf("delete %d keys from %s", len(batch), batch[0]), err)
		}
	}
	return nil
}

// CleanIncomplete implements storage.IncompleteCleaner; a plugin whose
// store leaves nothing incomplete removes nothing.
func (s *Store) CleanIncomplete(ctx context.Context, prefix string, olderThan time.Time) (int, int64, error) {
	c, sess, h, err := s.client(ctx)
	if err != nil {
		return 0, 0, err
	}
	r, err := c.CleanIncomplete(ctx, &pluginpb.CleanIncompleteRequest{Handle: h, Prefix: prefix, OlderThan: timestamppb.New(olderThan)})
	if err != nil {
		return 0, 0, s.p.fail(ctx, sess, "clean incomplete writes under "+prefix, err)
	}
	return int(r.Count), r.Bytes, nil
}

// Probe checks that the plugin answers and that its store can be reached.
func (s *Store) Probe(ctx context.Context) error {
	c, sess, h, err := s.client(ctx)
	if err != nil {
		return err
	}
	_, err = c.Probe(ctx, &pluginpb.ProbeRequest{Handle: h})
	return s.p.fail(ctx, sess, "probe", err)
}

var _ storage.Locator = (*Store)(nil)

// Location returns the storage URL the store was opened with (without
// user info): the plugin reaches what that URL names.
func (s *Store) Location() string {
	if u, err := url.Parse(s.url); err == nil {
		u.User = nil
		return u.String()
	}
	return s.url
}
