package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/testservers"
)

// httpStatus fetches url and returns its status code and body.
func httpStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// requireMetric requires /metrics at base to hold line.
func requireMetric(t *testing.T, base, line string) {
	t.Helper()
	_, body := httpStatus(t, base+"/metrics")
	if !strings.Contains(body, line) {
		t.Fatalf("/metrics lacks %s:\n%s", line, grepLines(body, strings.SplitN(line, "{", 2)[0]))
	}
}

// grepLines returns body's lines that contain s.
func grepLines(body, s string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// relay forwards every TCP connection accepted on l to target, byte for
// byte (SigV4 signatures stay valid), until l is closed.
func relay(t *testing.T, l net.Listener, target string) {
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(s, c); s.Close() }()
			go func() { defer wg.Done(); io.Copy(c, s); c.Close() }()
		}
	}()
}

// An agent whose bucket does not answer at start (nothing listens at its
// endpoint) starts and serves its socket: /readyz is 200, /healthz/storage
// 503 and ckpt_storage_up 0; a checkpoint answers unavailable with the
// storage error. Once the endpoint answers (a relay to a real S3 server
// opens on it), the next checkpoint completes and storage shows up.
func TestTheAgentStartsWithStorageDownAndCatchesUpWhenItAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the ckpt binary against versitygw")
	}
	srv := testservers.S3(t)
	srv.CreateBucket(t, "outage")
	port := freePort(t) // nothing listens here: connections are refused
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	url := fmt.Sprintf("s3://outage/prod?path_style=true&endpoint=%s&region=%s", endpoint, srv.Region)
	env := []string{"AWS_ACCESS_KEY_ID=" + srv.AccessKey, "AWS_SECRET_ACCESS_KEY=" + srv.SecretKey, "AWS_REGION=" + srv.Region}
	root := t.TempDir()
	mport := statusPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", mport)
	a := startAgent(t, "a", agentConfig{Socket: filepath.Join(shortDir(t), "s"), Storage: url, Env: env, Job: "orders",
		LocalDir: filepath.Join(root, "local"), AllowRoots: []string{root},
		Extra: []string{"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", mport)}})
	if code, body := httpStatus(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz with storage down = %d %s, want 200: storage must not gate the app's readiness", code, body)
	}
	if code, body := httpStatus(t, base+"/healthz/storage"); code != 503 || !strings.Contains(body, "refused") {
		t.Fatalf("/healthz/storage with storage down = %d %q, want 503 naming the refused connection", code, body)
	}
	requireMetric(t, base, `ckpt_storage_up{ckpt_job="orders"} 0`)

	snap := filepath.Join(root, "snap")
	writeFencingSnapshot(t, snap, 1)
	o := triggerAsync(a.cfg.Socket, "orders-0", 1, snap)
	if o.err != nil || o.ev.Event != "failed" || o.ev.Error == nil || o.ev.Error.Code != "unavailable" || !strings.Contains(o.ev.Error.Message, "refused") {
		t.Fatalf("checkpoint with storage down: %+v (err %v), want failed unavailable naming the storage error", o.ev, o.err)
	}

	// Storage comes back on the same endpoint.
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	relay(t, l, strings.TrimPrefix(srv.Endpoint, "http://"))
	deadline := time.Now().Add(30 * time.Second)
	for n := uint64(2); ; n++ {
		o := triggerAsync(a.cfg.Socket, "orders-0", n, snap)
		if o.err == nil && o.ev.Event == "completed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint completed 30s after storage came back: %+v %v %s", o.ev, o.err, o.stder)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if code, body := httpStatus(t, base+"/healthz/storage"); code != 200 {
		t.Fatalf("/healthz/storage with storage back = %d %s", code, body)
	}
	requireMetric(t, base, `ckpt_storage_up{ckpt_job="orders"} 1`)
	requireMetric(t, base, `ckpt_checkpoint_last_success_timestamp_seconds{ckpt_job="orders",task="orders-0"}`)
	a.stop()
}

