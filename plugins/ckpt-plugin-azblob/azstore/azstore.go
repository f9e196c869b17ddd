// Package azstore keeps ckpt objects in an Azure Blob Storage container.
// It is served by the ckpt-plugin-azblob plugin; the ckpt binary itself
// does not link the Azure SDK.
//
// URL: az://container/prefix. Credentials and endpoint come from
// AZURE_STORAGE_CONNECTION_STRING when it is set (Azurite's connection
// string works); otherwise the service is https://ACCOUNT.blob.core.windows.net
// with ACCOUNT from the URL's ?account= or AZURE_STORAGE_ACCOUNT (or the
// whole service URL from ?endpoint=), authenticated by azidentity's default
// chain (environment, workload identity, managed identity, Azure CLI...).
//
// Objects are block blobs. Put stages blocks read one at a time from the
// body (bounded memory: a few blocks in flight) and commits the block list,
// so a failed Put never leaves a partial blob; Create adds If-None-Match: *.
package azstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/storage"
)

// Defaults.
const (
	DefaultBlockSize   = 8 << 20
	DefaultConcurrency = 4
	deleteConcurrency  = 16
	batchSize          = 256 // Blob Batch's limit of sub-requests
	batchConcurrency   = 4
)

// Options configures a Store.
type Options struct {
	Container string
	// Prefix is prepended to every key; a slash is added if missing.
	Prefix string
	// ConnectionString, when set, gives the endpoint and the shared key.
	ConnectionString string
	// Endpoint is the blob service URL (https://ACCOUNT.blob.core.windows.net/)
	// used with the identity chain when there is no connection string.
	Endpoint string
	// BlockSize is the size of a staged block (and the largest object sent
	// in one request); default 8 MiB.
	BlockSize int
	// Concurrency is the number of blocks staged at once; default 4. A Put
	// holds at most Concurrency blocks in memory.
	Concurrency int
	// Credential overrides the identity chain (tests).
	Credential azcore.TokenCredential
}

// ParseURL turns az://container/prefix into Options, taking the connection
// string (AZURE_STORAGE_CONNECTION_STRING) or the account
// (?account=, ?endpoint=, AZURE_STORAGE_ACCOUNT) from getenv.
func ParseURL(u *url.URL, getenv func(string) string) (Options, error) {
	if u.User != nil {
		return Options{}, fmt.Errorf("storage URL az://%s%s: credentials do not belong in the URL (use AZURE_STORAGE_CONNECTION_STRING or the Azure identity chain)", u.Host, u.Path)
	}
	if u.Host == "" {
		return Options{}, fmt.Errorf("storage URL %q: no container (use az://container/prefix)", u.Redacted())
	}
	o := Options{Container: u.Host, Prefix: strings.Trim(u.Path, "/")}
	q := u.Query()
	for k := range q {
		if k != "account" && k != "endpoint" {
			return Options{}, fmt.Errorf("storage URL %q: unknown parameter %q (az URLs take account= and endpoint=)", u.Redacted(), k)
		}
	}
	o.ConnectionString = getenv("AZURE_STORAGE_CONNECTION_STRING")
	switch {
	case q.Get("endpoint") != "":
		o.Endpoint = q.Get("endpoint")
	case q.Get("account") != "":
		o.Endpoint = "https://" + q.Get("account") + ".blob.core.windows.net/"
	case getenv("AZURE_STORAGE_ACCOUNT") != "":
		o.Endpoint = "https://" + getenv("AZURE_STORAGE_ACCOUNT") + ".blob.core.windows.net/"
	}
	if o.ConnectionString != "" && (q.Has("endpoint") || q.Has("account")) {
		return Options{}, fmt.Errorf("storage URL %q: account= or endpoint= with AZURE_STORAGE_CONNECTION_STRING set (the connection string names the account; use one or the other)", u.Redacted())
	}
	if o.ConnectionString == "" && o.Endpoint == "" {
		return Options{}, fmt.Errorf("storage URL %q: no Azure account (set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT or ?account= for the identity chain)", u.Redacted())
	}
	return o, nil
}

// Store keeps objects in an Azure Blob container under a prefix.
type Store struct {
	client      *container.Client
	name        string // container
	prefix      string // "" or ending in "/"
	endpoint    string // for messages, without secrets
	blockSize   int
	concurrency int
	bufs        sync.Pool
	noBatch     atomic.Bool  // the service refused Blob Batch
	batches     atomic.Int64 // Blob Batch requests that succeeded
}

var _ storage.Store = (*Store)(nil)

