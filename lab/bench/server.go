package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckpt-io/ckpt/lab/servers"
	"github.com/ckpt-io/ckpt/storage"
	s3store "github.com/ckpt-io/ckpt/storage/s3"
)

// Pinned S3 server the bench starts when no --storage is given.
const (
	benchBucket    = "bench"
	benchAccessKey = "benchkey"
	benchSecretKey = "benchsecret"
	benchRegion    = "us-east-1"
)

// target is where the bench writes: how to open it in this process, how a
// child `ckpt agent` reaches it, and how the peers (rclone, restic) name
// the same place.
type target struct {
	url  string   // storage URL for child processes
	env  []string // extra environment for child processes (credentials)
	kind string   // "s3", "file" or "gs"
	desc string   // for the report

	open func(ctx context.Context) (storage.Store, error)

	// S3 only: what the peers need.
	endpoint, bucket, prefix, access, secret string
	// file only: the directory.
	dir string
	// dataDir is the directory of the versitygw the bench started (its
	// posix backend: <dataDir>/<bucket>/<key>), "" otherwise.
	dataDir string
	// pid is the storage server's process when the bench started one (0
	// otherwise), for its CPU time.
	pid int

	stop func()
}

// rcloneRemote names sub (a path under the target) for rclone.
func (t *target) rcloneRemote(sub string) (string, error) {
	switch t.kind {
	case "file":
		return filepath.Join(t.dir, sub), nil
	case "s3":
		if t.access == "" || t.secret == "" {
			return "", errors.New("no static S3 credentials in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY to give rclone")
		}
		if t.endpoint == "" {
			return "", errors.New("no S3 endpoint (endpoint= or AWS_ENDPOINT_URL) to give rclone")
		}
		return fmt.Sprintf(":s3,provider=Other,endpoint='%s',access_key_id=%s,secret_access_key=%s:%s/%s",
			t.endpoint, t.access, t.secret, t.bucket, joinKey(t.prefix, sub)), nil
	}
	return "", fmt.Errorf("%s storage is not wired for the peers in this harness (use s3:// or file://)", t.kind)
}

// resticRepo names sub as a restic repository, with the environment restic needs.
func (t *target) resticRepo(sub string) (string, []string, error) {
	switch t.kind {
	case "file":
		return filepath.Join(t.dir, sub), nil, nil
	case "s3":
		if t.access == "" || t.secret == "" || t.endpoint == "" {
			return "", nil, errors.New("no static S3 credentials or endpoint to give restic")
		}
		return "s3:" + strings.TrimRight(t.endpoint, "/") + "/" + t.bucket + "/" + joinKey(t.prefix, sub),
			[]string{"AWS_ACCESS_KEY_ID=" + t.access, "AWS_SECRET_ACCESS_KEY=" + t.secret}, nil
	}
	return "", nil, fmt.Errorf("%s storage is not wired for the peers in this harness (use s3:// or file://)", t.kind)
}

func joinKey(a, b string) string {
	a, b = strings.Trim(a, "/"), strings.Trim(b, "/")
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "/" + b
}

// openTarget parses a user's storage URL.
func openTarget(ctx context.Context, raw string) (*target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("storage URL %q: %w", raw, err)
	}
	t := &target{url: raw, kind: u.Scheme, desc: u.Redacted(), stop: func() {}}
	t.open = func(ctx context.Context) (storage.Store, error) { return storage.Open(ctx, raw) }
	switch u.Scheme {
	case "file":
		t.dir = u.Path
		if err := os.MkdirAll(t.dir, 0o755); err != nil {
			return nil, fmt.Errorf("storage dir: %w", err)
		}
	case "s3":
		o, err := s3store.ParseURL(u)
		if err != nil {
			return nil, err
		}
		t.bucket, t.prefix, t.endpoint = o.Bucket, o.Prefix, o.Endpoint
		if t.endpoint == "" {
			t.endpoint = os.Getenv("AWS_ENDPOINT_URL")
		}
		t.access, t.secret = os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	}
	return t, nil
}

