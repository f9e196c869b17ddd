package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/faults"
	"github.com/ckpt-io/ckpt/storage/retry"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

func options(srv *testservers.S3Server, bucket, prefix string) Options {
	return Options{
		Bucket:      bucket,
		Prefix:      prefix,
		Endpoint:    srv.Endpoint,
		Region:      srv.Region,
		PathStyle:   true,
		Credentials: credentials.NewStaticCredentialsProvider(srv.AccessKey, srv.SecretKey, ""),
	}
}

func open(t testing.TB, o Options) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		return open(t, options(srv, "ckpt", fmt.Sprintf("run/%d", n.Add(1))))
	}, storagetest.Options{})
}

func TestConformanceThroughRetryAndFaults(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		i := n.Add(1)
		f := faults.New(open(t, options(srv, "ckpt", fmt.Sprintf("faulty/%d", i))), faults.Uniform(uint64(i), 0.3))
		return retry.New(f, retry.Options{MaxAttempts: 30, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond})
	}, storagetest.Options{LargeSize: 20 << 20})
}

func TestOpenByURLWithEnvironment(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "envbucket")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ctx := context.Background()
	st, err := storage.Open(ctx, "s3://envbucket/some/prefix/?path_style=true")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.String(); got != "s3://envbucket/some/prefix" {
		t.Errorf("String() = %q", got)
	}
	if err := st.Put(ctx, "k", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
	out, err := srv.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("envbucket"), Key: aws.String("some/prefix/k")})
	if err != nil || aws.ToInt64(out.ContentLength) != 1 {
		t.Fatalf("the object is not under the prefix: %v", err)
	}
	st2, err := storage.Open(ctx, srv.URL("envbucket", "other"))
	if err != nil {
		t.Fatal(err)
	}
	st2.Close()
}

func TestParseURL(t *testing.T) {
	good := map[string]Options{
		"s3://b":      {Bucket: "b"},
		"s3://b/p/q/": {Bucket: "b", Prefix: "p/q"},
		"s3://b/p?path_style=true&region=eu-west-1&endpoint=http://h:1&sse=aws:kms&sse_kms_key_id=k": {
			Bucket: "b", Prefix: "p", PathStyle: true, Region: "eu-west-1", Endpoint: "http://h:1", SSE: "aws:kms", SSEKMSKeyID: "k"},
	}
	for raw, want := range good {
		u, _ := url.Parse(raw)
		got, err := ParseURL(u)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ParseURL(%s) = %+v, %v; want %+v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"s3:///p", "s3://b/p?pathstyle=true", "s3://b?path_style=maybe", "s3://AKIA:secret@b/p"} {
		u, _ := url.Parse(raw)
		_, err := ParseURL(u)
		if err == nil {
			t.Errorf("ParseURL(%s) accepted a bad URL", raw)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL(%s) error shows the secret: %v", raw, err)
		}
	}
}

