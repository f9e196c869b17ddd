// Package uploader is the async phase's data path: it classifies a
// snapshot's files, hashes them as streams, decides which shared files are
// already stored by a confirmed checkpoint, and uploads the rest with
// bounded parallelism. It never writes a manifest: the caller commits one
// after Upload returns, so objects always precede the manifest naming them.
package uploader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ckpt-io/ckpt/engines"
	"go.opentelemetry.io/otel"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"

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
	// Epoch is the writer's ownership epoch: private objects go under
	// manifests.PrivateKeyOf(..., Epoch), apart from any other owner's.
	Epoch    uint64
	Snapshot *localrecovery.Snapshot
	// Confirmed holds every shared object referenced by the task's
	// complete, retained manifests, by content. Only these are reused: an
	// object that merely exists in storage is uploaded again.
	Confirmed *Confirmed
	// Previous, when set, is the task's newest complete checkpoint as its
	// local copy recorded it. A snapshot file of the same name and inode
	// identity holds the same bytes: its hash is taken from there, and so
	// is its object when Previous.Confirmed.
	Previous *Previous
	// Hashes holds already known hashes by inode identity (see
	// localrecovery.HashIndex), for the files Previous does not know;
	// files found there are not read at all.
	Hashes map[localrecovery.Identity]string
	// Alg hashes the files whose hash is not known (default
	// manifests.BLAKE3, format 2's). A known hash of another algorithm
	// (Hashes) is kept, so the content id of a file stored before a change
	// of algorithm stays the same and its object is reused; with
	// manifests.SHA256 (format 1) known BLAKE3 hashes are not used.
	Alg manifests.Alg
	// Concurrency bounds parallel hashing and transfers (default 4).
	Concurrency int
	// InlineMax is the largest private file kept inline (default 64 KiB).
	InlineMax int64
	// Classify says whether a file is shared (immutable, deduplicated) or
	// private; the engine's classification (default
	// engines.SharedBySuffix: *.sst and *.blob shared).
	Classify func(name string) manifests.Kind
	// Presence, when set, confirms after the transfers that every object
	// the upload reuses still exists with its size (see Presence for the
	// bound); one that does not is uploaded again from the snapshot and
	// counted as uploaded. Shared objects this upload writes are recorded
	// in it. Nil trusts Confirmed alone.
	Presence *Presence
}

// Previous is a complete checkpoint's file table (in name order, as a
// manifest the agent wrote lists them) with the inode identity of each
// file in its local copy when it completed (same index; the zero Identity
// when unknown). The local copy holds a hard link to each of those
// inodes, so none of them can be freed and reused while it exists: a
// snapshot file with the same name and identity (device, inode, size,
// mtime) is the same bytes.
type Previous struct {
	Files []manifests.File
	IDs   []localrecovery.Identity
	// Confirmed says Files is the file table of a manifest the task
	// retains: its shared objects may be reused (invariant 3).
	Confirmed bool
}

// Result is the outcome of an upload: the files of the manifest to write.
type Result struct {
	Files         []manifests.File // in snapshot order (by name)
	BytesWritten  int64            // bytes of objects written by this upload
	FilesUploaded int
	FilesReused   int
	BytesHashed   int64 // bytes read to compute hashes
	HashesReused  int   // files whose hash came from Request.Hashes
	// Replaced lists the confirmed objects Presence found missing or of
	// the wrong size, which this upload wrote again from the snapshot.
	Replaced []Finding
	// Rekeyed lists the keys marked for deletion by GC whose bytes
	// AvoidMarked stored again under fresh keys.
	Rekeyed []string
}

