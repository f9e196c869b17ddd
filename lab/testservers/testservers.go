// Package testservers starts real object-store servers for tests: versitygw
// (an S3 gateway over a directory) and fake-gcs-server (the GCS emulator).
//
// The servers are Go programs installed with `go install` at pinned
// versions into <repo root>/.bin the first time a test needs them (about a
// minute cold); a file lock keeps parallel test binaries from installing at
// once. Each call starts a fresh server on a free 127.0.0.1 port with its own
// data directory and stops it at t.Cleanup.
//
// With -short the helpers skip the test, saying why. Otherwise a failure to
// install or start a server fails the test: a missing server never turns
// into a silent skip.
package testservers

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/servers"
)

// Pinned server versions (see package servers).
const (
	VersitygwModule      = servers.VersitygwModule
	VersitygwVersion     = servers.VersitygwVersion
	FakeGCSServerModule  = servers.FakeGCSServerModule
	FakeGCSServerVersion = servers.FakeGCSServerVersion
)

// RepoRoot returns the directory holding go.mod, found by walking up from
// the working directory (a test runs in its package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return servers.RepoRoot(dir)
}

// binary returns the path of the named server, installing it first if
// needed (see servers.Install).
func binary(t testing.TB, name, module, version string) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatalf("testservers: find the repository root: %v", err)
	}
	path, err := servers.Install(context.Background(), root, name, module, version, func(f string, a ...any) { t.Logf("testservers: "+f, a...) })
	if err != nil {
		t.Fatalf("testservers: %v", err)
	}
	return path
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	port, err := servers.FreePort()
	if err != nil {
		t.Fatalf("testservers: %v", err)
	}
	return port
}

// process is a started server.
type process struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

// start runs a server, waits until ready answers true, and stops it at
// cleanup. args gets the port to listen on. A start that fails because the
// port was taken in between is retried on another port.
func start(t testing.TB, name, bin string, args func(port int) []string, ready func(port int) bool) int {
	t.Helper()
	logDir := t.TempDir()
	var lastErr error
	for try := range 3 {
		port := freePort(t)
		logPath := filepath.Join(logDir, fmt.Sprintf("%s-%d.log", name, try))
		p, err := launch(bin, args(port), logPath)
		if err != nil {
			t.Fatalf("testservers: start %s: %v", name, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if ready(port) {
				t.Cleanup(func() { p.stop() })
				return port
			}
			select {
			case <-p.exited:
				log, _ := os.ReadFile(logPath)
				lastErr = fmt.Errorf("%s exited at start (%v):\n%s", name, p.cmd.ProcessState, tail(log, 2000))
			case <-time.After(50 * time.Millisecond):
				if time.Now().Before(deadline) {
					continue
				}
				p.stop()
				log, _ := os.ReadFile(logPath)
				t.Fatalf("testservers: %s on 127.0.0.1:%d not ready after 30s:\n%s", name, port, tail(log, 2000))
			}
			break
		}
	}
	t.Fatalf("testservers: %v", lastErr)
	return 0
}

func launch(bin string, args []string, logPath string) (*process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // no orphan if the test binary dies
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	p := &process{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		log.Close()
		close(p.exited)
	}()
	return p, nil
}

// stop ends the server: SIGTERM, then SIGKILL after 5s.
func (p *process) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

func skipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("testservers: -short: not starting %s (run without -short to test against it)", what)
	}
}

