// Package s3 is the s3:// storage backend, for Amazon S3 and S3-compatible
// servers (versitygw, Ceph RGW, MinIO, ...).
//
// A URL names a bucket and a key prefix:
//
//	s3://bucket/prefix?region=eu-west-1&endpoint=http://127.0.0.1:7070&path_style=true&sse=aws:kms&sse_kms_key_id=KEY
//
// All query parameters are optional. Credentials, region and endpoint come
// from the AWS SDK's default chain (AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY, AWS_PROFILE and the shared config files, web
// identity tokens, container and instance roles; AWS_REGION,
// AWS_ENDPOINT_URL); region= and endpoint= override the chain. Credentials
// are never accepted in the URL.
//
// Costs and guarantees:
//
//   - Objects up to PartSize (16 MiB) are sent with one PutObject whose body
//     streams from the caller's seekable body; larger ones use a multipart
//     upload of PartSize parts with Concurrency (3) parts in flight. When the
//     body is a file (an io.ReaderAt, as the uploader passes), each part
//     streams from its section of the file and nothing is buffered, so
//     memory stays flat whatever the size. Other bodies go through the
//     transfer manager, which buffers at most (Concurrency+2)*PartSize bytes
//     (96 MiB by default). Every request carries a CRC32 checksum the
//     server verifies, computed here for single PUTs and file parts (one
//     cheap read) and sent with an unsigned payload, so neither side reads
//     the bytes through SHA-256 for the signature; downloads of objects
//     that have a full-object checksum are verified by the SDK.
//   - Create is a PutObject (or CompleteMultipartUpload) with
//     If-None-Match: *; the server answers 412 if the key exists. Create is
//     sent once, without SDK retries: a retried conditional write cannot
//     tell its own earlier success from another writer's, so retrying is
//     left to the storage/retry decorator, which checks the content.
//   - Other calls use the SDK's standard retryer (MaxAttempts, exponential
//     backoff with jitter, throttling answers such as 503 SlowDown back off
//     like other transient errors), without the client-wide retry quota, so
//     a burst of failures in parallel transfers does not switch retries off.
//   - A failed multipart upload is aborted; one left by a crash is removed by
//     CleanIncomplete.
package s3

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	tmtypes "github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go/middleware"
	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/storage"
)

func init() { storage.RegisterParsed("s3", ParseURL, New) }

// Defaults for Options.
const (
	DefaultPartSize    = 16 << 20
	DefaultConcurrency = 3
	DefaultMaxAttempts = 5
	probeTimeout       = 15 * time.Second
)

// Options configures a store. Bucket is required; the rest is optional.
type Options struct {
	Bucket string
	// Prefix is prepended to every key; a slash is added if missing.
	Prefix string
	// Region overrides AWS_REGION and the profile's region. With a custom
	// endpoint and no region anywhere, us-east-1 is used.
	Region string
	// Endpoint overrides AWS_ENDPOINT_URL, e.g. http://127.0.0.1:7070.
	Endpoint string
	// PathStyle addresses buckets as endpoint/bucket instead of
	// bucket.endpoint (most S3-compatible servers need it).
	PathStyle bool
	// SSE is the server-side encryption: "", "AES256" or "aws:kms".
	SSE string
	// SSEKMSKeyID is the KMS key for SSE "aws:kms" (default: the account's
	// S3 key).
	SSEKMSKeyID string
	// Credentials overrides the default credential chain (tests).
	Credentials aws.CredentialsProvider
	// PartSize is the multipart part size and the largest object sent with
	// a single PutObject. Default 16 MiB; at least 5 MiB.
	PartSize int64
	// Concurrency is the number of parts of one upload in flight. Default 3.
	Concurrency int
	// MaxAttempts bounds the SDK's attempts per request. Default 5.
	MaxAttempts int

	// apiOptions are added to the client's middleware stack (tests).
	apiOptions []func(*middleware.Stack) error
}