// TestOpenFailuresAreOneClearLine checks that the fail-fast probe turns the
// common set-up mistakes into one line that names the bucket and endpoint,
// says what to check, and leaks neither the secret nor the SDK's layers.
func TestOpenFailuresAreOneClearLine(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "exists")
	const secret = "S3CR3T-never-print-me"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadEndpoint := "http://" + l.Addr().String()
	l.Close()

	cases := []struct {
		name, bucket, endpoint, access, want string
	}{
		{"wrong credentials", "exists", srv.Endpoint, "testkey", "access denied"},
		{"unknown access key", "exists", srv.Endpoint, "nobody", "access denied"},
		{"missing bucket", "nope", srv.Endpoint, srv.AccessKey, "does not exist"},
		{"unreachable endpoint", "exists", deadEndpoint, srv.AccessKey, "refused the connection"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sec := secret
			if c.name == "missing bucket" || c.name == "unreachable endpoint" {
				sec = srv.SecretKey
			}
			o := Options{Bucket: c.bucket, Endpoint: c.endpoint, PathStyle: true, Region: srv.Region,
				Credentials: credentials.NewStaticCredentialsProvider(c.access, sec, "")}
			start := time.Now()
			_, err := New(context.Background(), o)
			if err == nil {
				t.Fatal("open succeeded")
			}
			msg := err.Error()
			t.Logf("%s: %s", c.name, msg)
			if time.Since(start) > 5*time.Second {
				t.Errorf("failing took %v: the probe must not retry", time.Since(start))
			}
			for _, want := range []string{fmt.Sprintf("%q", c.bucket), c.endpoint, c.want} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			for _, bad := range []string{"\n", sec, "operation error", "RequestID"} {
				if strings.Contains(msg, bad) {
					t.Errorf("error %q contains %q", msg, bad)
				}
			}
			var oe *OpenError
			if !errors.As(err, &oe) {
				t.Errorf("error is %T, want *OpenError", err)
			}
		})
	}
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestMultipartObjectAndExclusiveCreate(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	o := options(srv, "ckpt", "mp")
	o.PartSize = 5 << 20
	s := open(t, o)
	ctx := context.Background()
	data := randomBytes(t, 17<<20) // 4 parts of 5 MiB (the last short)
	if err := s.Put(ctx, "big", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	head, err := s.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("ckpt"), Key: aws.String("mp/big")})
	if err != nil {
		t.Fatal(err)
	}
	if etag := aws.ToString(head.ETag); !strings.HasSuffix(strings.Trim(etag, `"`), "-4") {
		t.Errorf("ETag %s: not a 4-part multipart object", etag)
	}
	rc, err := s.Get(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("multipart object read back %d bytes (err %v), differs", len(got), err)
	}

	if err := s.Create(ctx, "bigc", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("multipart create: %v", err)
	}
	other := randomBytes(t, 11<<20)
	err = s.Create(ctx, "bigc", bytes.NewReader(other), int64(len(other)))
	if !errors.Is(err, storage.ErrExists) {
		t.Fatalf("second multipart create: %v, want ErrExists", err)
	}
	if info, err := s.Stat(ctx, "bigc"); err != nil || info.Size != int64(len(data)) {
		t.Fatalf("after the refused create: %+v %v", info, err)
	}

	// A body shorter or longer than declared fails and leaves no upload.
	if err := s.Put(ctx, "short", bytes.NewReader(data[:12<<20]), 16<<20); err == nil {
		t.Error("a multipart put of a short body succeeded")
	}
	if err := s.Put(ctx, "long", bytes.NewReader(data), 12<<20); err == nil {
		t.Error("a multipart put of a long body succeeded")
	}
	for _, k := range []string{"short", "long"} {
		if _, err := s.Stat(ctx, k); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("failed put left %s: %v", k, err)
		}
	}
	ups, err := s.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("ckpt")})
	if err != nil {
		t.Fatal(err)
	}
	if len(ups.Uploads) != 0 {
		t.Errorf("failed multipart puts left %d uploads", len(ups.Uploads))
	}
}

// headerRecorder records a header of every request of the named operations.
type headerRecorder struct {
	mu   sync.Mutex
	seen map[string]string // operation -> header value
}

func (h *headerRecorder) middleware(header string) func(*middleware.Stack) error {
	return func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("recordHeader",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				if req, ok := in.Request.(*smithyhttp.Request); ok {
					h.mu.Lock()
					h.seen[middleware.GetOperationName(ctx)] = req.Header.Get(header)
					h.mu.Unlock()
				}
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	}
}