// New connects to the container and checks with one request that it exists
// and is reachable with the credentials. A failed check returns a
// *storage.OpenError of one line naming the container, the endpoint and
// what to check.
func New(ctx context.Context, o Options) (*Store, error) {
	if o.Container == "" {
		return nil, errors.New("az: no container")
	}
	s := &Store{name: o.Container, blockSize: o.BlockSize, concurrency: o.Concurrency}
	if s.blockSize <= 0 {
		s.blockSize = DefaultBlockSize
	}
	if s.concurrency <= 0 {
		s.concurrency = DefaultConcurrency
	}
	if o.Prefix = strings.Trim(o.Prefix, "/"); o.Prefix != "" {
		s.prefix = o.Prefix + "/"
	}
	s.bufs.New = func() any { b := make([]byte, s.blockSize); return &b }
	copts := &container.ClientOptions{ClientOptions: policy.ClientOptions{
		Retry: policy.RetryOptions{MaxRetries: 4, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: 5 * time.Second},
	}}
	var err error
	if o.ConnectionString != "" {
		s.client, err = container.NewClientFromConnectionString(o.ConnectionString, o.Container, copts)
		if err != nil {
			// The parser's messages do not quote the string; keep it that way.
			return nil, &storage.OpenError{Msg: fmt.Sprintf("az container %q: AZURE_STORAGE_CONNECTION_STRING is not usable: %v", o.Container, err), Err: err}
		}
	} else {
		if u, perr := url.Parse(o.Endpoint); perr != nil || u.Scheme != "https" || u.Host == "" {
			return nil, &storage.OpenError{Msg: fmt.Sprintf("az container %q: endpoint %q: the Azure identity chain sends tokens only to an https:// endpoint (use one, or AZURE_STORAGE_CONNECTION_STRING)", o.Container, redact(o.Endpoint)), Err: perr}
		}
		cred := o.Credential
		if cred == nil {
			cred, err = azidentity.NewDefaultAzureCredential(nil)
			if err != nil {
				return nil, &storage.OpenError{Msg: fmt.Sprintf("az container %q at %s: no usable Azure credentials (set AZURE_STORAGE_CONNECTION_STRING, or sign in for the identity chain: AZURE_CLIENT_ID/AZURE_TENANT_ID/..., managed identity or `az login`): %v", o.Container, redact(o.Endpoint), storage.RootCause(err)), Err: err}
			}
		}
		curl := strings.TrimSuffix(o.Endpoint, "/") + "/" + url.PathEscape(o.Container)
		s.client, err = container.NewClient(curl, cred, copts)
		if err != nil {
			return nil, fmt.Errorf("az container %q at %s: %w", o.Container, redact(o.Endpoint), err)
		}
	}
	s.endpoint = redact(strings.TrimSuffix(s.client.URL(), "/"+url.PathEscape(o.Container)))
	if err := s.probe(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// redact drops the query (a SAS token) from a URL for messages.
func redact(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		return raw[:i]
	}
	return raw
}

func (s *Store) String() string {
	return "az://" + s.name + "/" + strings.TrimSuffix(s.prefix, "/")
}

// Close releases nothing: the HTTP client is shared.
func (s *Store) Close() error { return nil }

func (s *Store) blob(key string) *blockblob.Client {
	return s.client.NewBlockBlobClient(s.prefix + key)
}

func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.put(ctx, key, body, size, false)
}

func (s *Store) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.put(ctx, key, body, size, true)
}

func (s *Store) put(ctx context.Context, key string, body io.ReadSeeker, size int64, exclusive bool) error {
	if err := storage.ValidKey(key); err != nil {
		return fmt.Errorf("az put: %w", err)
	}
	if size < 0 {
		return fmt.Errorf("az put %s: negative size %d", key, size)
	}
	var cond *blob.AccessConditions
	if exclusive {
		cond = &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfNoneMatch: to(azcore.ETagAny)}}
	}
	bb := s.blob(key)
	r := storage.ContextReader(ctx, body)
	var err error
	if size <= int64(s.blockSize) {
		err = s.putSmall(ctx, bb, r, size, cond)
	} else {
		err = s.putBlocks(ctx, bb, r, size, cond)
	}
	if err == nil {
		return nil
	}
	if exclusive && existsErr(err) {
		return fmt.Errorf("az create %s: %w", key, storage.ErrExists)
	}
	if exclusive && bloberror.HasCode(err, bloberror.InvalidBlockList) {
		// A concurrent Create committed first and discarded our staged
		// blocks: the key exists now.
		if _, serr := s.Stat(ctx, key); serr == nil {
			return fmt.Errorf("az create %s: %w", key, storage.ErrExists)
		}
	}
	return fmt.Errorf("az put %s: %w", key, classify(err))
}