// ParseURL turns s3://bucket/prefix?query into Options; see the package
// comment for the query parameters.
func ParseURL(u *url.URL) (Options, error) {
	var o Options
	if u.User != nil {
		return o, fmt.Errorf("storage URL s3://%s%s: credentials do not belong in the URL (use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE)", u.Host, u.Path)
	}
	o.Bucket = u.Host
	o.Prefix = strings.Trim(u.Path, "/")
	if o.Bucket == "" {
		return o, fmt.Errorf("storage URL %q: no bucket (use s3://bucket/prefix)", u.Redacted())
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "region":
			o.Region = v
		case "endpoint":
			o.Endpoint = v
		case "path_style":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return o, fmt.Errorf("storage URL %q: path_style=%q: want true or false", u.Redacted(), v)
			}
			o.PathStyle = b
		case "sse":
			o.SSE = v
		case "sse_kms_key_id":
			o.SSEKMSKeyID = v
		default:
			return o, fmt.Errorf("storage URL %q: unknown parameter %q (known: region, endpoint, path_style, sse, sse_kms_key_id)", u.Redacted(), k)
		}
	}
	return o, nil
}

// Store keeps objects in an S3 bucket under a prefix.
type Store struct {
	bucket    string
	prefix    string // "" or ending in "/"
	endpoint  string // for messages
	client    *s3.Client
	tm        *transfermanager.Client
	partSize  int64
	sse       types.ServerSideEncryption
	kmsKeyID  *string
	partConc  int
	closeIdle func()
}

var (
	_ storage.Store             = (*Store)(nil)
	_ storage.IncompleteCleaner = (*Store)(nil)
	_ storage.RangeReader       = (*Store)(nil)
	_ storage.Locator           = (*Store)(nil)
)

// New connects to the bucket and checks, with one HeadBucket request, that
// it exists and the credentials can reach it. A failed check returns one
// line naming the bucket, the endpoint and what to check.
func New(ctx context.Context, o Options) (*Store, error) {
	if o.Bucket == "" {
		return nil, errors.New("s3: no bucket")
	}
	switch o.SSE {
	case "", "AES256", "aws:kms":
	default:
		return nil, fmt.Errorf("s3 bucket %q: sse=%q: want AES256 or aws:kms", o.Bucket, o.SSE)
	}
	if o.SSEKMSKeyID != "" && o.SSE != "aws:kms" {
		return nil, fmt.Errorf("s3 bucket %q: sse_kms_key_id needs sse=aws:kms", o.Bucket)
	}
	if o.PartSize == 0 {
		o.PartSize = DefaultPartSize
	}
	if o.PartSize < 5<<20 {
		return nil, fmt.Errorf("s3 bucket %q: part size %d is below the S3 minimum of 5 MiB", o.Bucket, o.PartSize)
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}

	loadOpts := []func(*config.LoadOptions) error{
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(so *retry.StandardOptions) {
				so.MaxAttempts = o.MaxAttempts
				so.RateLimiter = ratelimit.None
			})
		}),
	}
	if o.Region != "" {
		loadOpts = append(loadOpts, config.WithRegion(o.Region))
	}
	if o.Credentials != nil {
		loadOpts = append(loadOpts, config.WithCredentialsProvider(o.Credentials))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("s3 bucket %q: load AWS configuration: %w (check AWS_PROFILE and the shared config files)", o.Bucket, err)
	}
	endpoint := o.Endpoint
	if endpoint == "" {
		endpoint = aws.ToString(cfg.BaseEndpoint)
	}
	if cfg.Region == "" {
		if endpoint == "" {
			return nil, fmt.Errorf("s3 bucket %q: no AWS region (set AWS_REGION or region= in the URL)", o.Bucket)
		}
		cfg.Region = "us-east-1"
	}
	s := &Store{bucket: o.Bucket, partSize: o.PartSize, partConc: o.Concurrency, sse: types.ServerSideEncryption(o.SSE), closeIdle: func() {}}
	if o.Prefix = strings.Trim(o.Prefix, "/"); o.Prefix != "" {
		s.prefix = o.Prefix + "/"
	}
	if o.SSEKMSKeyID != "" {
		s.kmsKeyID = aws.String(o.SSEKMSKeyID)
	}
	s.endpoint = endpoint
	if s.endpoint == "" {
		s.endpoint = "of AWS region " + cfg.Region
	}
	// A frozen client is one we can close the idle connections of.
	if bc, ok := cfg.HTTPClient.(*awshttp.BuildableClient); ok {
		hc := bc.Freeze()
		cfg.HTTPClient = hc
		if c, ok := hc.(*http.Client); ok {
			s.closeIdle = c.CloseIdleConnections
		}
	}
	s.client = s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle
		// Multipart objects have no full-object checksum to verify on GET;
		// do not log that on every download.
		so.DisableLogOutputChecksumValidationSkipped = true
		so.APIOptions = append(so.APIOptions, o.apiOptions...)
	})
	s.tm = transfermanager.New(s.client, func(to *transfermanager.Options) {
		to.PartSizeBytes = o.PartSize
		to.MultipartUploadThreshold = o.PartSize
		to.Concurrency = o.Concurrency
		to.ChecksumAlgorithm = tmtypes.ChecksumAlgorithmCrc32
		to.FailTimeout = 30 * time.Second // abort a failed upload even after ctx ends
	})
	if err := s.probe(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// String returns s3://bucket/prefix.
func (s *Store) String() string {
	return "s3://" + s.bucket + "/" + strings.TrimSuffix(s.prefix, "/")
}

// Location returns s3://bucket/prefix with the endpoint the store talks to
// (empty for AWS's own).
func (s *Store) Location() string {
	endpoint := s.endpoint
	if strings.HasPrefix(endpoint, "of AWS region ") {
		endpoint = ""
	}
	return s.String() + "?endpoint=" + url.QueryEscape(endpoint)
}

// Close releases idle connections.
func (s *Store) Close() error {
	s.closeIdle()
	return nil
}

// maxCopy is the largest object one CopyObject call copies.
const maxCopy = 5 << 30

// CopyFrom copies srcKey of src to key with CopyObject when src is an S3
// store reached through the same endpoint (the bytes stay in the
// service); copied is false for any other store and for objects above
// 5 GiB. The copy takes this store's server-side encryption settings.
func (s *Store) CopyFrom(ctx context.Context, src storage.Store, srcKey, key string, size int64) (bool, error) {
	o, ok := storage.Innermost(src).(*Store)
	if !ok || o.endpoint != s.endpoint || size > maxCopy {
		return false, nil
	}
	sk, err := o.objectKey(srcKey)
	if err != nil {
		return false, err
	}
	k, err := s.objectKey(key)
	if err != nil {
		return false, err
	}
	source := url.PathEscape(o.bucket) + "/" + strings.ReplaceAll(url.PathEscape(*sk), "%2F", "/")
	_, err = s.client.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &s.bucket, Key: k, CopySource: &source,
		ServerSideEncryption: s.sse, SSEKMSKeyId: s.kmsKeyID})
	if err != nil {
		return false, s.wrap("copy from "+o.String()+" to", key, err)
	}
	return true, nil
}

