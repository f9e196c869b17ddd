package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
)

func TestAnAgentKilledMidUploadLeavesNothingOnceCollected(t *testing.T) {
	root, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "crash", "crash-0"
	jobDir := filepath.Join(storageDir, job)
	cfg := agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: localDir, AllowRoots: []string{root},
		Extra: []string{"--upload-concurrency", "1"}}
	a := startAgent(t, "first", cfg)

	snap1 := filepath.Join(root, "snap-1")
	writeSnapshot1(t, snap1)
	trigger(t, socket, task, 1, snap1)
	shared1 := sharedObjects(storageDir, job)

	// Checkpoint 2: 320 MiB of new SSTs uploaded one at a time.
	big, files, bytes := bigSST(t)
	snap2 := filepath.Join(root, "snap-2")
	linkFiles(t, big, snap2)
	writeFile(t, filepath.Join(snap2, "CURRENT"), []byte("MANIFEST-000001\n"))
	writeFile(t, filepath.Join(snap2, "MANIFEST-000001"), randomBytes(120<<10, 102))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Checkpoint(ctx, task, 2, snap2, ""); err != nil {
		t.Fatalf("checkpoint 2: %v", err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if manifestPath(storageDir, job, task, 2) != "" {
			t.Fatalf("checkpoint 2 (%d files, %d bytes) completed before the test could kill the agent mid-upload", files, bytes)
		}
		if n := sharedObjects(storageDir, job); n >= shared1+3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no object of checkpoint 2 reached storage in 90s")
		}
		time.Sleep(time.Millisecond)
	}
	a.kill()
	uploaded := sharedObjects(storageDir, job) - shared1
	if manifestPath(storageDir, job, task, 2) != "" {
		t.Fatal("the manifest of checkpoint 2 was written before the kill took effect; the crash did not land mid-upload")
	}
	if uploaded >= files {
		t.Fatalf("all %d objects of checkpoint 2 were uploaded before the kill", files)
	}
	t.Logf("killed the agent with %d of %d new objects of checkpoint 2 in storage, no manifest", uploaded, files)

	// The restarted agent replaces the stale socket and serves.
	startAgent(t, "restarted", cfg)
	if n := sharedObjects(storageDir, job) - shared1; n != uploaded {
		t.Errorf("the restarted agent changed the orphans: %d objects, were %d", n, uploaded)
	}

	var list []listEntry
	ckptJSON(t, &list, "list", "--storage", "file://"+storageDir, "--job", job, "--json")
	if len(list) != 1 || list[0].Checkpoint != 1 || list[0].Task != task {
		t.Fatalf("list shows %+v, want only checkpoint 1", list)
	}

	target := filepath.Join(t.TempDir(), "restored")
	var rr restoreResult
	ckptJSON(t, &rr, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--target", target, "--json")
	if !rr.Restored || rr.Checkpoint != 1 {
		t.Fatalf("restore gave %+v, want checkpoint 1", rr)
	}
	requireSameFiles(t, snap1, target)

	if res := runCkpt(t, "verify", "--storage", "file://"+storageDir, "--job", job); res.Code != 0 {
		t.Fatalf("verify after the crash: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}

	temps := 0
	for rel := range listTree(t, storageDir) {
		if strings.Contains(rel, ".ckpt-tmp-") {
			temps++
		}
	}
	t.Logf("before gc: %d temporary files in storage", temps)
	before := treeSize(t, jobDir)
	var gc gcReport
	// The first collection marks the orphans, the second deletes them.
	var mark gcReport
	ckptJSONEnv(t, []string{unsafeGCGrace, unsafeGCMarkDelay}, &mark, "gc", "--storage", "file://"+storageDir, "--job", job, "--grace", "0s", "--json")
	if mark.DeletedObjects != 0 {
		t.Errorf("the first gc deleted %d objects: it may only mark them", mark.DeletedObjects)
	}
	ckptJSONEnv(t, []string{unsafeGCGrace, unsafeGCMarkDelay}, &gc, "gc", "--storage", "file://"+storageDir, "--job", job, "--grace", "0s", "--json")
	after := treeSize(t, jobDir)
	t.Logf("gc: %+v; job dir %d -> %d bytes", gc, before, after)
	if gc.DeletedObjects < uploaded {
		t.Errorf("gc deleted %d objects, want at least the %d orphans of checkpoint 2", gc.DeletedObjects, uploaded)
	}
	if gc.RetainedCheckpoints != 1 {
		t.Errorf("gc retained %d checkpoints, want 1", gc.RetainedCheckpoints)
	}

	// No orphan bytes: everything left is a retained manifest or an object
	// one of them names, and no temporary file survived.
	m := readManifest(t, storageDir, job, task, 1)
	wanted := map[string]int64{m.Key: m.Size}
	for _, f := range m.Files {
		if f.Key != "" {
			wanted[f.Key] = f.Size
		}
	}
	var liveBytes int64
	for rel, st := range listTree(t, storageDir) {
		if strings.Contains(rel, ".ckpt-tmp-") {
			t.Errorf("temporary file left in storage: %s", rel)
		}
		if !st.Mode.IsRegular() || isOwnerRecord(rel) {
			continue
		}
		size, ok := wanted[rel]
		switch {
		case !ok:
			t.Errorf("orphan after gc: %s (%d bytes)", rel, st.Size)
		case size != st.Size:
			t.Errorf("%s holds %d bytes, its manifest says %d", rel, st.Size, size)
		}
		liveBytes += st.Size
		delete(wanted, rel)
	}
	for k := range wanted {
		t.Errorf("gc deleted %s, which checkpoint 1 references", k)
	}
	if liveBytes != after {
		t.Errorf("job dir holds %d bytes, the retained checkpoint accounts for %d", after, liveBytes)
	}
	if res := runCkpt(t, "verify", "--storage", "file://"+storageDir, "--job", job); res.Code != 0 {
		t.Fatalf("verify after gc: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
}

func TestSIGTERMWithACheckpointInFlightExitsCleanlyWithinTheGrace(t *testing.T) {
	root, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "term", "term-0"
	const grace = 500 * time.Millisecond
	a := startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: localDir,
		AllowRoots: []string{root}, Extra: []string{"--upload-concurrency", "1", "--shutdown-grace", grace.String()}})

	big, _, _ := bigSST(t)
	snap := filepath.Join(root, "snap-1")
	linkFiles(t, big, snap)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Checkpoint(ctx, task, 1, snap, "")
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if manifestPath(storageDir, job, task, 1) != "" {
		t.Fatal("the checkpoint completed before SIGTERM; it was not in flight")
	}
	start := time.Now()
	a.signal(syscall.SIGTERM)
	code := a.waitExit(grace + 20*time.Second)
	took := time.Since(start)
	ev, werr := p.Wait(ctx)
	t.Logf("agent exited %d %v after SIGTERM (grace %v); the checkpoint ended with %s %v", code, took, grace, ev.Event, werr)
	if code != 0 {
		t.Errorf("agent exited %d, want 0", code)
	}
	if took > grace+3*time.Second {
		t.Errorf("agent took %v to stop, the shutdown grace is %v", took, grace)
	}
	if exists(socket) {
		t.Errorf("socket %s is still there after a clean stop", socket)
	}
	switch {
	case ev.Event == "completed":
		if manifestPath(storageDir, job, task, 1) == "" {
			t.Error("the checkpoint was reported completed but its manifest is absent")
		}
	case ev.Event == "failed" && ev.Error != nil && ev.Error.Code == "unavailable":
		if manifestPath(storageDir, job, task, 1) != "" {
			t.Error("the checkpoint was reported failed but its manifest exists")
		}
	default:
		t.Errorf("the in-flight checkpoint ended with %q (%v), want completed or failed unavailable", ev.Event, werr)
	}
}

func TestASecondAgentOnALiveSocketIsRefusedAndOneOnAStaleSocketStarts(t *testing.T) {
	storageDir := t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	cfg := func(local string) agentConfig {
		return agentConfig{Socket: socket, StorageDir: storageDir, Job: "sock", LocalDir: local}
	}
	first := startAgent(t, "first", cfg(t.TempDir()))

	second := launchAgent(t, "second", cfg(t.TempDir()))
	if code := second.waitExit(20 * time.Second); code == 0 {
		t.Fatalf("a second agent on a live socket exited 0:\n%s", second.stderr)
	}
	msg := second.stderr.String()
	if !strings.Contains(msg, socket) || !strings.Contains(msg, "another agent") {
		t.Errorf("the second agent's error does not name the socket and the live agent:\n%s", msg)
	}
	t.Logf("second agent: %s", strings.TrimSpace(msg))
	if err := hello(socket); err != nil {
		t.Fatalf("the first agent stopped answering after the refused start: %v", err)
	}

	first.kill()
	if fi, err := os.Lstat(socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("a SIGKILLed agent should leave its socket file behind: %v", err)
	}
	if err := hello(socket); err == nil {
		t.Fatal("a stale socket answered hello")
	}
	startAgent(t, "third", cfg(t.TempDir()))
}