// `ckpt restore --if-not-exists` with the store present succeeds without
// touching storage: its endpoint refuses every connection.
func TestRestoreIfNotExistsWithTheStorePresentNeedsNoStorage(t *testing.T) {
	port := freePort(t)
	url := fmt.Sprintf("s3://b/p?path_style=true&endpoint=http://127.0.0.1:%d&region=us-east-1", port)
	root := t.TempDir()
	target := filepath.Join(root, "store")
	writeFile(t, filepath.Join(target, "000001.sst"), []byte("data"))
	var res struct {
		Restored bool   `json:"restored"`
		Reason   string `json:"reason"`
	}
	r := ckptJSONEnv(t, []string{"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s"}, &res, "restore", "--storage", url, "--job", "orders", "--task", "orders-0",
		"--target", target, "--local-dir", filepath.Join(root, "local"), "--if-not-exists", "--if-checkpoint-exists", "--json")
	if r.Code != 0 || res.Restored || !strings.Contains(res.Reason, "already holds a store") {
		t.Fatalf("restore --if-not-exists with the store present and storage refusing: exit %d %+v\n%s", r.Code, res, r.Stderr)
	}
	// Storage is still needed when the target is empty: then it fails.
	empty := filepath.Join(root, "empty")
	r = runCkptEnv(t, []string{"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s"}, "restore", "--storage", url, "--job", "orders", "--task", "orders-0",
		"--target", empty, "--if-not-exists", "--if-checkpoint-exists")
	if r.Code != 1 {
		t.Fatalf("restore into an empty target with storage refusing: exit %d, want 1\n%s", r.Code, r.Stderr)
	}
}