// Client returns the SDK client (for tests and tools).
func (s *Store) Client() *s3.Client { return s.client }

// objectKey validates key and returns it with the prefix.
func (s *Store) objectKey(key string) (*string, error) {
	if err := storage.ValidKey(key); err != nil {
		return nil, err
	}
	return aws.String(s.prefix + key), nil
}

// once disables the SDK's retries for one call.
func once(o *s3.Options) { o.RetryMaxAttempts = 1 }

// unsignedPayload signs a data upload without hashing its body, as the SDK
// does over HTTPS anyway. Over plain HTTP it takes effect only with the
// CRC32 given (crc32Of): the SDK's checksum step otherwise computes the
// payload's SHA-256 as it computes the CRC32, and signs with it. The
// body's integrity is checked by the server against the CRC32.
func unsignedPayload(o *s3.Options) {
	o.APIOptions = append(o.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)
}

// crc32Of reads r to its end for the CRC-32 (IEEE) the request carries in
// x-amz-checksum-crc32, and rewinds it. Given the value, the SDK sends the
// body as it is: without it, over plain HTTP, the SDK reads the body once
// more through both CRC-32 and SHA-256, and signs with the SHA-256, which
// the server then recomputes too; two SHA-256 passes of every byte that
// protect nothing the CRC-32 the server checks does not. The body is read
// twice either way (once here, once to send); the second read comes from
// the page cache.
func crc32Of(r io.ReadSeeker) (*string, error) {
	h := crc32.NewIEEE()
	bp := copyBufs.Get().(*[]byte)
	_, err := io.CopyBuffer(h, r, *bp)
	copyBufs.Put(bp)
	if err != nil {
		return nil, fmt.Errorf("read the body for its CRC-32: %w", err)
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("rewind the body: %w", err)
	}
	return aws.String(base64.StdEncoding.EncodeToString(h.Sum(nil))), nil
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// Put writes the object with one PutObject, or a multipart upload above
// PartSize.
func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.put(ctx, "put", key, body, size, false)
}