// httpAnswers reports whether an HTTP server answers GET url with any
// status. A nil client means a plain one.
func httpAnswers(c *http.Client, rawURL string) bool {
	if c == nil {
		c = &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	}
	resp, err := c.Get(rawURL)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

// S3Server is a running versitygw with one account (AccessKey, SecretKey).
type S3Server struct {
	// Endpoint is the server's base URL, http://127.0.0.1:PORT (WithHost: that host).
	Endpoint string
	// DataDir is the directory versitygw keeps buckets in (one directory
	// per bucket, one file per object), for tests that measure stored bytes.
	DataDir   string
	AccessKey string
	SecretKey string
	Region    string
	// CAFile is the PEM file of the CA that signed the server's
	// certificate (WithTLS only).
	CAFile string
}

// S3Option configures S3.
type S3Option func(*s3Config)

type s3Config struct {
	tls  bool
	host string
}

// WithHost serves on host instead of 127.0.0.1: an address the test set
// up itself, such as the host side of a veth pair that agents in other
// network namespaces reach (plain HTTP only).
func WithHost(host string) S3Option { return func(c *s3Config) { c.host = host } }

// WithTLS serves HTTPS with a certificate for 127.0.0.1 signed by a fresh
// test CA (S3Server.CAFile; Env sets AWS_CA_BUNDLE to it).
func WithTLS() S3Option { return func(c *s3Config) { c.tls = true } }

// S3 starts a versitygw server with a fresh data directory; see the package
// comment for installation, -short and failures.
func S3(t testing.TB, opts ...S3Option) *S3Server {
	t.Helper()
	skipShort(t, "the S3 server (versitygw)")
	cfg := s3Config{host: "127.0.0.1"}
	for _, o := range opts {
		o(&cfg)
	}
	bin := binary(t, "versitygw", VersitygwModule, VersitygwVersion)
	s := &S3Server{DataDir: t.TempDir(), AccessKey: "testkey", SecretKey: "testsecret", Region: "us-east-1"}
	scheme := "http"
	var tlsArgs []string
	var client *http.Client
	if cfg.tls {
		scheme = "https"
		var certFile, keyFile string
		s.CAFile, certFile, keyFile, client = testCerts(t)
		tlsArgs = []string{"--cert", certFile, "--key", keyFile}
	}
	// Keep-alive on, as on production endpoints (versitygw closes each
	// connection after one request by default), so that tests see whether
	// clients reuse their connections.
	port := start(t, "versitygw", bin, func(port int) []string {
		args := []string{"--port", fmt.Sprintf("%s:%d", cfg.host, port), "--access", s.AccessKey, "--secret", s.SecretKey,
			"--region", s.Region, "--quiet", "--keep-alive"}
		args = append(args, tlsArgs...)
		return append(args, "posix", s.DataDir)
	}, func(port int) bool { return httpAnswers(client, fmt.Sprintf("%s://%s:%d/", scheme, cfg.host, port)) })
	s.Endpoint = fmt.Sprintf("%s://%s:%d", scheme, cfg.host, port)
	return s
}

// Env returns the environment a ckpt process needs to reach the server
// with the AWS SDK's default chain: credentials, endpoint and region, and
// the CA bundle with WithTLS.
func (s *S3Server) Env() []string {
	env := []string{
		"AWS_ACCESS_KEY_ID=" + s.AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + s.SecretKey,
		"AWS_ENDPOINT_URL=" + s.Endpoint,
		"AWS_REGION=" + s.Region,
	}
	if s.CAFile != "" {
		env = append(env, "AWS_CA_BUNDLE="+s.CAFile)
	}
	return env
}

// URL returns the storage URL of prefix in bucket on this server (path
// style, endpoint and region included; the credentials come from Env).
func (s *S3Server) URL(bucket, prefix string) string {
	q := url.Values{"path_style": {"true"}, "endpoint": {s.Endpoint}, "region": {s.Region}}
	return "s3://" + bucket + "/" + strings.Trim(prefix, "/") + "?" + q.Encode()
}

// CreateBucket creates a bucket on the server, failing the test on error.
func (s *S3Server) CreateBucket(t testing.TB, name string) {
	t.Helper()
	if err := s.createBucket(context.Background(), name); err != nil {
		t.Fatalf("testservers: create S3 bucket %q: %v", name, err)
	}
}

// GCSServer is a running fake-gcs-server (no authentication).
type GCSServer struct {
	// Endpoint is the server's base URL, http://127.0.0.1:PORT.
	Endpoint string
	// Host is the host:port for STORAGE_EMULATOR_HOST.
	Host string
	// DataDir is the server's filesystem backend root (a directory per
	// bucket), for tests that measure stored bytes.
	DataDir string
}

// GCS starts a fake-gcs-server with a filesystem backend in a fresh data
// directory; see the package comment for installation, -short and failures.
func GCS(t testing.TB) *GCSServer {
	t.Helper()
	skipShort(t, "the GCS emulator (fake-gcs-server)")
	bin := binary(t, "fake-gcs-server", FakeGCSServerModule, FakeGCSServerVersion)
	s := &GCSServer{DataDir: t.TempDir()}
	port := start(t, "fake-gcs-server", bin, func(port int) []string {
		return []string{"-scheme", "http", "-host", "127.0.0.1", "-port", fmt.Sprint(port),
			"-public-host", fmt.Sprintf("127.0.0.1:%d", port),
			"-backend", "filesystem", "-filesystem-root", s.DataDir, "-log-level", "warn"}
	}, func(port int) bool {
		c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/storage/v1/b", port))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	s.Host = fmt.Sprintf("127.0.0.1:%d", port)
	s.Endpoint = "http://" + s.Host
	return s
}

// Env returns the environment a ckpt process needs to use the emulator.
func (s *GCSServer) Env() []string {
	return []string{"STORAGE_EMULATOR_HOST=" + s.Host}
}

// URL returns the storage URL of prefix in bucket (the endpoint comes from
// STORAGE_EMULATOR_HOST, see Env).
func (s *GCSServer) URL(bucket, prefix string) string {
	return "gs://" + bucket + "/" + strings.Trim(prefix, "/")
}

// CreateBucket creates a bucket on the emulator, failing the test on error.
func (s *GCSServer) CreateBucket(t testing.TB, name string) {
	t.Helper()
	body := fmt.Sprintf(`{"name":%q}`, name)
	resp, err := http.Post(s.Endpoint+"/storage/v1/b?project=test", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("testservers: create GCS bucket %q: %v", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		t.Fatalf("testservers: create GCS bucket %q: %s: %s", name, resp.Status, tail(b.Bytes(), 500))
	}
}