// classify gives an error of the service the HTTP status and error code
// of its answer (azcore.ResponseError keeps them in fields), so that the
// storage.Store contract's classes hold: 5xx and 429 transient, 429 and
// ServerBusy throttled, 401 and 403 a permission refusal.
func classify(err error) error {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return &storage.HTTPError{Status: re.StatusCode, Code: re.ErrorCode, Err: err}
	}
	return err
}

func existsErr(err error) bool {
	if bloberror.HasCode(err, bloberror.BlobAlreadyExists, bloberror.ConditionNotMet) {
		return true
	}
	var re *azcore.ResponseError
	return errors.As(err, &re) && (re.StatusCode == http.StatusPreconditionFailed ||
		(re.StatusCode == http.StatusConflict && re.ErrorCode == string(bloberror.BlobAlreadyExists)))
}

// readExact fills buf from r and fails on a short body.
func readExact(r io.Reader, buf []byte, size int64) error {
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("body is shorter than the declared %d bytes", size)
		}
		return err
	}
	return nil
}

// checkEnd fails if r holds more bytes.
func checkEnd(r io.Reader, size int64) error {
	var one [1]byte
	n, err := io.ReadFull(r, one[:])
	if n > 0 {
		return fmt.Errorf("body is longer than the declared %d bytes", size)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// putSmall sends the object in one Put Blob request.
func (s *Store) putSmall(ctx context.Context, bb *blockblob.Client, r io.Reader, size int64, cond *blob.AccessConditions) error {
	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	buf := (*bp)[:size]
	if err := readExact(r, buf, size); err != nil {
		return err
	}
	if err := checkEnd(r, size); err != nil {
		return err
	}
	_, err := bb.Upload(ctx, streaming.NopCloser(bytes.NewReader(buf)), &blockblob.UploadOptions{AccessConditions: cond})
	return err
}

// putBlocks stages size bytes of r as blocks, at most s.concurrency at a
// time, and commits them. Block IDs carry a random upload ID so that two
// writers of one key never mix their blocks; uncommitted blocks are not
// listed and Azure drops them after a week.
func (s *Store) putBlocks(ctx context.Context, bb *blockblob.Client, r io.Reader, size int64, cond *blob.AccessConditions) error {
	var upload [16]byte
	rand.Read(upload[:])
	n := int((size + int64(s.blockSize) - 1) / int64(s.blockSize))
	if n > 50000 {
		return fmt.Errorf("object of %d bytes needs %d blocks of %d bytes; Azure allows 50000", size, n, s.blockSize)
	}
	ids := make([]string, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.concurrency)
	var readErr error
	for i := range n {
		if gctx.Err() != nil {
			break
		}
		var raw [20]byte
		copy(raw[:], upload[:])
		binary.BigEndian.PutUint32(raw[16:], uint32(i))
		ids[i] = base64.StdEncoding.EncodeToString(raw[:])
		bp := s.bufs.Get().(*[]byte)
		ln := min(int64(s.blockSize), size-int64(i)*int64(s.blockSize))
		buf := (*bp)[:ln]
		if err := readExact(r, buf, size); err != nil {
			s.bufs.Put(bp)
			readErr = err
			break
		}
		id := ids[i]
		g.Go(func() error {
			defer s.bufs.Put(bp)
			_, err := bb.StageBlock(gctx, id, streaming.NopCloser(bytes.NewReader(buf)), nil)
			return err
		})
	}
	err := g.Wait()
	if readErr != nil {
		return readErr
	}
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkEnd(r, size); err != nil {
		return err
	}
	_, err = bb.CommitBlockList(ctx, ids, &blockblob.CommitBlockListOptions{AccessConditions: cond})
	return err
}

func to[T any](v T) *T { return &v }

func notFound(err error) bool {
	if bloberror.HasCode(err, bloberror.BlobNotFound) {
		return true
	}
	var re *azcore.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusNotFound && re.ErrorCode != string(bloberror.ContainerNotFound)
}

func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := storage.ValidKey(key); err != nil {
		return nil, fmt.Errorf("az get: %w", err)
	}
	resp, err := s.blob(key).DownloadStream(ctx, nil)
	if err != nil {
		if notFound(err) {
			return nil, fmt.Errorf("az get %s: %w", key, storage.ErrNotFound)
		}
		return nil, fmt.Errorf("az get %s: %w", key, classify(err))
	}
	// The retry reader resumes an interrupted body at its offset, pinned to
	// the blob's ETag.
	return resp.NewRetryReader(ctx, &blob.RetryReaderOptions{MaxRetries: 3}), nil
}

func (s *Store) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	if err := storage.ValidKey(key); err != nil {
		return storage.ObjectInfo{}, fmt.Errorf("az stat: %w", err)
	}
	p, err := s.blob(key).GetProperties(ctx, nil)
	if err != nil {
		if notFound(err) {
			return storage.ObjectInfo{}, fmt.Errorf("az stat %s: %w", key, storage.ErrNotFound)
		}
		return storage.ObjectInfo{}, fmt.Errorf("az stat %s: %w", key, classify(err))
	}
	info := storage.ObjectInfo{Key: key}
	if p.ContentLength != nil {
		info.Size = *p.ContentLength
	}
	if p.LastModified != nil {
		info.ModTime = *p.LastModified
	}
	return info, nil
}