// Create writes the object only if the key does not exist, with
// If-None-Match: *. It is sent without SDK retries; see the package comment.
func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.put(ctx, "create", key, body, size, true)
}

func (s *Store) put(ctx context.Context, op, key string, body io.ReadSeeker, size int64, exclusive bool) error {
	k, err := s.objectKey(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("%s %s: negative size %d", op, key, size)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	var ifNoneMatch *string
	optFns := []func(*s3.Options){unsignedPayload}
	if exclusive {
		ifNoneMatch = aws.String("*")
		optFns = append(optFns, once)
	}
	eb := &exactBody{r: body, size: size}
	if size <= s.partSize {
		sum, cerr := crc32Of(eb)
		if cerr != nil {
			return fmt.Errorf("%s %s: %w", op, key, cerr)
		}
		_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:               &s.bucket,
			Key:                  k,
			Body:                 eb,
			ContentLength:        aws.Int64(size),
			ChecksumAlgorithm:    types.ChecksumAlgorithmCrc32,
			ChecksumCRC32:        sum,
			IfNoneMatch:          ifNoneMatch,
			ServerSideEncryption: s.sse,
			SSEKMSKeyId:          s.kmsKeyID,
		}, optFns...)
	} else {
		if exclusive {
			// Spare the upload when the key is taken already; If-None-Match
			// on the completion still decides a race.
			if _, herr := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: k}); herr == nil {
				return fmt.Errorf("%s %s: %w", op, key, storage.ErrExists)
			} else if !isNotFound(herr) {
				return s.wrap(op, key, herr)
			}
		}
		if ra, ok := body.(io.ReaderAt); ok {
			// A file: parts are sections of it, read straight from the page
			// cache into the request; no part is ever buffered in memory.
			err = s.multipartAt(ctx, op, key, k, body, ra, size, ifNoneMatch, optFns)
			if err == nil {
				return nil
			}
			if exclusive && isExists(err) {
				return fmt.Errorf("%s %s: %w", op, key, storage.ErrExists)
			}
			return s.wrap(op, key, err)
		}
		_, err = s.tm.UploadObject(ctx, &transfermanager.UploadObjectInput{
			Bucket:               &s.bucket,
			Key:                  k,
			Body:                 struct{ io.Reader }{eb}, // read in parts, never seeked
			ContentLength:        aws.Int64(size),
			IfNoneMatch:          ifNoneMatch,
			ServerSideEncryption: tmtypes.ServerSideEncryption(s.sse),
			SSEKMSKeyID:          s.kmsKeyID,
		})
	}
	if err == nil {
		return nil
	}
	if exclusive && isExists(err) {
		return fmt.Errorf("%s %s: %w", op, key, storage.ErrExists)
	}
	return s.wrap(op, key, err)
}

// multipartAt uploads size bytes of ra as a multipart upload of PartSize
// sections, Concurrency parts in flight, each with its CRC32. Memory stays
// flat whatever the object's size: a part streams from its section of the
// file. The body must hold exactly size bytes. A failed upload is aborted.
func (s *Store) multipartAt(ctx context.Context, op, key string, k *string, body io.Seeker, ra io.ReaderAt, size int64, ifNoneMatch *string, optFns []func(*s3.Options)) error {
	end, err := body.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if end != size {
		if end < size {
			return fmt.Errorf("%s %s: %w", op, key, errBodyShort)
		}
		return fmt.Errorf("%s %s: %w", op, key, errBodyLong)
	}
	created, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: &s.bucket, Key: k, ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
		ServerSideEncryption: s.sse, SSEKMSKeyId: s.kmsKeyID,
	})
	if err != nil {
		return err
	}
	abort := func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &s.bucket, Key: k, UploadId: created.UploadId})
	}
	n := int((size + s.partSize - 1) / s.partSize)
	parts := make([]types.CompletedPart, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(s.partConc, 1))
	for i := range n {
		off := int64(i) * s.partSize
		length := min(s.partSize, size-off)
		g.Go(func() error {
			num := aws.Int32(int32(i + 1))
			part := io.NewSectionReader(ra, off, length)
			sum, err := crc32Of(part)
			if err != nil {
				return fmt.Errorf("part %d: %w", i+1, err)
			}
			out, err := s.client.UploadPart(gctx, &s3.UploadPartInput{
				Bucket: &s.bucket, Key: k, UploadId: created.UploadId, PartNumber: num,
				Body: part, ContentLength: aws.Int64(length),
				ChecksumAlgorithm: types.ChecksumAlgorithmCrc32, ChecksumCRC32: sum,
			}, unsignedPayload)
			if err != nil {
				return fmt.Errorf("part %d: %w", i+1, err)
			}
			parts[i] = types.CompletedPart{PartNumber: num, ETag: out.ETag, ChecksumCRC32: out.ChecksumCRC32}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		abort()
		return err
	}
	_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &s.bucket, Key: k, UploadId: created.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}, IfNoneMatch: ifNoneMatch,
	}, optFns...)
	if err != nil {
		abort()
		return err
	}
	return nil
}

