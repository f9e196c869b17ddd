package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage/file"
)

// hangingListener accepts connections and never answers on them: a
// storage endpoint that hangs. It closes them when the test ends.
func hangingListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// Every command that talks to storage ends at its --timeout, exit 1, with
// a message naming the timeout: through a plugin whose Get never returns
// (the faulty test plugin hangs on every key of job "hang"), and against
// an S3 endpoint that accepts connections and never answers. Without
// --timeout the restore through the plugin would never return.
func TestCommandsAgainstAHangingBackendEndAtTheirTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin and waits out nine timeouts")
	}
	pluginDir := buildFaultyPlugin(t)
	dir := t.TempDir()
	st, err := file.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const job, task = "hang", "hang-0"
	ctx := context.Background()
	body := []byte("table bytes")
	sum := sha256.Sum256(body)
	h := hex.EncodeToString(sum[:])
	f := manifests.File{Name: "000001.sst", Kind: manifests.Shared, Size: int64(len(body)), SHA256: h, Key: manifests.SharedKey(job, h, int64(len(body)))}
	if err := st.Put(ctx, f.Key, bytes.NewReader(body), f.Size); err != nil {
		t.Fatal(err)
	}
	m := &manifests.Manifest{Job: job, Task: task, Checkpoint: 1, Created: time.Now().UTC(), Engine: "generic", Files: []manifests.File{f}, FullSize: f.Size}
	enc, err := m.Encode(f.Size)
	if err != nil {
		t.Fatal(err)
	}
	if err := manifests.Commit(ctx, st, m, enc); err != nil {
		t.Fatal(err)
	}

	const timeout = 2 * time.Second
	faulty := "faulty://" + dir
	s3 := "s3://bucket/ckpt?endpoint=http://" + hangingListener(t) + "&path_style=true"
	s3Env := []string{"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s", "AWS_REGION=us-east-1", "AWS_CA_BUNDLE="}
	for _, c := range []struct {
		name string
		env  []string
		args []string
		how  string
	}{
		{"restore through the plugin", nil, []string{"restore", "--storage", faulty, "--job", job, "--task", task, "--target", filepath.Join(t.TempDir(), "r"), "--timeout", "2s"}, "--timeout 2s"},
		{"restore with CKPT_TIMEOUT", []string{"CKPT_TIMEOUT=2s"}, []string{"restore", "--storage", faulty, "--job", job, "--task", task, "--target", filepath.Join(t.TempDir(), "r")}, "CKPT_TIMEOUT 2s"},
		{"list", nil, []string{"list", "--storage", faulty, "--job", job, "--timeout", "2s"}, "--timeout 2s"},
		{"verify", nil, []string{"verify", "--storage", faulty, "--job", job, "--timeout", "2s"}, "--timeout 2s"},
		{"gc", nil, []string{"gc", "--storage", faulty, "--job", job, "--dry-run", "--timeout", "2s"}, "--timeout 2s"},
		{"drill", nil, []string{"drill", "--storage", faulty, "--job", job, "--task", task, "--no-engine-check", "--timeout", "2s"}, "--timeout 2s"},
		{"savepoint", nil, []string{"savepoint", "--storage", faulty, "--job", job, "--task", task, "--to", "file://" + t.TempDir(), "--timeout", "2s"}, "--timeout 2s"},
		{"list against a silent S3 endpoint", s3Env, []string{"list", "--storage", s3, "--job", job, "--timeout", "2s"}, "--timeout 2s"},
		{"restore against a silent S3 endpoint", s3Env, []string{"restore", "--storage", s3, "--job", job, "--task", task, "--target", filepath.Join(t.TempDir(), "r"), "--timeout", "2s"}, "--timeout 2s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := append([]string{"CKPT_PLUGIN_DIR=" + pluginDir}, c.env...)
			r := runCkptEnv(t, env, c.args...)
			t.Logf("ckpt %s: exit %d after %v: %s", c.args[0], r.Code, r.Elapsed.Round(time.Millisecond), strings.TrimSpace(string(r.Stderr)))
			if r.Code != 1 || !strings.Contains(string(r.Stderr), "timed out after 2s ("+c.how+")") {
				t.Fatalf("exit %d, want 1 with a message naming %s\nstderr: %s", r.Code, c.how, r.Stderr)
			}
			// The process starts the plugin and stops it: a few seconds
			// on a loaded machine, never the old forever (or the S3
			// client's own retries).
			if r.Elapsed < timeout || r.Elapsed > timeout+8*time.Second {
				t.Fatalf("exited after %v, want just past its %v timeout", r.Elapsed, timeout)
			}
		})
	}

	// --help states the default; a bad CKPT_TIMEOUT is bad usage.
	help := runCkpt(t, "restore", "--help")
	if help.Code != 0 || !strings.Contains(string(help.Stdout), "-timeout") || !strings.Contains(string(help.Stdout), "1h0m0s") {
		t.Errorf("restore --help does not state --timeout and its default:\n%s", help.Stdout)
	}
	if r := runCkptEnv(t, []string{"CKPT_TIMEOUT=soon"}, "list", "--storage", "file://"+dir, "--job", job); r.Code != 2 || !strings.Contains(string(r.Stderr), "CKPT_TIMEOUT") {
		t.Errorf("CKPT_TIMEOUT=soon: exit %d, %s", r.Code, r.Stderr)
	}
}