// findVersitygw returns the pinned versitygw in <repo>/.bin (the repository
// of the working directory or of this binary), installing it there if
// needed, or one on PATH when no repository is around.
func findVersitygw(ctx context.Context) (string, error) {
	var roots []string
	if wd, err := os.Getwd(); err == nil {
		if r, err := servers.RepoRoot(wd); err == nil {
			roots = append(roots, r)
		}
	}
	if exe, err := os.Executable(); err == nil {
		if r, err := servers.RepoRoot(filepath.Dir(exe)); err == nil {
			roots = append(roots, r)
		}
	}
	if len(roots) == 0 {
		if p, err := exec.LookPath("versitygw"); err == nil {
			return p, nil
		}
		return "", errors.New("versitygw not found on PATH and no ckpt repository to install it into: install " + servers.VersitygwModule + "@" + servers.VersitygwVersion + " or pass --storage")
	}
	return servers.Install(ctx, roots[0], "versitygw", servers.VersitygwModule, servers.VersitygwVersion, nil)
}

// startVersitygw starts versitygw on a free loopback port over a fresh
// directory under root, creates the bench bucket and returns the target.
func startVersitygw(ctx context.Context, root string) (*target, error) {
	bin, err := findVersitygw(ctx)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(root, "s3data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 {
		port, err := servers.FreePort()
		if err != nil {
			return nil, err
		}
		logPath := filepath.Join(root, "versitygw.log")
		logf, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		// Keep-alive on, as on every production S3 endpoint (versitygw
		// closes each connection after one request by default): every tool
		// measured against it reuses its connections.
		cmd := exec.Command(bin, "--port", fmt.Sprintf("127.0.0.1:%d", port), "--access", benchAccessKey,
			"--secret", benchSecretKey, "--region", benchRegion, "--quiet", "--keep-alive", "posix", data)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, fmt.Errorf("start versitygw: %w", err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); logf.Close(); close(exited) }()
		stop := func() {
			select {
			case <-exited:
				return
			default:
			}
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				<-exited
			}
		}
		endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
		if err := waitHTTP(ctx, endpoint, exited); err != nil {
			stop()
			log, _ := os.ReadFile(logPath)
			lastErr = fmt.Errorf("versitygw on %s: %v: %s", endpoint, err, strings.TrimSpace(string(log)))
			continue
		}
		t := &target{
			kind: "s3", endpoint: endpoint, bucket: benchBucket, access: benchAccessKey, secret: benchSecretKey,
			desc: "versitygw " + servers.VersitygwVersion + " on " + endpoint + " (started by the bench)",
			stop: stop, pid: cmd.Process.Pid, dataDir: data,
		}
		q := url.Values{"path_style": {"true"}, "endpoint": {endpoint}, "region": {benchRegion}}
		t.url = "s3://" + benchBucket + "?" + q.Encode()
		t.env = []string{"AWS_ACCESS_KEY_ID=" + benchAccessKey, "AWS_SECRET_ACCESS_KEY=" + benchSecretKey, "AWS_REGION=" + benchRegion}
		creds := credentials.NewStaticCredentialsProvider(benchAccessKey, benchSecretKey, "")
		t.open = func(ctx context.Context) (storage.Store, error) {
			return s3store.New(ctx, s3store.Options{Bucket: benchBucket, Endpoint: endpoint, Region: benchRegion, PathStyle: true, Credentials: creds})
		}
		cl := awss3.New(awss3.Options{Region: benchRegion, BaseEndpoint: aws.String(endpoint), UsePathStyle: true, Credentials: creds})
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err = cl.CreateBucket(cctx, &awss3.CreateBucketInput{Bucket: aws.String(benchBucket)})
		cancel()
		if err != nil {
			stop()
			return nil, fmt.Errorf("create bucket %q on versitygw: %w", benchBucket, err)
		}
		return t, nil
	}
	return nil, lastErr
}

func waitHTTP(ctx context.Context, endpoint string, exited <-chan struct{}) error {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := c.Get(endpoint + "/"); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited at start")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("not ready after 30s")
		}
	}
}

// openS3At opens the S3 target t through another endpoint (a proxy in
// front of t's).
func openS3At(ctx context.Context, t *target, endpoint string) (storage.Store, error) {
	o := s3store.Options{Bucket: t.bucket, Prefix: t.prefix, Endpoint: endpoint, PathStyle: true}
	if t.access != "" {
		o.Credentials = credentials.NewStaticCredentialsProvider(t.access, t.secret, "")
	}
	if t.pid != 0 {
		o.Region = benchRegion
	}
	return s3store.New(ctx, o)
}
