package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// Ranged fetches. An object of at least rangedMin bytes, from a store that
// reads ranges (storage.RangeReader), is fetched in pieces of pieceSize
// with up to piecesInFlight ranged GETs at once, each written with pwrite
// at its offset of the preallocated file. One connection's stream is
// bound by one core on each side (TLS, the server's reads, the client's
// copy); pieces of one large object spread it over several, so that a
// checkpoint of a few large files is not fetched at the speed of a few
// connections. The values were measured (docs/performance.md, "Large
// files, round two").
const (
	rangedMin      = 2 * pieceSize
	pieceSize      = 16 << 20
	piecesInFlight = 4
)

// ranged reports whether f is fetched in pieces from s, and with what.
func ranged(s storage.Store, f manifests.File) (storage.RangeReader, bool) {
	if f.Inline != nil || f.Size < rangedMin {
		return nil, false
	}
	return storage.AsRangeReader(s)
}

// fetchRanged writes f's object into a new file of dir in pieces (see
// rangedMin). The content is checked in order while the pieces land: the
// verifier reads each piece back from the file (the page cache) as soon
// as it and every piece before it are written, so the hash of a file is
// done moments after its last byte. Each piece's writeback starts as soon
// as it is written (sync_file_range), so the fdatasync that makes the file
// durable (syncAll, before the store is placed) waits for little. A
// piece the store returns short or long fails the file, and with it the
// restore.
func fetchRanged(ctx context.Context, rr storage.RangeReader, dir *os.File, f manifests.File, progress func(int64)) error {
	full := filepath.Join(dir.Name(), f.Name) // for messages
	fd, err := unix.Openat(int(dir.Fd()), f.Name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return &os.PathError{Op: "create", Path: full, Err: err}
	}
	out := os.NewFile(uintptr(fd), full)
	defer out.Close()
	if err := unix.Fallocate(fd, 0, 0, f.Size); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return &os.PathError{Op: "allocate", Path: full, Err: err}
	}
	n := int((f.Size + pieceSize - 1) / pieceSize)
	written := make([]chan struct{}, n) // closed once piece i is in the file
	for i := range written {
		written[i] = make(chan struct{})
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	v := newVerifier(f)
	hashed := make(chan error, 1)
	go func() { hashed <- hashPieces(ctx, out, f.Size, written, v) }()

	sem := make(chan struct{}, piecesInFlight)
	errs := make(chan error, n)
	started := 0
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		started++
		go func() {
			err := fetchPiece(ctx, rr, out, f, int64(i)*pieceSize, progress)
			<-sem
			if err != nil {
				cancel() // the others stop, and the verifier
			} else {
				close(written[i])
			}
			errs <- err
		}()
	}
	var first error
	for range started {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first == nil {
		first = ctx.Err()
	}
	if first != nil {
		cancel()
		<-hashed
		return first
	}
	if err := <-hashed; err != nil {
		return err
	}
	if err := v.check(); err != nil {
		return err
	}
	return out.Close() // made durable by syncAll
}

// fetchPiece writes the piece of f's object at off (pieceSize bytes, or
// what is left) to out at the same offset, and starts its writeback.
func fetchPiece(ctx context.Context, rr storage.RangeReader, out *os.File, f manifests.File, off int64, progress func(int64)) error {
	length := min(pieceSize, f.Size-off)
	rc, err := rr.GetRange(ctx, f.Key, off, length)
	if err != nil {
		return err
	}
	defer rc.Close()
	bp := fsutil.GetBuf()
	defer fsutil.PutBuf(bp)
	buf := *bp
	for pos, end := off, off+length; pos < end; {
		k, err := io.ReadFull(rc, buf[:min(int64(len(buf)), end-pos)])
		if k > 0 {
			if werr := failpoint.Error(failpoint.LocalWrite); werr != nil {
				return &os.PathError{Op: "write", Path: out.Name(), Err: werr}
			}
			if _, werr := out.WriteAt(buf[:k], pos); werr != nil {
				return werr
			}
			pos += int64(k)
			if progress != nil {
				progress(int64(k))
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("storage returned %d bytes of the %d asked for at offset %d: the object is shorter than the %d bytes the manifest says", pos-off, length, off, f.Size)
		}
		if err != nil {
			return err
		}
	}
	// A server that ignored the range sends more than asked for.
	var one [1]byte
	if k, _ := io.ReadFull(rc, one[:]); k > 0 {
		return fmt.Errorf("storage returned more than the %d bytes asked for at offset %d", length, off)
	}
	// Start writing the piece back now: the fdatasync at the end of the
	// file then finds little left to write. (Only a hint: an error here
	// surfaces in that fdatasync.)
	unix.SyncFileRange(int(out.Fd()), off, length, unix.SYNC_FILE_RANGE_WRITE)
	return nil
}

// hashPieces feeds v the file's bytes in order: piece i as soon as it and
// every piece before it were written, read back from out.
func hashPieces(ctx context.Context, out *os.File, size int64, written []chan struct{}, v *verifier) error {
	bp := fsutil.GetBuf()
	defer fsutil.PutBuf(bp)
	buf := *bp
	for i, w := range written {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
		off := int64(i) * pieceSize
		end := min(off+pieceSize, size)
		for off < end {
			k, err := out.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
			v.Write(buf[:k])
			off += int64(k)
			if err != nil && off < end {
				return err
			}
		}
	}
	return nil
}