// A pod that moves to another node with its network volume keeps being
// checkpointed: the volume (store and local dir) is copied to "node 2"
// while the agent of node 1 still runs (a partitioned zombie); the restore
// init there skips (the store is present), the agent of node 2 takes the
// task over on its first checkpoint, which completes, and the agent of
// node 1 is fenced, its task shown blocked.
func TestAStoreThatMovesWithItsVolumeKeepsBeingCheckpointed(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two agents and the restore init as processes")
	}
	storageDir := t.TempDir()
	vol1, vol2 := t.TempDir(), t.TempDir()
	store1 := filepath.Join(vol1, "store")
	writeFencingSnapshot(t, store1, 1)
	m1, m2 := statusPort(t), statusPort(t)
	agentOn := func(name, node, vol string, mport int) *agentProc {
		return startAgent(t, name, agentConfig{Socket: filepath.Join(shortDir(t), "s"), StorageDir: storageDir, Job: "orders",
			LocalDir: filepath.Join(vol, "local"), AllowRoots: []string{vol},
			Extra: []string{"--node", node, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", mport)}})
	}
	a1 := agentOn("node-1", "node-1", vol1, m1)
	for n := uint64(1); n <= 2; n++ {
		snap := filepath.Join(vol1, fmt.Sprint("snap", n))
		writeFencingSnapshot(t, snap, n)
		trigger(t, a1.cfg.Socket, "orders-0", n, snap)
	}

	// The volume moves to node 2 (node 1's agent is cut off, not stopped).
	if out, err := exec.Command("cp", "-a", vol1+"/.", vol2).CombinedOutput(); err != nil {
		t.Fatalf("copy the volume: %v\n%s", err, out)
	}
	var res struct {
		Restored bool `json:"restored"`
	}
	r := ckptJSON(t, &res, "restore", "--storage", "file://"+storageDir, "--job", "orders", "--task", "orders-0",
		"--target", filepath.Join(vol2, "store"), "--local-dir", filepath.Join(vol2, "local"), "--if-not-exists", "--if-checkpoint-exists", "--json")
	if r.Code != 0 || res.Restored {
		t.Fatalf("restore init on node 2: exit %d %+v, want a skip\n%s", r.Code, res, r.Stderr)
	}
	a2 := agentOn("node-2", "node-2", vol2, m2)
	snap3 := filepath.Join(vol2, "snap3")
	writeFencingSnapshot(t, snap3, 3)
	o := triggerAsync(a2.cfg.Socket, "orders-0", 3, snap3)
	if o.err != nil || o.ev.Event != "completed" {
		t.Fatalf("first checkpoint on node 2: %+v %v %s, want completed", o.ev, o.err, o.stder)
	}
	// Node 1's agent is fenced: its checkpoint fails, and shows it.
	snap4 := filepath.Join(vol1, "snap4")
	writeFencingSnapshot(t, snap4, 4)
	o = triggerAsync(a1.cfg.Socket, "orders-0", 4, snap4)
	if o.err != nil || o.ev.Event != "failed" || o.ev.Error == nil || o.ev.Error.Code != "conflict" || !strings.Contains(o.ev.Error.Message, "fenced") {
		t.Fatalf("checkpoint of the old agent on node 1: %+v %v, want failed conflict (fenced)", o.ev, o.err)
	}
	requireMetric(t, fmt.Sprintf("http://127.0.0.1:%d", m1), `ckpt_checkpoint_blocked{ckpt_job="orders",reason="fenced",task="orders-0"} 1`)
	if _, page := httpStatus(t, fmt.Sprintf("http://127.0.0.1:%d/", m1)); !strings.Contains(page, "fenced") {
		t.Fatal("the status page of the fenced agent does not say the task is fenced")
	}
	// Node 2 goes on; list shows its checkpoints, not the zombie's.
	snap5 := filepath.Join(vol2, "snap5")
	writeFencingSnapshot(t, snap5, 5)
	trigger(t, a2.cfg.Socket, "orders-0", 5, snap5)
	var list []struct {
		Checkpoint uint64 `json:"checkpoint"`
	}
	ckptJSON(t, &list, "list", "--storage", "file://"+storageDir, "--job", "orders", "--task", "orders-0", "--json")
	if len(list) == 0 || list[len(list)-1].Checkpoint != 5 {
		t.Fatalf("list after the move = %+v, want the newest to be 5", list)
	}
	a2.stop()
	a1.stop()
}

// A file:// storage directory that vanishes while the agent runs is an
// outage: the next checkpoint answers unavailable, nothing re-creates the
// directory, /readyz stays 200 and ckpt_storage_up is 0; once it is back,
// checkpoints complete.
func TestAVanishedFileStorageIsAnOutageNotANewStore(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the ckpt binary")
	}
	root := t.TempDir()
	storageDir := filepath.Join(root, "storage")
	mport := statusPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", mport)
	a := startAgent(t, "a", agentConfig{Socket: filepath.Join(shortDir(t), "s"), StorageDir: storageDir, Job: "orders",
		LocalDir: filepath.Join(root, "local"), AllowRoots: []string{root},
		Extra: []string{"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", mport)}})
	snap := filepath.Join(root, "snap")
	writeFencingSnapshot(t, snap, 1)
	trigger(t, a.cfg.Socket, "orders-0", 1, snap)
	if err := os.Rename(storageDir, storageDir+".away"); err != nil {
		t.Fatal(err)
	}
	o := triggerAsync(a.cfg.Socket, "orders-0", 2, snap)
	if o.err != nil || o.ev.Event != "failed" || o.ev.Error == nil || o.ev.Error.Code != "unavailable" || !strings.Contains(o.ev.Error.Message, "gone") {
		t.Fatalf("checkpoint with the storage dir gone: %+v %v, want failed unavailable", o.ev, o.err)
	}
	if _, err := os.Stat(storageDir); !os.IsNotExist(err) {
		t.Fatalf("the vanished storage dir was re-created (stat: %v)", err)
	}
	if code, _ := httpStatus(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d, want 200", code)
	}
	requireMetric(t, base, `ckpt_storage_up{ckpt_job="orders"} 0`)
	if code, _ := httpStatus(t, base+"/healthz/storage"); code != 503 {
		t.Fatalf("/healthz/storage with the storage dir gone = %d, want 503", code)
	}
	if err := os.Rename(storageDir+".away", storageDir); err != nil {
		t.Fatal(err)
	}
	trigger(t, a.cfg.Socket, "orders-0", 3, snap)
	requireMetric(t, base, `ckpt_storage_up{ckpt_job="orders"} 1`)
	a.stop()
}
