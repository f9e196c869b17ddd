// Package gs is the gs:// storage backend for Google Cloud Storage.
//
// A URL names a bucket and a key prefix: gs://bucket/prefix. Credentials
// come from Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS,
// gcloud's application-default login, workload identity, the metadata
// server). STORAGE_EMULATOR_HOST (host:port) points the client at an
// emulator such as fake-gcs-server, without authentication.
//
// Costs and guarantees:
//
//   - Put reads the body twice: once to compute its CRC32C (and check it
//     holds exactly size bytes, before any byte is sent), then to upload it
//     with the CRC32C attached, so the server rejects a corrupted upload.
//     Objects up to ChunkSize (16 MiB) go in one request; larger ones use a
//     resumable upload that buffers one ChunkSize chunk. The stored CRC32C is
//     compared with ours after the upload; reads are verified by the client
//     library against the stored CRC32C.
//   - Put is idempotent, so its requests are retried by the client library
//     even without preconditions. Create is a write with the precondition
//     DoesNotExist (ifGenerationMatch=0): 412 becomes storage.ErrExists. It
//     is sent without library retries: a retried conditional write cannot
//     tell its own earlier success from another writer's, so retrying is
//     left to the storage/retry decorator, which checks the content.
//   - An upload interrupted by an error or a cancelled context is abandoned
//     (never finalized); resumable sessions expire on their own after a
//     week, so there is no CleanIncomplete.
package gs

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	gcs "cloud.google.com/go/storage"
	"golang.org/x/sync/errgroup"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/ckpt-io/ckpt/storage"
)

func init() { storage.RegisterParsed("gs", ParseURL, New) }

// DefaultChunkSize is the upload chunk size and the largest object sent in
// a single request.
const DefaultChunkSize = 16 << 20

const probeTimeout = 15 * time.Second

// Options configures a store. Bucket is required.
type Options struct {
	Bucket string
	// Prefix is prepended to every key; a slash is added if missing.
	Prefix string
	// ChunkSize is the resumable upload chunk; default 16 MiB.
	ChunkSize int
	// Endpoint is the base URL of a GCS JSON API other than Google's, such
	// as http://127.0.0.1:4443. STORAGE_EMULATOR_HOST is the usual way to
	// set it; Endpoint keeps authentication on.
	Endpoint string
	// ClientOptions are passed to the client (credentials, tests).
	ClientOptions []option.ClientOption
}

// ParseURL turns gs://bucket/prefix into Options. The URL takes no query
// parameters.
func ParseURL(u *url.URL) (Options, error) {
	if u.User != nil {
		return Options{}, fmt.Errorf("storage URL gs://%s%s: credentials do not belong in the URL (use GOOGLE_APPLICATION_CREDENTIALS)", u.Host, u.Path)
	}
	if u.Host == "" {
		return Options{}, fmt.Errorf("storage URL %q: no bucket (use gs://bucket/prefix)", u.Redacted())
	}
	if u.RawQuery != "" {
		return Options{}, fmt.Errorf("storage URL %q: gs URLs take no parameters", u.Redacted())
	}
	return Options{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}, nil
}

// Store keeps objects in a GCS bucket under a prefix.
type Store struct {
	client    *gcs.Client
	bucket    *gcs.BucketHandle
	name      string
	prefix    string // "" or ending in "/"
	endpoint  string // for messages
	chunkSize int
}

var (
	_ storage.Store       = (*Store)(nil)
	_ storage.RangeReader = (*Store)(nil)
	_ storage.Locator     = (*Store)(nil)
)