// Upload hashes, deduplicates and uploads a snapshot. It returns the
// manifest entries only when every object they name is durable in storage.
// On error (including ctx cancellation) objects written so far stay behind
// as orphans for GC: they are never referenced by a manifest.
//
// A shared file that Request.Previous knows by name and inode costs a
// step of a walk in name order, and no worker: in a state of 100,000
// files, all but the new ones. One whose hash Request.Hashes knows costs
// a lookup by content among the confirmed objects of its size. Every
// other file goes through one pipeline in its own worker: identify (a
// streaming hash of Request.Alg), decide (reuse a confirmed object, or
// claim the upload of its content), transfer. Hashing one file overlaps
// the upload of another; no phase waits for all files.
func Upload(ctx context.Context, req Request) (*Result, error) {
	if req.Concurrency < 1 {
		req.Concurrency = 4
	}
	if req.Alg == 0 {
		req.Alg = manifests.BLAKE3
	}
	if req.InlineMax <= 0 {
		req.InlineMax = DefaultInlineMax
	}
	if req.Classify == nil {
		req.Classify = engines.SharedBySuffix
	}
	sn := req.Snapshot
	u := &upload{req: req, res: &Result{Files: make([]manifests.File, len(sn.Files))},
		claimed: map[contentKey]bool{}, tracer: otel.Tracer("ckpt")}
	var rest []int // shared files Previous does not know, and private ones
	sizes := map[int64]bool{}
	prev := 0 // walks Previous.Files in name order
	for i, lf := range sn.Files {
		f := &u.res.Files[i]
		*f = manifests.File{Name: lf.Name, Kind: req.Classify(lf.Name), Size: lf.Size}
		if f.Kind == manifests.Shared {
			if u.previous(lf, f, &prev) {
				continue
			}
			sizes[lf.Size] = true
		}
		rest = append(rest, i)
	}
	if len(sizes) > 0 {
		u.confirmed = req.Confirmed.index(sizes)
	}
	var work []int // files for the workers
	for _, i := range rest {
		lf, f := sn.Files[i], &u.res.Files[i]
		// A hash known (from Previous or Hashes) is decided now; the
		// workers hash the others and decide them as they go.
		if f.Kind == manifests.Shared && (f.Digest() != "" || u.known(lf, f)) && !u.dedup(f) {
			continue // reused, or another file of the snapshot uploads it
		}
		work = append(work, i)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(req.Concurrency)
	for _, i := range largestFirst(sn.Files, work) {
		lf, f := sn.Files[i], &u.res.Files[i]
		g.Go(func() error { return u.file(gctx, lf, f) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if req.Presence != nil {
		if err := u.confirmReused(ctx); err != nil {
			return nil, err
		}
	}
	return u.res, nil
}

// previous decides the shared file f (of the snapshot's file lf) from
// Request.Previous, whose files it walks in name order from *at: when it
// holds a file of that name and inode identity, f takes its hash, and its
// object when Previous.Confirmed (f then counts as reused, and Upload is
// done with it). False when Previous does not know the file, or its hash
// is of an algorithm this upload may not use.
func (u *upload) previous(lf localrecovery.File, f *manifests.File, at *int) bool {
	pv := u.req.Previous
	if pv == nil {
		return false
	}
	for *at < len(pv.Files) && pv.Files[*at].Name < lf.Name {
		*at++
	}
	j := *at
	if j >= len(pv.Files) || j >= len(pv.IDs) || pv.Files[j].Name != lf.Name {
		return false
	}
	p := &pv.Files[j]
	if id := lf.ID(); pv.IDs[j] != id || id == (localrecovery.Identity{}) || p.Size != lf.Size ||
		(p.SHA256 == "") == (p.BLAKE3 == "") || (u.req.Alg == manifests.SHA256 && p.BLAKE3 != "") {
		return false
	}
	f.SHA256, f.BLAKE3 = p.SHA256, p.BLAKE3
	u.res.HashesReused++
	if !pv.Confirmed || p.Kind != manifests.Shared || p.Key == "" {
		return false // the hash only: decided with the others
	}
	f.Key = p.Key
	u.res.FilesReused++
	return true
}

// confirmRounds bounds the checks of reused objects: re-uploads take time,
// and a second check makes sure the others did not age past the bound
// meanwhile (it costs nothing while the observations are fresh).
const confirmRounds = 3

// confirmReused checks that every object the upload reuses is still stored
// with its size, and uploads the ones that are not again, from the
// snapshot's file: the manifest must only name objects that are there.
func (u *upload) confirmReused(ctx context.Context) error {
	for range confirmRounds {
		// One object per reused file: two files of one content (rare)
		// name the same object twice, which the check takes as it comes.
		var objs []Object
		for i := range u.res.Files {
			f := &u.res.Files[i]
			if f.Kind == manifests.Shared && !f.Uploaded && f.Key != "" {
				objs = append(objs, Object{Key: f.Key, Size: f.Size})
			}
		}
		if len(objs) == 0 {
			return nil
		}
		bad, err := u.req.Presence.Check(ctx, objs)
		if err != nil {
			return err
		}
		if len(bad) == 0 {
			return nil
		}
		byKey := map[string][]int{}
		for _, b := range bad {
			byKey[b.Key] = nil
		}
		for i, f := range u.res.Files {
			if idx, ok := byKey[f.Key]; ok && f.Kind == manifests.Shared && !f.Uploaded {
				byKey[f.Key] = append(idx, i)
			}
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(u.req.Concurrency)
		var found []Finding
		for _, b := range bad {
			idx := byKey[b.Key]
			if idx == nil {
				continue // named twice: replaced once
			}
			byKey[b.Key] = nil
			found = append(found, b)
			g.Go(func() error { return u.replace(gctx, idx) })
		}
		if err := g.Wait(); err != nil {
			return err
		}
		u.res.Replaced = append(u.res.Replaced, found...)
	}
	return fmt.Errorf("reused objects kept vanishing from storage while the checkpoint confirmed them")
}

// replace uploads the object of the files at idx (one content) again from
// the first one's snapshot file, verifying what is sent as it goes (see
// putFile): the object must be the bytes its key names. The files then
// count as uploaded, once.
func (u *upload) replace(ctx context.Context, idx []int) error {
	f := &u.res.Files[idx[0]]
	var lf localrecovery.File
	for _, x := range u.req.Snapshot.Files {
		if x.Name == f.Name {
			lf = x
		}
	}
	if _, err := putSnapshotFile(ctx, u.req.Store, f.Key, u.req.Snapshot, lf, 0, f.Digest()); err != nil {
		return fmt.Errorf("upload %s again: %w", f.Name, err)
	}
	u.req.Presence.Saw(f.Key, f.Size, time.Now())
	u.tally(func(r *Result) {
		f.Uploaded = true
		r.FilesReused--
		r.FilesUploaded++
		r.BytesWritten += f.Size
	})
	return nil
}

// largestFirst returns the indexes of files listed in idx, largest file
// first: the last to start are the small ones, so the workers finish
// together, not one large file alone at the end.
func largestFirst(files []localrecovery.File, idx []int) []int {
	order := slices.Clone(idx)
	sort.SliceStable(order, func(a, b int) bool { return files[order[a]].Size > files[order[b]].Size })
	return order
}

// maxSpans bounds the upload spans of one checkpoint: a checkpoint of
// thousands of files should not flood the trace.
const maxSpans = 32

// upload is the state one Upload shares among its workers.
type upload struct {
	req     Request
	res     *Result
	mu      sync.Mutex          // guards res counters and claimed
	claimed map[contentKey]bool // contents this snapshot uploads
	// confirmed indexes Request.Confirmed for the sizes of the files that
	// Previous does not decide (read-only once the workers start).
	confirmed map[contentKey]*manifests.File
	spans     atomic.Int64
	tracer    trace.Tracer
}

// body is what a file's transfer sends: the object key ("" when nothing is
// to be sent), and the file's bytes when they were read whole
// (bufferedMax), held until release.
type body struct {
	key     string
	data    []byte
	release func()
}

// tally updates the result's counters under the lock.
func (u *upload) tally(fn func(r *Result)) {
	u.mu.Lock()
	fn(u.res)
	u.mu.Unlock()
}

// file is the pipeline of one file: the path of its kind, then the
// transfer of its object if that path chose to send one.
func (u *upload) file(ctx context.Context, lf localrecovery.File, f *manifests.File) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The one open of the file: the inode Inspect checked, read through
	// this handle only (see localrecovery.Snapshot.Open).
	r, err := u.req.Snapshot.Open(lf)
	if err != nil {
		return err
	}
	defer r.Close()
	var b body
	switch {
	case f.Kind == manifests.Shared:
		b, err = u.shared(ctx, r, lf, f)
	case lf.Size <= u.req.InlineMax:
		return u.inline(r, lf, f)
	default:
		b, err = u.private(r, lf, f)
	}
	if err != nil {
		return err
	}
	if b.release != nil {
		defer b.release()
	}
	if b.key == "" {
		return nil
	}
	return u.transfer(ctx, r, lf, f, b)
}

// known identifies the shared file f (of the snapshot's file lf) by the
// hash Request.Hashes knows for its inode; false when it knows none that
// this upload may use.
func (u *upload) known(lf localrecovery.File, f *manifests.File) bool {
	d, ok := u.req.Hashes[lf.ID()]
	if !ok || (u.req.Alg == manifests.SHA256 && manifests.AlgOf(d) != manifests.SHA256) {
		return false
	}
	f.SetDigest(d)
	u.tally(func(r *Result) { r.HashesReused++ })
	return true
}

// shared identifies a shared file by its content (a known hash, or one
// computed now) and sends its object unless dedup finds it stored. Upload
// decided already for a file whose hash was known (Digest set).
func (u *upload) shared(ctx context.Context, r *os.File, lf localrecovery.File, f *manifests.File) (body, error) {
	var b body
	if f.Digest() != "" {
		b.key = manifests.SharedKey(u.req.Job, f.Digest(), f.Size)
		f.Key = b.key
		return b, nil
	}
	var d string
	var err error
	if lf.Size <= bufferedMax {
		// Read once: the hash and the upload take the same bytes.
		b.data, d, b.release, err = readBuffered(r, lf, u.req.Alg)
	} else {
		// Hashed now, sent later (if no confirmed object holds it): the
		// transfer verifies that it sends these very bytes (putFile).
		d, err = hashFile(ctx, r, lf, u.req.Alg)
	}
	if err != nil {
		return body{}, err
	}
	afterHash(lf.Name)
	f.SetDigest(d)
	u.tally(func(r *Result) { r.BytesHashed += lf.Size })
	if u.dedup(f) {
		f.Key = manifests.SharedKey(u.req.Job, f.Digest(), f.Size)
		b.key = f.Key
	}
	return b, nil
}

// dedup decides whether the content of the shared file f must be uploaded:
// not when a confirmed object holds it (f.Key is then that object's key),
// nor when another file of this snapshot (same bytes) already claimed its
// upload (f.Key is then set by that file's caller: same content, same
// key). It counts f as reused or uploaded.
func (u *upload) dedup(f *manifests.File) bool {
	if key, ok := lookup(u.confirmed, f); ok {
		// A confirmed object may live under a fresh key (see AvoidMarked).
		f.Key = key
		u.tally(func(r *Result) { r.FilesReused++ })
		return false
	}
	k, _ := keyOf(f)
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.claimed[k] {
		f.Key = manifests.SharedKey(u.req.Job, f.Digest(), f.Size)
		u.res.FilesReused++
		return false
	}
	u.claimed[k] = true
	f.Uploaded = true
	u.res.FilesUploaded++
	return true
}

// inline keeps a small private file inside the manifest: nothing to send.
func (u *upload) inline(r *os.File, lf localrecovery.File, f *manifests.File) error {
	data, err := readSmall(r, lf)
	if err != nil {
		return err
	}
	f.SetDigest(manifests.SumBytes(u.req.Alg, data))
	f.Inline, f.Uploaded = data, true
	if f.Inline == nil {
		f.Inline = []byte{}
	}
	u.tally(func(r *Result) { r.FilesUploaded++ })
	return nil
}

// private sends a private file as an object of this checkpoint's own,
// hashed on the way (read whole first when small).
func (u *upload) private(r *os.File, lf localrecovery.File, f *manifests.File) (body, error) {
	f.Key = manifests.PrivateKeyOf(u.req.Job, u.req.Task, u.req.Checkpoint, u.req.Epoch, f.Name)
	f.Uploaded = true
	b := body{key: f.Key}
	if lf.Size <= bufferedMax {
		var d string
		var err error
		if b.data, d, b.release, err = readBuffered(r, lf, u.req.Alg); err != nil {
			return body{}, err
		}
		f.SetDigest(d)
	}
	u.tally(func(r *Result) { r.FilesUploaded++ })
	return b, nil
}

// transfer writes the object b.key of f, from b.data when the file was
// read whole, else streaming the file: hashing it if f has no hash yet,
// and verifying that what is sent hashes to it if it has one.
func (u *upload) transfer(ctx context.Context, r *os.File, lf localrecovery.File, f *manifests.File, b body) error {
	if u.spans.Add(1) <= maxSpans {
		var span trace.Span
		ctx, span = u.tracer.Start(ctx, "upload.object", trace.WithAttributes(
			attribute.String("ckpt.file", f.Name), attribute.Int64("ckpt.size", f.Size)))
		defer span.End()
	}
	var sha string
	var err error
	if b.data != nil {
		err = putBuffered(ctx, u.req.Store, b.key, r, lf, b.data)
	} else {
		sha, err = putFile(ctx, u.req.Store, b.key, r, lf, u.req.Alg, f.Digest())
	}
	if err != nil {
		return fmt.Errorf("upload %s: %w", f.Name, err)
	}
	failpoint.Hit(failpoint.MidUpload) // one more object stored; with AFTER=k the k+1-th kills
	if f.Kind == manifests.Shared {
		u.req.Presence.Saw(b.key, f.Size, time.Now())
	}
	if f.Digest() == "" {
		f.SetDigest(sha)
	}
	u.tally(func(r *Result) { r.BytesWritten += f.Size })
	return nil
}

// putBuffered uploads a file read whole: the bytes hashed are the bytes
// sent. A file written meanwhile still fails the checkpoint: the app broke
// the immutability its local copy relies on.
func putBuffered(ctx context.Context, s storage.Store, key string, r *os.File, lf localrecovery.File, data []byte) error {
	err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data)))
	if fi, serr := r.Stat(); err == nil && (serr != nil || fi.Size() != lf.Size || fi.ModTime().UnixNano() != lf.ModTime) {
		err = fmt.Errorf("%s changed while it was uploaded: snapshot files must be immutable", lf.Name)
	}
	return err
}

// bufferedMax is the size up to which a file that must be hashed is read
// whole into memory once, hashed, and uploaded from that buffer: one read
// of the page cache instead of two (hash, then send), for the small SSTs
// flushes and compactions write. Larger files stream, twice: once to be
// hashed, once to be sent, hashed again on the way and refused unless they
// are the bytes hashed the first time (putFile).
const bufferedMax = 4 << 20

var bigBufs = sync.Pool{New: func() any { b := make([]byte, bufferedMax); return &b }}

// readBuffered reads f, the file the snapshot listed as lf (opened by
// Snapshot.Open), whole into a pooled buffer and hashes it with alg;
// release gives the buffer back. It fails if the file is not that one any
// more (size or mtime moved) or does not hold exactly lf.Size bytes.
func readBuffered(f *os.File, lf localrecovery.File, alg manifests.Alg) (data []byte, sha string, release func(), err error) {
	if err := unchanged(f, lf); err != nil {
		return nil, "", nil, err
	}
	bp := bigBufs.Get().(*[]byte)
	release = func() { bigBufs.Put(bp) }
	buf := (*bp)[:lf.Size]
	if _, err := io.ReadFull(f, buf); err != nil {
		release()
		return nil, "", nil, fmt.Errorf("read %s: %w: snapshot files must be immutable", lf.Name, err)
	}
	var one [1]byte
	if n, _ := f.Read(one[:]); n != 0 {
		release()
		return nil, "", nil, fmt.Errorf("read %s: longer than when the snapshot was taken: snapshot files must be immutable", lf.Name)
	}
	return buf, manifests.SumBytes(alg, buf), release, nil
}

// unchanged checks that the open file f still has the size and mtime the
// snapshot listed for lf. Its messages name no size: f is the inode the
// snapshot inspected, but what it holds is the app's to tell.
func unchanged(f *os.File, lf localrecovery.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != lf.Size || fi.ModTime().UnixNano() != lf.ModTime {
		return fmt.Errorf("%s changed since the snapshot was taken: snapshot files must be immutable", lf.Name)
	}
	return nil
}

// hashFile streams the open file f (lf) from its start through alg and
// checks its size.
func hashFile(ctx context.Context, f *os.File, lf localrecovery.File, alg manifests.Alg) (string, error) {
	if err := unchanged(f, lf); err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	sha, n, err := manifests.HashReader(ctx, f, alg)
	if err != nil {
		return "", err
	}
	if n != lf.Size {
		return "", fmt.Errorf("hash %s: not the length it had when the snapshot was taken: snapshot files must be immutable", lf.Name)
	}
	return sha, nil
}

// readSmall reads the open file f (lf) whole: exactly lf.Size bytes.
func readSmall(f *os.File, lf localrecovery.File) ([]byte, error) {
	if err := unchanged(f, lf); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, lf.Size+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", lf.Name, err)
	}
	if int64(len(data)) != lf.Size {
		return nil, fmt.Errorf("read %s: not the length it had when the snapshot was taken: snapshot files must be immutable", lf.Name)
	}
	return data, nil
}

