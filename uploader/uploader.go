// Package uploader is the async phase's data path: it classifies a
// snapshot's files, hashes them as streams, decides which shared files are
// already stored by a confirmed checkpoint, and uploads the rest with
// bounded parallelism. It never writes a manifest: the caller commits one
// after Upload returns, so objects always precede the manifest naming them.
package uploader

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"ckpt/localrecovery"
	"ckpt/manifests"
	"ckpt/storage"
	"ckpt/telemetry"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// DefaultInlineMax is the size up to which private files are stored inside
// the manifest instead of as objects of their own.
const DefaultInlineMax = 64 << 10

// Request is one checkpoint's upload.
type Request struct {
	Store      storage.Store
	Job, Task  string
	Checkpoint uint64
	Snapshot   *localrecovery.Snapshot
	// Confirmed maps the content id of every shared object referenced by the
	// task's complete, retained manifests to its key. Only these are reused:
	// an object that merely exists in storage is uploaded again.
	Confirmed map[string]string
	// Hashes holds already known hashes by inode identity (see
	// localrecovery.HashIndex); files found there are not read at all.
	Hashes map[localrecovery.Identity]string
	// Concurrency bounds parallel hashing and transfers (default 4).
	Concurrency int
	// InlineMax is the largest private file kept inline (default 64 KiB).
	InlineMax int64
	// Full uploads every file even when a confirmed object holds it: the
	// full-checkpoint baseline that benchmarks compare against.
	Full bool
	// OnUpload, when set, is called after each object is written.
	OnUpload func(key string, size int64)
}

// Result is the outcome of an upload: the files of the manifest to write.
type Result struct {
	Files         []manifests.File // in snapshot order (by name)
	BytesWritten  int64            // bytes of objects written by this upload
	FilesUploaded int
	FilesReused   int
	BytesHashed   int64 // bytes read to compute hashes
	HashesReused  int   // files whose hash came from Request.Hashes
}