func TestServerSideEncryptionIsRequested(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	for _, sse := range []string{"AES256", "aws:kms"} {
		t.Run(sse, func(t *testing.T) {
			rec := &headerRecorder{seen: map[string]string{}}
			o := options(srv, "ckpt", "sse")
			o.SSE = sse
			if sse == "aws:kms" {
				o.SSEKMSKeyID = "test-key"
			}
			o.PartSize = 5 << 20
			o.apiOptions = append(o.apiOptions, rec.middleware("X-Amz-Server-Side-Encryption"))
			s := open(t, o)
			ctx := context.Background()
			small := []byte("encrypted please")
			err := s.Put(ctx, "small", bytes.NewReader(small), int64(len(small)))
			t.Logf("versitygw answered a PutObject with sse=%s: %v", sse, err)
			if sse == "AES256" && err != nil {
				t.Errorf("put with sse=AES256: %v", err)
			}
			big := randomBytes(t, 6<<20)
			err = s.Put(ctx, "big", bytes.NewReader(big), int64(len(big)))
			t.Logf("versitygw answered a multipart upload with sse=%s: %v", sse, err)
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, op := range []string{"PutObject", "CreateMultipartUpload"} {
				if got := rec.seen[op]; got != sse {
					t.Errorf("%s sent x-amz-server-side-encryption %q, want %q", op, got, sse)
				}
			}
		})
	}
}

func TestCleanIncompleteAbortsForgottenUploads(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	s := open(t, options(srv, "ckpt", "job"))
	ctx := context.Background()
	c := s.Client()
	start := func(key string) string {
		up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("ckpt"), Key: aws.String(key)})
		if err != nil {
			t.Fatal(err)
		}
		part := randomBytes(t, 5<<20)
		if _, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("ckpt"), Key: aws.String(key),
			UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: bytes.NewReader(part)}); err != nil {
			t.Fatal(err)
		}
		return aws.ToString(up.UploadId)
	}
	start("job/crashed/object")     // never completed
	start("elsewhere/other/object") // outside the store's prefix

	n, _, err := s.CleanIncomplete(ctx, "", time.Now().Add(-time.Hour))
	if err != nil || n != 0 {
		t.Fatalf("clean of uploads older than an hour: %d, %v; want none", n, err)
	}
	n, b, err := s.CleanIncomplete(ctx, "", time.Now().Add(time.Minute))
	if err != nil || n != 1 {
		t.Fatalf("clean: %d uploads, %v; want 1", n, err)
	}
	if b != 5<<20 {
		t.Errorf("clean reported %d bytes, want %d", b, 5<<20)
	}
	ups, err := c.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("ckpt")})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, u := range ups.Uploads {
		left = append(left, aws.ToString(u.Key))
	}
	if len(left) != 1 || left[0] != "elsewhere/other/object" {
		t.Fatalf("uploads left: %v, want only the one outside the prefix", left)
	}
	if cl, ok := storage.AsCleaner(retry.New(s, retry.Options{})); !ok || cl != s {
		t.Fatal("AsCleaner does not find the S3 store through a decorator")
	}
}

func TestCancelledGetAndPutReturnPromptly(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	s := open(t, options(srv, "ckpt", "c"))
	ctx, cancel := context.WithCancel(context.Background())
	data := randomBytes(t, 40<<20)
	done := make(chan error, 1)
	go func() { done <- s.Put(ctx, "big", bytes.NewReader(data), int64(len(data))) }()
	time.Sleep(30 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Log("the put finished before the cancel")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled multipart put did not return")
	}
}

// BenchmarkPutGet measures upload and download throughput of 64 MiB objects
// against versitygw on loopback (MB/s in the output), over HTTP and HTTPS.
func BenchmarkPutGet(b *testing.B) {
	b.Run("http", func(b *testing.B) { benchPutGet(b, testservers.S3(b)) })
	b.Run("https", func(b *testing.B) {
		srv := testservers.S3(b, testservers.WithTLS())
		b.Setenv("AWS_CA_BUNDLE", srv.CAFile)
		benchPutGet(b, srv)
	})
}

func benchPutGet(b *testing.B, srv *testservers.S3Server) {
	srv.CreateBucket(b, "bench")
	s := open(b, options(srv, "bench", "b"))
	defer s.Close()
	storagetest.BenchmarkPutGet(b, s, 64<<20)
}