// afterHash runs when a file read in two passes has been hashed, before
// it is sent: tests change the file there.
var afterHash = func(name string) {}

// errNotHashed is the failure of an upload whose bytes are not the ones
// its key (or its manifest entry) names.
var errNotHashed = errors.New("the bytes read to send it are not the bytes hashed before (the file was written in between)")

// putSnapshotFile opens the snapshot's file lf and uploads it with putFile.
func putSnapshotFile(ctx context.Context, s storage.Store, key string, sn *localrecovery.Snapshot, lf localrecovery.File, alg manifests.Alg, want string) (string, error) {
	r, err := sn.Open(lf)
	if err != nil {
		return "", err
	}
	defer r.Close()
	return putFile(ctx, s, key, r, lf, alg, want)
}

// putFile uploads f, the snapshot's file lf opened by Snapshot.Open, from
// its start, and fails if it is not the file the snapshot listed, or was
// written during the upload (its size or mtime moved): immutable files
// are not. (ctime is no witness: every hard link the app's next snapshot
// makes to the same inode moves it.)
//
// With want, the digest the key (or the manifest entry) names, the upload
// is verified as it goes: the bytes the store reads are hashed, and the
// last ones of a pass are handed over only if the pass read the file in
// order from its start and hashes to want. A store completes an object
// only once it has read its last byte, and a failed Put leaves no partial
// object (storage.Store), so no object is ever stored, nor an object of
// another task replaced, with bytes that are not want's: a file written
// between its hash and its upload, even with its mtime set back, fails the
// upload (errNotHashed). This costs a hash of the bytes sent, no read.
//
// Without want, with an alg, it returns the digest of the bytes the store
// read in its last full pass (private files are hashed as they go up),
// hashing the file once more if the store did not read it in one pass.
func putFile(ctx context.Context, s storage.Store, key string, f *os.File, lf localrecovery.File, alg manifests.Alg, want string) (string, error) {
	if want != "" {
		alg = manifests.AlgOf(want)
	}
	hashing := alg != 0
	if err := unchanged(f, lf); err != nil {
		return "", err
	}
	before, err := f.Stat()
	if err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	var body io.ReadSeeker = f
	var hr *hashingReader
	if hashing {
		hr = newHashingReader(f, alg, lf.Size, want)
		body = hr
	}
	if err := s.Put(ctx, key, body, lf.Size); err != nil {
		if hr != nil && hr.refused {
			return "", fmt.Errorf("%s: %w: snapshot files must be immutable", lf.Name, errNotHashed)
		}
		return "", err
	}
	after, err := f.Stat()
	if err != nil {
		return "", err
	}
	if after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		return "", fmt.Errorf("%s changed while it was uploaded: snapshot files must be immutable", lf.Name)
	}
	if !hashing {
		return "", nil
	}
	if want != "" {
		if !hr.verified {
			// The store wrote an object without reading the body to its
			// end in order: nothing says its bytes are want's.
			return "", fmt.Errorf("%s: the store did not read it in one pass, so what it stored could not be verified", lf.Name)
		}
		return want, nil
	}
	if !hr.valid || hr.pos != lf.Size {
		return hashFile(ctx, f, lf, alg)
	}
	return hr.h.Digest(), nil
}

