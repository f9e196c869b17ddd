package e2e

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/protocol"
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
			// A missing bucket does not take the app down: the agent serves
			// its socket, says once what is wrong (bucket and endpoint), and
			// answers checkpoints unavailable, naming it, until it exists.
			socket := filepath.Join(shortDir(t), "ckpt.sock")
			a := launchAgent(t, "nope", agentConfig{Socket: socket, Storage: c.url, Env: c.env, Job: "j", LocalDir: t.TempDir()})
			a.waitReady()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			snap := filepath.Join(t.TempDir(), "snap")
			writeFencingSnapshot(t, snap, 1)
			err := checkpointOn(ctx, socket, client.Request{Task: "t", Checkpoint: 1, Dir: snap})
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Code != protocol.CodeUnavailable || !strings.Contains(pe.Message, "nope") || !strings.Contains(pe.Message, c.endpoint) {
				t.Errorf("a checkpoint with the bucket missing: %v, want unavailable naming the bucket and the endpoint", err)
			}
			if err != nil && strings.Contains(err.Error(), s3srv.SecretKey) {
				t.Errorf("the error holds the secret key")
			}
			a.stop()
			var startLines []string
			for _, l := range strings.Split(a.stderr.String(), "\n") {
				if strings.Contains(l, "storage unavailable at start") {
					startLines = append(startLines, l)
				}
			}
			if len(startLines) != 1 || !strings.Contains(startLines[0], "nope") || !strings.Contains(startLines[0], c.endpoint) {
				t.Errorf("want one start-up line naming the bucket and the endpoint, got %q", startLines)
			}
		})
	}
}
