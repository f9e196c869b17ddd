package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/testservers"
)

// A storage server that accepts a request and never answers cannot hold a
// checkpoint past --checkpoint-timeout: the checkpoint fails with
// unavailable naming the step, commits nothing, is counted as a timeout,
// and the task's next checkpoint completes once the server answers again.
func TestAHungStorageCallCannotHoldACheckpointPastItsTimeout(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, testBucket)
	direct := &backend{name: "s3", url: srv.URL(testBucket, testPrefix), env: srv.Env(), root: srv.DataDir, s3: srv}
	proxy := startFaultProxy(t, srv.Endpoint, 20261201)
	viaProxy, env := s3ViaProxy(srv.Env(), srv.Region, proxy)

	root, localDir := t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	port := statusPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	const job, task = "hung", "hung-0"
	a := startAgent(t, "A", agentConfig{Socket: socket, Storage: viaProxy, Env: env, Job: job, LocalDir: localDir,
		AllowRoots: []string{root}, Extra: []string{"--checkpoint-timeout", "3s", "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port)}})
	waitStatusServer(t, a, base+"/healthz")

	// Every PUT of a shared object stalls.
	proxy.set(false, func(r *http.Request) (fault, bool) {
		return faultStall, r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/shared/")
	})
	snap1 := filepath.Join(root, "snap-1")
	writeSnapshot1(t, snap1)
	began := time.Now()
	o := triggerAsync(socket, task, 1, snap1)
	took := time.Since(began)
	if o.err != nil || o.code != 1 || o.ev.Event != "failed" || o.ev.Error == nil {
		t.Fatalf("checkpoint against a hung server: exit %d, %+v, %v\nstderr: %s", o.code, o.ev, o.err, o.stder)
	}
	if o.ev.Error.Code != "unavailable" || !strings.Contains(o.ev.Error.Message, "timed out") || !strings.Contains(o.ev.Error.Message, "uploading") {
		t.Fatalf("failure %s: %q, want unavailable naming the timeout and the step", o.ev.Error.Code, o.ev.Error.Message)
	}
	if took > 30*time.Second {
		t.Fatalf("the checkpoint was held %v by a hung server, past its 3s timeout", took)
	}
	t.Logf("checkpoint 1 against a hung server failed after %v: %s", took.Round(time.Millisecond), o.ev.Error.Message)
	if direct.hasManifest(t, job, task, 1) {
		t.Fatal("the timed-out checkpoint has a manifest")
	}

	// The commit itself hangs: a write in progress is not interrupted by
	// an abort or a shutdown, but the timeout bounds it too.
	proxy.set(false, func(r *http.Request) (fault, bool) { return faultStall, isManifestPut(r) })
	o = triggerAsync(socket, task, 2, snap1)
	if o.err != nil || o.code != 1 || o.ev.Error == nil || o.ev.Error.Code != "unavailable" || !strings.Contains(o.ev.Error.Message, "committing the manifest") {
		t.Fatalf("checkpoint with a hung commit: exit %d, %+v, %+v, %v\nstderr: %s", o.code, o.ev, o.ev.Error, o.err, o.stder)
	}
	if direct.hasManifest(t, job, task, 2) {
		t.Fatal("the checkpoint whose commit timed out has a manifest")
	}

	proxy.set(false, nil)
	snap2 := filepath.Join(root, "snap-2")
	writeSnapshot2(t, snap1, snap2)
	trigger(t, socket, task, 3, snap2)
	if !direct.hasManifest(t, job, task, 3) {
		t.Fatal("the next checkpoint did not commit")
	}
	_, metrics := statusGet(t, base+"/metrics")
	for status, want := range map[string]float64{"timeout": 2, "completed": 1} {
		got, ok := promSample(t, metrics, "ckpt_checkpoints_total", map[string]string{"job": job, "task": task, "status": status})
		if !ok || got != want {
			t.Errorf("ckpt_checkpoints_total{status=%q} = %v (present %v), want %v", status, got, ok, want)
		}
	}
	target, _, _ := direct.restoreFromStorage(t, job, task)
	requireSameFiles(t, snap2, target)
}