// New connects to the bucket and checks with one request (no retries) that
// it exists and is reachable with the credentials. A failed check returns
// one line naming the bucket, the endpoint and what to check.
func New(ctx context.Context, o Options) (*Store, error) {
	if o.Bucket == "" {
		return nil, errors.New("gs: no bucket")
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = DefaultChunkSize
	}
	s := &Store{name: o.Bucket, chunkSize: o.ChunkSize, endpoint: "of Google Cloud Storage"}
	if o.Prefix = strings.Trim(o.Prefix, "/"); o.Prefix != "" {
		s.prefix = o.Prefix + "/"
	}
	opts := o.ClientOptions
	if o.Endpoint != "" {
		s.endpoint = strings.TrimSuffix(o.Endpoint, "/")
		opts = append([]option.ClientOption{gcs.WithJSONReads(), option.WithEndpoint(s.endpoint + "/storage/v1/")}, opts...)
	} else if host := os.Getenv("STORAGE_EMULATOR_HOST"); host != "" {
		s.endpoint = host
		if !strings.Contains(host, "://") {
			s.endpoint = "http://" + host
		}
		// Emulators serve JSON reads whatever their public host setting.
		opts = append([]option.ClientOption{gcs.WithJSONReads()}, opts...)
	}
	client, err := gcs.NewClient(ctx, opts...)
	if err != nil {
		return nil, &OpenError{Msg: fmt.Sprintf("gs bucket %q at endpoint %s: no usable Google credentials (set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login`; for an emulator set STORAGE_EMULATOR_HOST)", o.Bucket, s.endpoint), Err: err}
	}
	s.client = client
	s.bucket = client.Bucket(o.Bucket)
	if err := s.probe(ctx); err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// String returns gs://bucket/prefix.
func (s *Store) String() string {
	return "gs://" + s.name + "/" + strings.TrimSuffix(s.prefix, "/")
}

// Location returns gs://bucket/prefix with the endpoint the store talks to
// (empty for Google's own).
func (s *Store) Location() string {
	endpoint := s.endpoint
	if strings.HasPrefix(endpoint, "of Google") {
		endpoint = ""
	}
	return s.String() + "?endpoint=" + url.QueryEscape(endpoint)
}

// CopyFrom copies srcKey of src to key with the service's rewrite when src
// is a GCS store of the same endpoint (the bytes stay in the service);
// copied is false for any other store.
func (s *Store) CopyFrom(ctx context.Context, src storage.Store, srcKey, key string, size int64) (bool, error) {
	o, ok := storage.Innermost(src).(*Store)
	if !ok || o.endpoint != s.endpoint {
		return false, nil
	}
	from, err := o.object(srcKey)
	if err != nil {
		return false, err
	}
	to, err := s.object(key)
	if err != nil {
		return false, err
	}
	if _, err := to.Retryer(gcs.WithPolicy(gcs.RetryAlways)).CopierFrom(from).Run(ctx); err != nil {
		return false, s.wrap("copy from "+o.String()+" to", key, err)
	}
	return true, nil
}

// Close closes the client.
func (s *Store) Close() error { return s.client.Close() }

func (s *Store) object(key string) (*gcs.ObjectHandle, error) {
	if err := storage.ValidKey(key); err != nil {
		return nil, err
	}
	return s.bucket.Object(s.prefix + key), nil
}

// Put writes the object; see the package comment for the two reads of body.
func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	obj, err := s.object(key)
	if err != nil {
		return err
	}
	return s.write(ctx, "put", key, obj.Retryer(gcs.WithPolicy(gcs.RetryAlways)), body, size)
}

// Create writes the object only if the key does not exist.
func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	obj, err := s.object(key)
	if err != nil {
		return err
	}
	obj = obj.If(gcs.Conditions{DoesNotExist: true}).Retryer(gcs.WithPolicy(gcs.RetryNever))
	err = s.write(ctx, "create", key, obj, body, size)
	if isStatus(err, http.StatusPreconditionFailed) {
		return fmt.Errorf("create %s: %w", key, storage.ErrExists)
	}
	return err
}

var table = crc32.MakeTable(crc32.Castagnoli)

func (s *Store) write(ctx context.Context, op, key string, obj *gcs.ObjectHandle, body io.ReadSeeker, size int64) error {
	if size < 0 {
		return fmt.Errorf("%s %s: negative size %d", op, key, size)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	h := crc32.New(table)
	n, err := io.Copy(h, storage.ContextReader(ctx, io.LimitReader(body, size+1)))
	if err != nil {
		return fmt.Errorf("%s %s: read body: %w", op, key, err)
	}
	if n != size {
		return fmt.Errorf("%s %s: body has %d bytes, want %d", op, key, n, size)
	}
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("%s %s: rewind body: %w", op, key, err)
	}
	crc := h.Sum32()

	// Cancelling wctx abandons the upload: Close then fails without
	// finalizing a partial object.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := obj.NewWriter(wctx)
	w.ChunkSize = s.chunkSize
	w.CRC32C = crc
	w.SendCRC32C = true
	w.ContentType = "application/octet-stream"
	if _, err := io.Copy(w, io.LimitReader(body, size)); err != nil {
		cancel()
		w.Close()
		return s.wrap(op, key, err)
	}
	if err := w.Close(); err != nil {
		return s.wrap(op, key, err)
	}
	if a := w.Attrs(); a != nil && (a.CRC32C != crc || a.Size != size) {
		return fmt.Errorf("%s %s: stored object has CRC32C %08x and %d bytes, sent %08x and %d bytes", op, key, a.CRC32C, a.Size, crc, size)
	}
	return nil
}