// Upload hashes, deduplicates and uploads a snapshot. It returns the
// manifest entries only when every object they name is durable in storage.
// On error (including ctx cancellation) objects written so far stay behind
// as orphans for GC: they are never referenced by a manifest.
func Upload(ctx context.Context, req Request) (*Result, error) {
	if req.Concurrency < 1 {
		req.Concurrency = 4
	}
	if req.InlineMax <= 0 {
		req.InlineMax = DefaultInlineMax
	}
	sn := req.Snapshot
	files := make([]manifests.File, len(sn.Files))
	var hashed atomic.Int64
	var hashesReused atomic.Int64

	// Phase 1: the identity of every file: hashes of shared files (from the
	// inode index or by reading them), inline bytes of small private files.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(req.Concurrency)
	for i, lf := range sn.Files {
		files[i] = manifests.File{Name: lf.Name, Kind: manifests.Classify(lf.Name), Size: lf.Size}
		f := &files[i]
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			switch {
			case f.Kind == manifests.Shared:
				if sha, ok := req.Hashes[lf.ID()]; ok {
					f.SHA256 = sha
					hashesReused.Add(1)
					return nil
				}
				sha, err := hashFile(gctx, sn.Path(lf.Name), lf.Size)
				if err != nil {
					return err
				}
				hashed.Add(lf.Size)
				f.SHA256 = sha
			case lf.Size <= req.InlineMax:
				data, err := readSmall(sn.Path(lf.Name), lf.Size)
				if err != nil {
					return err
				}
				sum := sha256.Sum256(data)
				f.SHA256, f.Inline = hex.EncodeToString(sum[:]), data
				if f.Inline == nil {
					f.Inline = []byte{}
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}

	// Phase 2: decide. Each distinct new shared content is uploaded once.
	res := &Result{BytesHashed: hashed.Load(), HashesReused: int(hashesReused.Load())}
	type job struct {
		idx int
		key string
	}
	var jobs []job
	planned := map[string]bool{}
	for i := range files {
		f := &files[i]
		switch {
		case f.Kind == manifests.Shared:
			id := f.ContentID()
			f.Key = manifests.SharedKey(req.Job, f.SHA256, f.Size)
			if key, ok := req.Confirmed[id]; ok && !req.Full && key == f.Key {
				res.FilesReused++
				continue
			}
			if planned[id] {
				res.FilesReused++ // same bytes as another file of this snapshot
				continue
			}
			planned[id] = true
			f.Uploaded = true
			res.FilesUploaded++
			jobs = append(jobs, job{i, f.Key})
		case f.Inline != nil:
			f.Uploaded = true
			res.FilesUploaded++
		default:
			f.Key = manifests.PrivateKey(req.Job, req.Task, req.Checkpoint, f.Name)
			f.Uploaded = true
			res.FilesUploaded++
			jobs = append(jobs, job{i, f.Key})
		}
	}

	// Phase 3: transfer. Each upload gets a span, up to maxSpans of them:
	// a checkpoint of thousands of files should not flood the trace.
	const maxSpans = 32
	tracer := telemetry.Tracer()
	var written atomic.Int64
	var mu sync.Mutex // guards files[].SHA256 of private objects
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(req.Concurrency)
	for i, j := range jobs {
		f := &files[j.idx]
		name, size, want := f.Name, f.Size, f.SHA256
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			ctx := gctx
			if i < maxSpans {
				var span trace.Span
				ctx, span = tracer.Start(gctx, "upload.object", trace.WithAttributes(
					attribute.String("ckpt.file", name), attribute.Int64("ckpt.size", size)))
				defer span.End()
			}
			sha, err := putFile(ctx, req.Store, j.key, sn.Path(name), size)
			if err != nil {
				return fmt.Errorf("upload %s: %w", name, err)
			}
			if want != "" && sha != "" && sha != want {
				return fmt.Errorf("upload %s: the file changed while it was being checkpointed (sha256 %s, then %s); snapshot files must be immutable", name, want, sha)
			}
			if want == "" {
				if sha == "" { // the backend read the body in a way we could not follow
					if sha, err = hashFile(gctx, sn.Path(name), size); err != nil {
						return err
					}
				}
				mu.Lock()
				f.SHA256 = sha
				mu.Unlock()
			}
			written.Add(size)
			if req.OnUpload != nil {
				req.OnUpload(j.key, size)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	res.Files = files
	res.BytesWritten = written.Load()
	return res, nil
}

// hashBuf is the read size for hashing; large reads keep syscalls cheap.
const hashBuf = 1 << 20

var bufPool = sync.Pool{New: func() any { b := make([]byte, hashBuf); return &b }}

// hashFile streams a file through SHA-256 and checks its size.
func hashFile(ctx context.Context, path string, size int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		k, err := f.Read(*bp)
		h.Write((*bp)[:k])
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("hash %s: %w", path, err)
		}
	}
	if n != size {
		return "", fmt.Errorf("hash %s: read %d bytes, the snapshot had %d: snapshot files must be immutable", path, n, size)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func readSmall(path string, size int64) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != size {
		return nil, fmt.Errorf("read %s: %d bytes, the snapshot had %d: snapshot files must be immutable", path, len(data), size)
	}
	return data, nil
}

// putFile uploads a file and returns the SHA-256 of the bytes the backend
// read in its last full pass, or "" when it did not read in one pass.
func putFile(ctx context.Context, s storage.Store, key, path string, size int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	hr := &hashingReader{r: f, h: sha256.New(), valid: true}
	if err := s.Put(ctx, key, hr, size); err != nil {
		return "", err
	}
	if !hr.valid || hr.pos != size {
		return "", nil
	}
	return hex.EncodeToString(hr.h.Sum(nil)), nil
}

// hashingReader hashes what a backend reads, so an upload proves that the
// bytes sent are the bytes hashed. A rewind to the start resets the hash;
// any other seek makes the pass unverifiable (valid=false).
type hashingReader struct {
	r     io.ReadSeeker
	h     hash.Hash
	pos   int64
	valid bool
}

func (r *hashingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if r.valid {
		r.h.Write(p[:n])
	}
	r.pos += int64(n)
	return n, err
}

func (r *hashingReader) Seek(off int64, whence int) (int64, error) {
	pos, err := r.r.Seek(off, whence)
	if err != nil {
		return pos, err
	}
	if pos == 0 {
		r.h.Reset()
		r.valid = true
	} else if pos != r.pos {
		r.valid = false
	}
	r.pos = pos
	return pos, nil
}