// TestConformanceOverHTTPS runs the suite against versitygw serving TLS with
// a test CA given through AWS_CA_BUNDLE, as a production endpoint would be
// reached (HTTPS changes how the SDK sends checksums: as trailers).
func TestConformanceOverHTTPS(t *testing.T) {
	srv := testservers.S3(t, testservers.WithTLS())
	srv.CreateBucket(t, "ckpt")
	t.Setenv("AWS_CA_BUNDLE", srv.CAFile)
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		return open(t, options(srv, "ckpt", fmt.Sprintf("tls/%d", n.Add(1))))
	}, storagetest.Options{})
}

// TestSlowDownIsRetriedWithBackoff puts a proxy in front of versitygw that
// answers the first PutObject attempts with 503 SlowDown, as S3 does under
// load: the SDK's retryer must back off and succeed.
func TestSlowDownIsRetriedWithBackoff(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	target, _ := url.Parse(srv.Endpoint)
	rp := httputil.NewSingleHostReverseProxy(target)
	var slowDowns atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/slow") && slowDowns.Load() < 2 {
			slowDowns.Add(1)
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	o := options(srv, "ckpt", "p")
	o.Endpoint = proxy.URL
	s := open(t, o)
	defer s.Close()
	start := time.Now()
	if err := s.Put(context.Background(), "slow", strings.NewReader("payload"), 7); err != nil {
		t.Fatalf("put through two SlowDown answers: %v", err)
	}
	if slowDowns.Load() != 2 {
		t.Fatalf("the proxy answered SlowDown %d times, want 2", slowDowns.Load())
	}
	t.Logf("succeeded after 2 SlowDown answers in %v", time.Since(start))
	rc, err := s.Get(context.Background(), "slow")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "payload" {
		t.Fatalf("read back %q", got)
	}
	// Create is sent once: the SlowDown reaches the caller (for the retry
	// decorator), classified as transient and throttled.
	slowDowns.Store(0)
	err = s.Create(context.Background(), "slow2", strings.NewReader("x"), 1)
	if err == nil || !retry.Transient(err) || !retry.Throttled(err) {
		t.Fatalf("create through SlowDown: %v; want a transient, throttled error", err)
	}
	if slowDowns.Load() != 1 {
		t.Fatalf("create was attempted %d times, want 1 (no SDK retries for conditional writes)", slowDowns.Load())
	}
	err = retry.New(s, retry.Options{BaseDelay: time.Millisecond}).Create(context.Background(), "slow2", strings.NewReader("x"), 1)
	if err != nil {
		t.Fatalf("create through the retry decorator after SlowDown: %v", err)
	}
}

// TestUploadsCarryACheckedCRC32AndAnUnsignedPayload checks, over plain
// HTTP, that single PUTs and file parts are sent with the CRC32 this
// package computes (so the SDK adds no SHA-256 pass of its own), signed as
// UNSIGNED-PAYLOAD (so the server computes none either), and that the
// server does check the CRC32: a body whose bytes change between the
// checksum pass and the send is refused, and no object is left.
func TestUploadsCarryACheckedCRC32AndAnUnsignedPayload(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	payload := &headerRecorder{seen: map[string]string{}}
	crc := &headerRecorder{seen: map[string]string{}}
	o := options(srv, "ckpt", "crc")
	o.PartSize = 5 << 20
	o.apiOptions = append(o.apiOptions, payload.middleware("X-Amz-Content-Sha256"), crc.middleware("X-Amz-Checksum-Crc32"))
	s := open(t, o)
	ctx := context.Background()
	small := randomBytes(t, 100<<10)
	if err := s.Put(ctx, "small", bytes.NewReader(small), int64(len(small))); err != nil {
		t.Fatal(err)
	}
	big := randomBytes(t, 6<<20)
	if err := s.Put(ctx, "big", bytes.NewReader(big), int64(len(big))); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"PutObject", "UploadPart"} {
		if got := payload.seen[op]; got != "UNSIGNED-PAYLOAD" {
			t.Errorf("%s sent x-amz-content-sha256 %q, want UNSIGNED-PAYLOAD", op, got)
		}
		if crc.seen[op] == "" {
			t.Errorf("%s sent no x-amz-checksum-crc32", op)
		}
	}
	for key, want := range map[string][]byte{"small": small, "big": big} {
		rc, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("get %s: %d bytes, equal %v, err %v", key, len(got), bytes.Equal(got, want), err)
		}
	}

	changed := append([]byte(nil), small...)
	changed[len(changed)/2] ^= 1
	err := s.Put(ctx, "changing", &changingBody{first: small, then: changed}, int64(len(small)))
	if err == nil {
		t.Fatal("a body that changed after its CRC32 was computed was stored")
	}
	t.Logf("changed body refused: %v", err)
	if _, err := s.Stat(ctx, "changing"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("stat after the refused put: %v, want ErrNotFound", err)
	}
}