// Get returns the object's body; the client library checks its CRC32C
// when the whole object is read.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	obj, err := s.object(key)
	if err != nil {
		return nil, err
	}
	r, err := obj.NewReader(ctx)
	if err != nil {
		return nil, s.wrap("get", key, err)
	}
	return r, nil
}

// GetRange returns length bytes of the object from off
// (ObjectHandle.NewRangeReader). The client checks no CRC32C on a range:
// the caller verifies what it reads.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	obj, err := s.object(key)
	if err != nil {
		return nil, err
	}
	r, err := obj.NewRangeReader(ctx, off, length)
	if err != nil {
		return nil, s.wrap("get", key, err)
	}
	return r, nil
}

// Stat returns the object's size and the time of its last write.
func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	obj, err := s.object(key)
	if err != nil {
		return storage.ObjectInfo{}, err
	}
	a, err := obj.Attrs(ctx)
	if err != nil {
		return storage.ObjectInfo{}, s.wrap("stat", key, err)
	}
	return storage.ObjectInfo{Key: key, Size: a.Size, ModTime: modTime(a)}, nil
}

func modTime(a *gcs.ObjectAttrs) time.Time {
	if !a.Updated.IsZero() {
		return a.Updated
	}
	return a.Created
}

// List pages through the objects under the prefix (the iterator fetches
// pages of up to 1000 names).
func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	q := &gcs.Query{Prefix: s.prefix + prefix}
	if err := q.SetAttrSelection([]string{"Name", "Size", "Updated", "Created"}); err != nil {
		return fmt.Errorf("list %s: %w", prefix, err)
	}
	it := s.bucket.Objects(ctx, q)
	for {
		a, err := it.Next()
		if err == iterator.Done {
			return nil
		}
		if err != nil {
			return s.wrap("list", prefix, err)
		}
		key := strings.TrimPrefix(a.Name, s.prefix)
		if key == "" || strings.HasSuffix(key, "/") {
			continue // a directory placeholder, not an object
		}
		if err := fn(storage.ObjectInfo{Key: key, Size: a.Size, ModTime: modTime(a)}); err != nil {
			return fmt.Errorf("list %s: %w", prefix, err)
		}
	}
}

// Delete removes the keys, 16 requests at a time (GCS has no batch delete
// in this client); missing keys are ignored.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	objs := make([]*gcs.ObjectHandle, len(keys))
	for i, key := range keys {
		obj, err := s.object(key)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		objs[i] = obj
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, obj := range objs {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			if err := obj.Delete(gctx); err != nil && !errors.Is(err, gcs.ErrObjectNotExist) {
				return s.wrap("delete", keys[i], err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// wrap maps library errors: a missing object becomes storage.ErrNotFound;
// API errors keep their HTTP status visible to retry.Transient.
func (s *Store) wrap(op, key string, err error) error {
	if errors.Is(err, gcs.ErrObjectNotExist) {
		return fmt.Errorf("%s %s: %w", op, key, storage.ErrNotFound)
	}
	if errors.Is(err, gcs.ErrBucketNotExist) {
		return fmt.Errorf("%s %s: gs bucket %q does not exist at endpoint %s: %w", op, key, s.name, s.endpoint, err)
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		if d := denied(op, ge.Code, err); d != nil {
			return fmt.Errorf("%s %s: %w", op, key, &StatusError{Code: ge.Code, Err: d})
		}
		return fmt.Errorf("%s %s: %w", op, key, &StatusError{Code: ge.Code, Err: err})
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

// StatusError carries the HTTP status of a failed request, so that
// retry.Transient can classify it.
type StatusError struct {
	Code int
	Err  error
}

func (e *StatusError) Error() string       { return e.Err.Error() }
func (e *StatusError) Unwrap() error       { return e.Err }
func (e *StatusError) HTTPStatusCode() int { return e.Code }

func isStatus(err error, code int) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == code
}