// hashingReader hashes what a backend reads, so an upload proves that the
// bytes sent are the bytes hashed. A rewind to the start resets the hash;
// any other seek makes the pass unverifiable (valid=false).
//
// With want, it also guards the pass: the read that reaches size returns
// its bytes only if the pass was valid and the hash of everything read is
// want; otherwise it returns errNotHashed instead, and so does every read
// after it (refused).
type hashingReader struct {
	r     io.ReadSeeker
	h     *manifests.Hasher
	pos   int64
	valid bool

	size     int64
	want     string
	verified bool // a pass reached size, valid, and hashed to want
	refused  bool
}

// newHashingReader hashes what is read of r with alg; with want, it
// guards the passes over r's size bytes (an empty body is want's or not
// from the start).
func newHashingReader(r io.ReadSeeker, alg manifests.Alg, size int64, want string) *hashingReader {
	hr := &hashingReader{r: r, h: manifests.NewHasher(alg), valid: true, size: size, want: want}
	if want != "" && size == 0 {
		hr.verified = manifests.SumBytes(alg, nil) == want
		hr.refused = !hr.verified
	}
	return hr
}

func (r *hashingReader) Read(p []byte) (int, error) {
	if r.refused {
		return 0, errNotHashed
	}
	n, err := r.r.Read(p)
	if r.valid {
		r.h.Write(p[:n])
	}
	end := r.pos + int64(n)
	if r.want != "" && n > 0 && r.pos < r.size && end >= r.size {
		if !r.valid || end != r.size || r.h.Digest() != r.want {
			r.refused = true
			return 0, errNotHashed
		}
		r.verified = true
	}
	r.pos = end
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

// PutVerified writes the local file at path as the object key, only if the
// file holds exactly size bytes hashing to the digest sha (of its
// algorithm, see manifests.AlgOf): it hashes the file first
// (nothing is written from a bad copy), then hashes what the store reads
// as it uploads and withholds the last bytes unless they hash to sha (see
// putFile): a file changed in between fails, and stores nothing.
// It serves repairs of content-addressed objects from local copies.
func PutVerified(ctx context.Context, s storage.Store, key, path string, size int64, sha string) error {
	got, n, err := manifests.HashFile(ctx, path, manifests.AlgOf(sha))
	if err != nil {
		return err
	}
	if n != size || got != sha {
		return fmt.Errorf("%s: %d bytes hashing to %s, want %d bytes hashing to %s", path, n, got, size, sha)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	hr := newHashingReader(f, manifests.AlgOf(sha), size, sha)
	if err := s.Put(ctx, key, hr, size); err != nil {
		if hr.refused {
			return fmt.Errorf("%s changed while it was uploaded as %s: %w", path, key, errNotHashed)
		}
		return err
	}
	if !hr.verified {
		return fmt.Errorf("%s: the store did not read it in one pass, so what it stored as %s could not be verified", path, key)
	}
	return nil
}

// maxOtherManifests bounds the manifests OtherTasksConfirmed reads: a
// task's first checkpoint reads at most this many, the newest first.
const maxOtherManifests = 256

// OtherTasksConfirmed returns the shared objects (content id -> key) of
// the retained manifests of the job's other tasks (at most
// maxOtherManifests of them, the most recently created first) whose size
// is one of sizes: only an object of a file's size can hold the file, so
// a task of a few files holds a few entries, however large the job. A
// task with no complete checkpoint of its own, such as one a rescale
// restore built by ingesting other tasks' tables unchanged, reuses them:
// invariant 3 allows reusing objects a complete, retained manifest
// references, and Presence and the GC marks check them before a manifest
// names them, as they do the task's own. Manifests are read one at a
// time, so memory holds one of them. An unreadable manifest is skipped:
// fewer reuses, never a wrong one.
func OtherTasksConfirmed(ctx context.Context, s storage.Store, job, task string, sizes map[int64]bool) (map[string]string, error) {
	cat, err := manifests.Scan(ctx, s, job, "")
	if err != nil {
		return nil, err
	}
	var refs []manifests.Ref
	for _, r := range cat.Retained("") {
		if r.Task != task {
			refs = append(refs, r)
		}
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].Created.After(refs[j].Created) })
	refs = refs[:min(len(refs), maxOtherManifests)]
	out := map[string]string{}
	for _, r := range refs {
		// Walked, not decoded: memory holds one manifest as stored. What
		// a manifest offers counts only once the whole of it checked out.
		found := map[string]string{}
		_, _, err := manifests.WalkRef(ctx, s, job, r, func(f *manifests.FileView) error {
			if f.Kind == manifests.Shared && sizes[f.Size] {
				found[manifests.ContentID(f.Digest(), f.Size)] = string(f.Key)
			}
			return nil
		})
		var bad *manifests.UnreadableError
		switch {
		case errors.As(err, &bad), errors.Is(err, storage.ErrNotFound):
			continue
		case err != nil:
			return nil, err
		}
		maps.Copy(out, found)
	}
	return out, nil
}