// Get returns the object's body; the SDK verifies its checksum when the
// object has a full-object one.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	k, err := s.objectKey(key)
	if err != nil {
		return nil, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: k})
	if err != nil {
		return nil, s.wrap("get", key, err)
	}
	return out.Body, nil
}

// GetRange returns length bytes of the object from off with a ranged
// GetObject (a Range header). The body is checked by the caller: S3's
// checksums cover whole objects or parts, not arbitrary ranges.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	k, err := s.objectKey(key)
	if err != nil {
		return nil, err
	}
	rng := fmt.Sprintf("bytes=%d-%d", off, off+length-1)
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: k, Range: &rng})
	if err != nil {
		return nil, s.wrap("get", key, err)
	}
	return out.Body, nil
}

// Stat returns the object's size and modification time (HeadObject).
func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	k, err := s.objectKey(key)
	if err != nil {
		return storage.ObjectInfo{}, err
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: k})
	if err != nil {
		return storage.ObjectInfo{}, s.wrap("stat", key, err)
	}
	return storage.ObjectInfo{Key: key, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified)}, nil
}

// List pages through ListObjectsV2 (1000 keys a page). Keys ending in "/"
// (directory markers some tools create) are not objects and are skipped.
func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: &s.bucket,
		Prefix: aws.String(s.prefix + prefix),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return s.wrap("list", prefix, err)
		}
		for _, obj := range page.Contents {
			key := strings.TrimPrefix(aws.ToString(obj.Key), s.prefix)
			if key == "" || strings.HasSuffix(key, "/") {
				continue
			}
			info := storage.ObjectInfo{Key: key, Size: aws.ToInt64(obj.Size), ModTime: aws.ToTime(obj.LastModified)}
			if err := fn(info); err != nil {
				return fmt.Errorf("list %s: %w", prefix, err)
			}
		}
	}
	return nil
}

// Delete removes the keys with DeleteObjects, 1000 keys a request. Missing
// keys are not errors; the keys the server failed to delete are reported
// one by one.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	objs := make([]types.ObjectIdentifier, 0, len(keys))
	for _, key := range keys {
		k, err := s.objectKey(key)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		objs = append(objs, types.ObjectIdentifier{Key: k})
	}
	var errs []error
	for len(objs) > 0 {
		batch := objs[:min(len(objs), 1000)]
		objs = objs[len(batch):]
		out, err := s.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{
			Bucket: &s.bucket,
			Delete: &types.Delete{Objects: batch, Quiet: aws.Bool(true)},
		})
		if err != nil {
			return s.wrap("delete", fmt.Sprintf("%s (batch of %d)", strings.TrimPrefix(aws.ToString(batch[0].Key), s.prefix), len(batch)), err)
		}
		for _, e := range out.Errors {
			if aws.ToString(e.Code) == "NoSuchKey" {
				continue
			}
			errs = append(errs, fmt.Errorf("delete %s: %s: %s", strings.TrimPrefix(aws.ToString(e.Key), s.prefix), aws.ToString(e.Code), aws.ToString(e.Message)))
		}
	}
	return errors.Join(errs...)
}

