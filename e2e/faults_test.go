package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ckpt-io/ckpt/lab/testservers"
)

func TestCheckpointsCompleteThroughS3FaultsAndNoListedCheckpointLacksAnObject(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, testBucket)
	direct := &backend{name: "s3", url: srv.URL(testBucket, testPrefix), env: srv.Env(), root: srv.DataDir, s3: srv}
	proxy := startFaultProxy(t, srv.Endpoint, 20261129)
	viaProxy := "s3://" + testBucket + "/" + testPrefix + "?" + url.Values{"path_style": {"true"}, "endpoint": {proxy.url}, "region": {srv.Region}}.Encode()
	env := append(srv.Env(), "AWS_ENDPOINT_URL="+proxy.url)

	root, localDir := t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "faults", "faults-0"
	startAgent(t, "A", agentConfig{Socket: socket, Storage: viaProxy, Env: env, Job: job, LocalDir: localDir,
		AllowRoots: []string{root}, Extra: []string{"--gc-interval", "1ms", "--commit-patience", "5s"}}) // GC after every checkpoint, through the faults; a refused commit fails within seconds

	proxy.set(true, nil) // after the agent's start-up probe

	// checkListed requires every checkpoint `ckpt list` shows (read
	// straight from the server) to have all its objects.
	checkListed := func(t *testing.T) []listEntry {
		t.Helper()
		list := direct.list(t, job)
		for _, e := range list {
			direct.requireObjectsOf(t, direct.manifest(t, job, e.Task, e.Checkpoint))
		}
		return list
	}
	checkCompleted := func(t *testing.T, n uint64, snap string) {
		t.Helper()
		m := direct.manifest(t, job, task, n)
		direct.requireObjectsOf(t, m)
		want := fileHashes(t, snap)
		for _, f := range m.Files {
			if want[f.Name] != f.ContentID() {
				t.Errorf("checkpoint %d: the manifest's %s does not match the snapshot", n, f.Name)
			}
		}
		if len(m.Files) != len(want) {
			t.Errorf("checkpoint %d: the manifest names %d files, the snapshot has %d", n, len(m.Files), len(want))
		}
	}

	// writeSnap makes checkpoint n's snapshot: the SSTs of the previous
	// one, six new 512 KiB SSTs (and a 24 MiB one, a multipart upload, in
	// checkpoint 3), new private files.
	var prev string
	writeSnap := func(n uint64) string {
		snap := filepath.Join(root, fmt.Sprintf("snap-%d", n))
		if prev != "" {
			linkFiles(t, prev, snap)
			for _, name := range []string{"CURRENT", "MANIFEST-000001", "OPTIONS-000003"} {
				if err := removeFile(filepath.Join(snap, name)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range uint64(6) {
			id := n*10 + i
			writeFile(t, filepath.Join(snap, fmt.Sprintf("%06d.sst", id)), randomBytes(512<<10, 7000+id))
		}
		if n == 3 {
			writeFile(t, filepath.Join(snap, "000039.sst"), randomBytes(24<<20, 7039))
		}
		writeFile(t, filepath.Join(snap, "CURRENT"), []byte("MANIFEST-000001\n"))
		writeFile(t, filepath.Join(snap, "MANIFEST-000001"), randomBytes(64<<10+int(n), 7100+n))
		writeFile(t, filepath.Join(snap, "OPTIONS-000003"), []byte(fmt.Sprintf("[Options]\n  n=%d\n", n)))
		prev = snap
		return snap
	}

	// Random faults: every checkpoint completes by retrying.
	n := uint64(0)
	for range 5 {
		n++
		snap := writeSnap(n)
		ev := trigger(t, socket, task, n, snap)
		t.Logf("checkpoint %d completed through faults in %d ms (uploaded %d, reused %d)", n, ev.DurationMS, ev.FilesUploaded, ev.FilesReused)
		checkCompleted(t, n, snap)
		checkListed(t)
	}
	t.Logf("faults so far: %s", proxy.summary())

	// An outage of the commit: the manifest's PUT always answers 503. The
	// checkpoint fails, and no listed checkpoint lacks an object.
	proxy.set(true, func(r *http.Request) (fault, bool) { return faultSlowDown, isManifestPut(r) })
	n++
	failedN := n
	snap := writeSnap(n)
	o := triggerAsync(socket, task, n, snap)
	if o.err != nil || o.code != 1 || o.ev.Event != "failed" {
		t.Fatalf("checkpoint %d with every commit refused: exit %d, %+v, %v\nstderr: %s", n, o.code, o.ev, o.err, o.stder)
	}
	t.Logf("checkpoint %d with the commit refused: %s: %s", n, o.ev.Error.Code, o.ev.Error.Message)
	if direct.hasManifest(t, job, task, n) {
		t.Errorf("checkpoint %d failed but its manifest is in storage", n)
	}
	for _, e := range checkListed(t) {
		if e.Checkpoint == failedN {
			t.Errorf("list shows the failed checkpoint %d", failedN)
		}
	}

	// The commit's answer is lost once: the server stored the manifest, the
	// agent saw a reset. Its retry must recognise its own manifest.
	var lost sync.Once
	proxy.set(true, func(r *http.Request) (fault, bool) {
		hit := false
		if isManifestPut(r) {
			lost.Do(func() { hit = true })
		}
		return faultResetAfter, hit
	})
	n++
	snap = writeSnap(n)
	o = triggerAsync(socket, task, n, snap)
	if o.err != nil || o.code != 0 || o.ev.Event != "completed" {
		t.Errorf("checkpoint %d whose commit answer was lost: exit %d, %+v, %v\nstderr: %s", n, o.code, o.ev, o.err, o.stder)
	} else {
		checkCompleted(t, n, snap)
	}
	checkListed(t)

	// Faults off: the agent goes on.
	proxy.set(false, nil)
	n++
	snap = writeSnap(n)
	trigger(t, socket, task, n, snap)
	checkCompleted(t, n, snap)
	list := checkListed(t)
	t.Logf("faults injected: %s; listed: %+v", proxy.summary(), list)
	direct.verify(t, job)
	target, _, _ := direct.restoreFromStorage(t, job, task)
	requireSameFiles(t, snap, target)
	if t.Failed() {
		t.Logf("fault log:\n%s", proxy.faultLog())
	}
}

func removeFile(p string) error { return os.Remove(p) }