func (s *Store) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	full := s.prefix + prefix
	pager := s.client.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &full})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("az list %q: %w", prefix, classify(err))
		}
		for _, it := range page.Segment.BlobItems {
			if it.Name == nil || !strings.HasPrefix(*it.Name, s.prefix) {
				continue
			}
			info := storage.ObjectInfo{Key: strings.TrimPrefix(*it.Name, s.prefix)}
			if p := it.Properties; p != nil {
				if p.ContentLength != nil {
					info.Size = *p.ContentLength
				}
				if p.LastModified != nil {
					info.ModTime = *p.LastModified
				}
			}
			if err := fn(info); err != nil {
				return err
			}
		}
	}
	return nil
}

// Delete removes keys with Blob Batch requests of up to 256 deletes,
// batchConcurrency batches in flight. A key that does not exist is not an
// error. An account or emulator that refuses Blob Batch (a 4xx for the
// whole batch) gets one request per blob, deleteConcurrency in flight,
// from then on.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	for _, k := range keys {
		if err := storage.ValidKey(k); err != nil {
			return fmt.Errorf("az delete: %w", err)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if s.noBatch.Load() || len(keys) == 1 {
		return s.deleteEach(ctx, keys)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(batchConcurrency)
	for len(keys) > 0 {
		batch := keys[:min(len(keys), batchSize)]
		keys = keys[len(batch):]
		g.Go(func() error {
			err := s.deleteBatch(gctx, batch)
			var re *azcore.ResponseError
			if errors.As(err, &re) && re.StatusCode >= 400 && re.StatusCode < 500 && re.StatusCode != http.StatusTooManyRequests {
				s.noBatch.Store(true)
				return s.deleteEach(gctx, batch)
			}
			return err
		})
	}
	return g.Wait()
}

// deleteBatch deletes keys (at most 256) with one Blob Batch request.
// The error of the whole batch is returned as it is (a
// *azcore.ResponseError when the service refused it); a sub-request that
// failed for another reason than a missing blob fails the call, naming
// its key.
func (s *Store) deleteBatch(ctx context.Context, keys []string) error {
	bb, err := s.client.NewBatchBuilder()
	if err != nil {
		return fmt.Errorf("az delete: %w", err)
	}
	for _, k := range keys {
		if err := bb.Delete(s.prefix+k, nil); err != nil {
			return fmt.Errorf("az delete %s: %w", k, err)
		}
	}
	resp, err := s.client.SubmitBatch(ctx, bb, nil)
	if err != nil {
		return fmt.Errorf("az delete %d blobs from %s: %w", len(keys), keys[0], classify(err))
	}
	s.batches.Add(1)
	if len(resp.Responses) != len(keys) {
		return fmt.Errorf("az delete %d blobs from %s: the batch answered %d of them", len(keys), keys[0], len(resp.Responses))
	}
	for i, r := range resp.Responses {
		if r.Error == nil || notFound(r.Error) {
			continue
		}
		name := keys[i]
		if r.BlobName != nil {
			name = strings.TrimPrefix(*r.BlobName, s.prefix)
		}
		return fmt.Errorf("az delete %s: %w", name, classify(r.Error))
	}
	return nil
}

// deleteEach deletes keys one request each, deleteConcurrency in flight.
func (s *Store) deleteEach(ctx context.Context, keys []string) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(deleteConcurrency)
	for _, k := range keys {
		g.Go(func() error {
			_, err := s.blob(k).Delete(gctx, nil)
			if err != nil && !notFound(err) {
				return fmt.Errorf("az delete %s: %w", k, classify(err))
			}
			return nil
		})
	}
	return g.Wait()
}

// getenvOS is os.Getenv, for ParseURL's callers.
var getenvOS = os.Getenv

// ParseURLEnv is ParseURL with the process environment.
func ParseURLEnv(u *url.URL) (Options, error) { return ParseURL(u, getenvOS) }