// changingBody reads as first until its first rewind, then as then.
type changingBody struct {
	first, then []byte
	r           *bytes.Reader
	rewound     bool
}

func (b *changingBody) Read(p []byte) (int, error) {
	if b.r == nil {
		b.r = bytes.NewReader(b.first)
	}
	return b.r.Read(p)
}

func (b *changingBody) Seek(off int64, whence int) (int64, error) {
	if b.r == nil {
		b.r = bytes.NewReader(b.first)
	}
	if off == 0 && whence == io.SeekStart && !b.rewound {
		b.rewound = true
		b.r = bytes.NewReader(b.then)
	}
	return b.r.Seek(off, whence)
}

// BenchmarkPutSmall measures the per-object cost of single PUTs of the size
// of an LSM's small files (ns/op is the wall time per object, with 1 and 4
// uploads in flight), against versitygw on loopback over HTTP.
func BenchmarkPutSmall(b *testing.B) {
	srv := testservers.S3(b)
	srv.CreateBucket(b, "bench")
	s := open(b, options(srv, "bench", "b"))
	defer s.Close()
	for _, size := range []int{64 << 10, 512 << 10} {
		data := make([]byte, size)
		rand.Read(data)
		for _, inFlight := range []int{1, 4} {
			b.Run(fmt.Sprintf("%dKiB/inflight=%d", size>>10, inFlight), func(b *testing.B) {
				b.SetBytes(int64(size))
				var next atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, inFlight)
				for range inFlight {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
							if err := s.Put(context.Background(), fmt.Sprintf("small/%d", i%64), bytes.NewReader(data), int64(size)); err != nil {
								errs <- err
								return
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			})
		}
	}
}

// TestConnectionsAreReused: see storagetest.ConnectionReuse.
func TestConnectionsAreReused(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "reuse")
	s := open(t, options(srv, "reuse", "p"))
	defer s.Close()
	storagetest.ConnectionReuse(t, s)
}

// TestOpenSurvivesATransientAnswer: one 503 SlowDown (or a reset
// connection) at start-up is asked again, so an agent starts against a
// throttling endpoint; a refused request (4xx) still fails at once.
func TestOpenSurvivesATransientAnswer(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "flaky")
	relay := storagetest.NewRelay(t, srv.Endpoint)
	for _, c := range []struct {
		fault storagetest.Fault
		fails int
		ok    bool
	}{{storagetest.Unavailable, 2, true}, {storagetest.Reset, 1, true}, {storagetest.Unavailable, 10, false}, {storagetest.Forbid, 1, false}} {
		relay.FailNext(c.fault, c.fails)
		o := options(srv, "flaky", "")
		o.Endpoint = relay.URL
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		s, err := New(ctx, o)
		cancel()
		if (err == nil) != c.ok {
			t.Errorf("open with %d x %s first: %v, want ok=%v", c.fails, c.fault, err, c.ok)
		}
		if s != nil {
			s.Close()
		}
	}
}

// TestErrorClasses: see storagetest.Errors.
func TestErrorClasses(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "classes")
	relay := storagetest.NewRelay(t, srv.Endpoint)
	var n atomic.Int64
	storagetest.Errors(t, relay, func(t *testing.T) storage.Store {
		o := options(srv, "classes", fmt.Sprintf("run/%d", n.Add(1)))
		o.Endpoint = relay.URL
		return open(t, o)
	})
}
