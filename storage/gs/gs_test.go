package gs

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
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/faults"
	"github.com/ckpt-io/ckpt/storage/retry"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

// emulator starts fake-gcs-server with a bucket and points
// STORAGE_EMULATOR_HOST at it for the test.
func emulator(t testing.TB, bucket string) *testservers.GCSServer {
	srv := testservers.GCS(t)
	srv.CreateBucket(t, bucket)
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		setenv(t, k, v)
	}
	return srv
}

// setenv is t.Setenv for tests and benchmarks.
func setenv(t testing.TB, k, v string) {
	switch t := t.(type) {
	case *testing.T:
		t.Setenv(k, v)
	case *testing.B:
		t.Setenv(k, v)
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
	emulator(t, "ckpt")
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		return open(t, Options{Bucket: "ckpt", Prefix: fmt.Sprintf("run/%d", n.Add(1))})
	}, storagetest.Options{})
}

func TestConformanceThroughRetryAndFaults(t *testing.T) {
	emulator(t, "ckpt")
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		i := n.Add(1)
		f := faults.New(open(t, Options{Bucket: "ckpt", Prefix: fmt.Sprintf("faulty/%d", i)}), faults.Uniform(uint64(i), 0.3))
		return retry.New(f, retry.Options{MaxAttempts: 30, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond})
	}, storagetest.Options{LargeSize: 20 << 20})
}

// TestConnectionsAreReused: see storagetest.ConnectionReuse.
func TestConnectionsAreReused(t *testing.T) {
	emulator(t, "reuse")
	s := open(t, Options{Bucket: "reuse", Prefix: "p"})
	defer s.Close()
	storagetest.ConnectionReuse(t, s)
}

func TestOpenByURL(t *testing.T) {
	srv := emulator(t, "urlbucket")
	ctx := context.Background()
	st, err := storage.Open(ctx, srv.URL("urlbucket", "/a/b/"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.String(); got != "gs://urlbucket/a/b" {
		t.Errorf("String() = %q", got)
	}
	if err := st.Put(ctx, "k", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(srv.Endpoint + "/storage/v1/b/urlbucket/o/" + url.PathEscape("a/b/k"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the object is not under the prefix: %s", resp.Status)
	}
	for _, bad := range []string{"gs:///p", "gs://b/p?x=1", "gs://user:secret@b/p"} {
		if _, err := storage.Open(ctx, bad); err == nil {
			t.Errorf("opened %s", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("error shows the secret: %v", err)
		}
	}
}

// authProxy forwards to the emulator only requests bearing the token, and
// answers 403 like GCS otherwise.
func authProxy(t *testing.T, target, token string) string {
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"error":{"code":403,"message":"caller does not have storage.buckets.get access","errors":[{"reason":"forbidden"}]}}`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestOpenFailuresAreOneClearLine checks that set-up mistakes give one line
// naming bucket and endpoint, without the credentials or library layers.
func TestOpenFailuresAreOneClearLine(t *testing.T) {
	srv := testservers.GCS(t)
	srv.CreateBucket(t, "exists")
	const token = "ya29.secret-token-never-print"
	proxy := authProxy(t, srv.Endpoint, "the-right-token")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()

	type tc struct {
		name, bucket, emulatorHost, endpoint, want string
	}
	cases := []tc{
		{name: "wrong credentials", bucket: "exists", endpoint: proxy, want: "access denied"},
		{name: "missing bucket", bucket: "nope", emulatorHost: srv.Host, want: "does not exist"},
		{name: "unreachable endpoint", bucket: "exists", emulatorHost: dead, want: "refused the connection"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			setenv(t, "STORAGE_EMULATOR_HOST", c.emulatorHost)
			o := Options{Bucket: c.bucket, Endpoint: c.endpoint}
			shownEndpoint := c.endpoint
			if c.endpoint != "" {
				o.ClientOptions = []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token}))}
			} else {
				shownEndpoint = "http://" + c.emulatorHost
			}
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
			for _, want := range []string{fmt.Sprintf("%q", c.bucket), shownEndpoint, c.want} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			for _, bad := range []string{"\n", token, "googleapi:"} {
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
	t.Run("the right token works through the proxy", func(t *testing.T) {
		setenv(t, "STORAGE_EMULATOR_HOST", "")
		s := open(t, Options{Bucket: "exists", Endpoint: proxy, ClientOptions: []option.ClientOption{
			option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "the-right-token"}))}})
		defer s.Close()
		if err := s.Put(context.Background(), "k", strings.NewReader("v"), 1); err != nil {
			t.Fatal(err)
		}
	})
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestResumableUploadAndExclusiveCreate(t *testing.T) {
	emulator(t, "ckpt")
	s := open(t, Options{Bucket: "ckpt", Prefix: "big", ChunkSize: 1 << 20})
	defer s.Close()
	ctx := context.Background()
	data := randomBytes(t, 5<<20+123) // six chunks, the last short
	if err := s.Put(ctx, "obj", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(ctx, "obj")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (err %v), differs", len(got), err)
	}
	if err := s.Create(ctx, "c", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("resumable create: %v", err)
	}
	if err := s.Create(ctx, "c", bytes.NewReader(data[:3<<20]), 3<<20); !errors.Is(err, storage.ErrExists) {
		t.Fatalf("second resumable create: %v, want ErrExists", err)
	}
	if info, err := s.Stat(ctx, "c"); err != nil || info.Size != int64(len(data)) {
		t.Fatalf("after the refused create: %+v %v", info, err)
	}
}

// shiftyBody returns different bytes on its second pass, as a file changed
// under the uploader would.
type shiftyBody struct {
	*bytes.Reader
	data   []byte
	passes int
}

func (b *shiftyBody) Seek(off int64, whence int) (int64, error) {
	b.passes++
	if b.passes == 1 {
		b.data[len(b.data)/2] ^= 0xff
	}
	return b.Reader.Seek(off, whence)
}

func TestBodyThatChangesIsRejectedByTheChecksum(t *testing.T) {
	emulator(t, "ckpt")
	s := open(t, Options{Bucket: "ckpt"})
	defer s.Close()
	ctx := context.Background()
	for _, size := range []int{1000, 3 << 20} {
		data := randomBytes(t, size)
		body := &shiftyBody{Reader: bytes.NewReader(data), data: data}
		key := fmt.Sprintf("shifty%d", size)
		err := s.Put(ctx, key, body, int64(size))
		if err == nil {
			t.Errorf("a %d-byte body that changed during the upload was stored", size)
		}
		if _, err := s.Stat(ctx, key); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("the rejected upload left an object: %v", err)
		}
	}
}

// BenchmarkPutGet measures upload and download throughput of 64 MiB objects
// against fake-gcs-server on loopback (MB/s in the output).
func BenchmarkPutGet(b *testing.B) {
	emulator(b, "bench")
	s := open(b, Options{Bucket: "bench", Prefix: "b"})
	defer s.Close()
	storagetest.BenchmarkPutGet(b, s, 64<<20)
}

// TestErrorClasses: see storagetest.Errors.
func TestErrorClasses(t *testing.T) {
	srv := emulator(t, "classes")
	relay := storagetest.NewRelay(t, srv.Endpoint)
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(relay.URL, "http://"))
	var n atomic.Int64
	storagetest.Errors(t, relay, func(t *testing.T) storage.Store {
		return open(t, Options{Bucket: "classes", Prefix: fmt.Sprintf("run/%d", n.Add(1))})
	})
}
