package sdk

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"

	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/plugins/proto"
)

// pipeBody is the body of a Put while it arrives from the host: an
// io.ReadSeeker and io.ReaderAt over a buffer (a body of at most
// memBodyLimit bytes) or an unlinked temporary file, filled by receive.
// A read of bytes not received yet waits for them, so the store uploads
// while the host sends; a read that would return the body's last byte
// waits until the trailer's size and CRC-32C are checked, so a store
// never holds a whole body that is short, long or corrupt. Bytes once
// received stay, so the store may rewind and read again (retries,
// checksums before sending). A broken stream fails every waiting read.
type pipeBody struct {
	key  string
	size int64
	mem  []byte
	f    *os.File

	mu       sync.Mutex
	cond     *sync.Cond
	received int64 // bytes in mem or f
	checked  bool  // the trailer matched
	err      error // receive failed: every read fails with it
	refs     int   // the handler and the receiver; the file closes at 0
	off      int64 // Read and Seek position
	done     chan struct{}
}

var (
	_ io.ReadSeeker = (*pipeBody)(nil)
	_ io.ReaderAt   = (*pipeBody)(nil)
)

func newPipeBody(key string, size int64) (*pipeBody, error) {
	b := &pipeBody{key: key, size: size, refs: 2, done: make(chan struct{})}
	b.cond = sync.NewCond(&b.mu)
	if size <= memBodyLimit {
		b.mem = make([]byte, size)
		return b, nil
	}
	f, err := os.CreateTemp("", "ckpt-plugin-put-*")
	if err != nil {
		return nil, fmt.Errorf("put %s: spool the body: %w", key, err)
	}
	os.Remove(f.Name())
	b.f = f
	return b, nil
}

// receive reads the chunks and the trailer, checking the size and the
// CRC-32C. It ends when the trailer is checked or the stream fails (the
// handler's return ends the stream).
func (b *pipeBody) receive(stream pluginpb.Storage_PutServer) {
	defer close(b.done)
	defer b.release()
	err := b.receiveAll(stream)
	b.mu.Lock()
	if err != nil {
		b.err = err
	} else {
		b.checked = true
	}
	b.cond.Broadcast()
	b.mu.Unlock()
}

func (b *pipeBody) receiveAll(stream pluginpb.Storage_PutServer) error {
	crc := crc32.New(wire.Castagnoli)
	var n int64
	in := wire.InChunk{Field: wire.PutChunkField, Msg: &pluginpb.PutRequest{}}
	defer in.Free()
	for {
		err := stream.RecvMsg(&in)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return wire.InvalidArgument("put %s: the body ended after %d of %d bytes without a trailer", b.key, n, b.size)
			}
			return err
		}
		m := in.Msg.(*pluginpb.PutRequest)
		c := in.Data
		if c == nil {
			c = m.GetChunk()
		}
		if c != nil {
			if n+int64(len(c)) > b.size {
				return wire.InvalidArgument("put %s: more than the %d bytes declared", b.key, b.size)
			}
			crc.Write(c)
			if b.f != nil {
				if _, err := b.f.WriteAt(c, n); err != nil {
					return wire.ToStatus(fmt.Errorf("put %s: spool the body: %w", b.key, err))
				}
			} else {
				copy(b.mem[n:], c)
			}
			n += int64(len(c))
			b.mu.Lock()
			b.received = n
			b.cond.Broadcast()
			b.mu.Unlock()
			continue
		}
		t := m.GetTrailer()
		if t == nil {
			return wire.InvalidArgument("put %s: unexpected message", b.key)
		}
		if n != b.size {
			return wire.InvalidArgument("put %s: received %d bytes, %d declared", b.key, n, b.size)
		}
		if crc.Sum32() != t.Crc32C {
			return wire.InvalidArgument("put %s: CRC-32C of the received body %08x, the host sent %08x", b.key, crc.Sum32(), t.Crc32C)
		}
		return nil
	}
}

// wait returns once receive has ended, with its error: after a store's
// Put succeeded, which it cannot have without the last byte, so the
// trailer came.
func (b *pipeBody) wait() error {
	<-b.done
	return b.failed()
}

// failed returns receive's error, if it failed by now.
func (b *pipeBody) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// release drops one of the two references; the last closes the file.
func (b *pipeBody) release() {
	b.mu.Lock()
	b.refs--
	last := b.refs == 0
	if b.refs == 1 && !b.checked && b.err == nil {
		// The handler returned early: stop readers that still wait.
		b.err = fmt.Errorf("put %s: the call ended", b.key)
		b.cond.Broadcast()
	}
	b.mu.Unlock()
	if last && b.f != nil {
		b.f.Close()
	}
}

// ReadAt reads len(p) bytes at off, waiting until they have arrived.
func (b *pipeBody) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("put %s: read at negative offset %d", b.key, off)
	}
	// The end of the body (io.EOF) is reported only once it is checked
	// too: a store may take it for a complete body.
	end := min(off+int64(len(p)), b.size)
	b.mu.Lock()
	for b.err == nil && (b.received < end || (end == b.size && !b.checked)) {
		b.cond.Wait()
	}
	err := b.err
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if off >= b.size {
		return 0, io.EOF
	}
	p = p[:end-off]
	if b.f != nil {
		if _, err := b.f.ReadAt(p, off); err != nil {
			return 0, fmt.Errorf("put %s: read the spooled body: %w", b.key, err)
		}
	} else {
		copy(p, b.mem[off:end])
	}
	if end == b.size {
		return len(p), io.EOF
	}
	return len(p), nil
}

// Read reads from the position, waiting for bytes that have not arrived.
func (b *pipeBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := b.ReadAt(p, b.off)
	b.off += int64(n)
	if errors.Is(err, io.EOF) && n > 0 {
		err = nil
	}
	return n, err
}

// Seek moves the position; the size is known from the header, so
// io.SeekEnd does not wait.
func (b *pipeBody) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += b.off
	case io.SeekEnd:
		offset += b.size
	default:
		return 0, fmt.Errorf("put %s: seek: bad whence %d", b.key, whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("put %s: seek to negative offset %d", b.key, offset)
	}
	b.off = offset
	return offset, nil
}