// CleanIncomplete aborts the multipart uploads of keys under prefix that were
// initiated before olderThan; bytes counts their uploaded parts.
func (s *Store) CleanIncomplete(ctx context.Context, prefix string, olderThan time.Time) (int, int64, error) {
	var n int
	var total int64
	p := s3.NewListMultipartUploadsPaginator(s.client, &s3.ListMultipartUploadsInput{
		Bucket: &s.bucket,
		Prefix: aws.String(s.prefix + prefix),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return n, total, s.wrap("list multipart uploads", s.prefix, err)
		}
		for _, up := range page.Uploads {
			if up.Initiated != nil && !up.Initiated.Before(olderThan) {
				continue
			}
			total += s.partBytes(ctx, up.Key, up.UploadId)
			_, err := s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{
				Bucket: &s.bucket, Key: up.Key, UploadId: up.UploadId,
			})
			if err != nil && !isNotFound(err) {
				return n, total, s.wrap("abort multipart upload", strings.TrimPrefix(aws.ToString(up.Key), s.prefix), err)
			}
			n++
		}
	}
	return n, total, nil
}

// partBytes sums the sizes of an upload's parts (best effort: 0 on error).
func (s *Store) partBytes(ctx context.Context, key, uploadID *string) int64 {
	var total int64
	p := s3.NewListPartsPaginator(s.client, &s3.ListPartsInput{Bucket: &s.bucket, Key: key, UploadId: uploadID})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return total
		}
		for _, part := range page.Parts {
			total += aws.ToInt64(part.Size)
		}
	}
	return total
}

// wrap maps SDK errors: not found becomes storage.ErrNotFound, anything else
// is wrapped with the operation and key (the SDK's text names the request
// ID and status, never credentials).
func (s *Store) wrap(op, key string, err error) error {
	if isNotFound(err) {
		return fmt.Errorf("%s %s: %w", op, key, storage.ErrNotFound)
	}
	if code := storage.ErrorCode(err); code == "NoSuchBucket" {
		return fmt.Errorf("%s %s: s3 bucket %q does not exist at endpoint %s: %w", op, key, s.bucket, s.endpoint, err)
	}
	if d := denied(op, err); d != nil {
		return fmt.Errorf("%s %s: %w", op, key, d)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

// isNotFound reports a missing key (NoSuchKey, NotFound, NoSuchUpload, or a
// bare 404 as HEAD answers), but not a missing bucket.
func isNotFound(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsk) || errors.As(err, &nf) {
		return true
	}
	switch storage.ErrorCode(err) {
	case "NoSuchBucket":
		return false
	case "NoSuchKey", "NotFound", "NoSuchUpload":
		return true
	}
	return storage.HTTPStatus(err) == http.StatusNotFound
}

// isExists reports the answers to a conditional write onto an existing key:
// 412 PreconditionFailed, or 409 ConditionalRequestConflict when another
// conditional write to the key is in progress.
func isExists(err error) bool {
	switch storage.ErrorCode(err) {
	case "PreconditionFailed", "ConditionalRequestConflict":
		return true
	}
	return storage.HTTPStatus(err) == http.StatusPreconditionFailed
}

var (
	errBodyShort = errors.New("body is shorter than the given size")
	errBodyLong  = errors.New("body is longer than the given size")
)

// exactBody reads exactly size bytes from r and fails if r holds fewer or
// more, so a wrong size never stores a truncated or padded object. It stays
// seekable (within [0, size]) so the SDK can compute checksums and rewind
// for retries.
type exactBody struct {
	r    io.ReadSeeker
	size int64
	off  int64
}

func (b *exactBody) Read(p []byte) (int, error) {
	if b.off >= b.size {
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			return 0, errBodyLong
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
		return 0, io.EOF
	}
	if rest := b.size - b.off; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := b.r.Read(p)
	b.off += int64(n)
	if err == io.EOF {
		if b.off < b.size {
			return n, errBodyShort
		}
		err = nil
	}
	return n, err
}

func (b *exactBody) Seek(offset int64, whence int) (int64, error) {
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = b.off + offset
	case io.SeekEnd:
		abs = b.size + offset
	default:
		return 0, errors.New("seek: invalid whence")
	}
	if abs < 0 || abs > b.size {
		return 0, fmt.Errorf("seek to %d: outside the body of %d bytes", abs, b.size)
	}
	if _, err := b.r.Seek(abs, io.SeekStart); err != nil {
		return 0, err
	}
	b.off = abs
	return abs, nil
}
