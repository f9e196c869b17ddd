package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/internal/testservers"
)

func TestAMissingBucketIsOneLineNamingTheBucketAndTheEndpoint(t *testing.T) {
	s3srv := testservers.S3(t)
	gcs := testservers.GCS(t)
	cases := []struct {
		name     string
		url      string
		env      []string
		endpoint string
	}{
		{"s3", "s3://nope/x", s3srv.Env(), s3srv.Endpoint},
		{"gs", "gs://nope/x", gcs.Env(), gcs.Endpoint},
	}
	// requireOneLine requires stderr to be one line that names the bucket
	// and the endpoint and holds no secret.
	requireOneLine := func(t *testing.T, what string, stderr []byte, endpoint string) {
		t.Helper()
		msg := string(stderr)
		t.Logf("%s: %s", what, strings.TrimSpace(msg))
		if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") {
			t.Errorf("%s: stderr is not exactly one line:\n%s", what, msg)
		}
		if !strings.Contains(msg, "nope") {
			t.Errorf("%s: the error does not name the bucket nope", what)
		}
		if !strings.Contains(msg, endpoint) {
			t.Errorf("%s: the error does not name the endpoint %s", what, endpoint)
		}
		if strings.Contains(msg, s3srv.SecretKey) {
			t.Errorf("%s: the error holds the secret key", what)
		}
	}
	for _, c := range cases {
		t.Run(c.name+" list", func(t *testing.T) {
			res := runCkptEnv(t, c.env, "list", "--storage", c.url, "--job", "j")
			if res.Code != 1 {
				t.Errorf("exit %d, want 1", res.Code)
			}
			if len(res.Stdout) != 0 {
				t.Errorf("stdout: %q", res.Stdout)
			}
			if res.Elapsed > 20*time.Second {
				t.Errorf("took %v", res.Elapsed)
			}
			requireOneLine(t, "ckpt list", res.Stderr, c.endpoint)
		})
		t.Run(c.name+" agent", func(t *testing.T) {
			socket := filepath.Join(shortDir(t), "ckpt.sock")
			start := time.Now()
			a := launchAgent(t, "nope", agentConfig{Socket: socket, Storage: c.url, Env: c.env, Job: "j", LocalDir: t.TempDir()})
			code := a.waitExit(20 * time.Second)
			took := time.Since(start)
			if code != 1 {
				t.Errorf("agent exited %d after %v, want 1", code, took)
			}
			if took > 20*time.Second {
				t.Errorf("the agent took %v to give up", took)
			}
			requireOneLine(t, "ckpt agent", []byte(a.stderr.String()), c.endpoint)
			if exists(socket) {
				t.Errorf("the agent left a socket behind")
			}
		})
	}
}
