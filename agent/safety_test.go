package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/internal/safefs"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/protocol"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage/file"
)

func TestTheAgentLogsItsGCSettingsAndRefusesAShortGrace(t *testing.T) {
	base := t.TempDir()
	st, err := file.New(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cfg := Config{Socket: filepath.Join(base, "s.sock"), Store: st, Job: "job", LocalDir: filepath.Join(base, "local"), AllowRoots: []string{base},
		GCInterval: -1, Retain: 3, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "gc_grace=") {
			line = l
		}
	}
	for _, want := range []string{"gc_grace=1h0m0s", "gc_interval=never", "retain=3"} {
		if !strings.Contains(line, want) {
			t.Errorf("the GC settings line %q does not say %s; logs:\n%s", line, want, logs.String())
		}
	}

	cfg.GCGrace = time.Minute
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), gc.MinGrace.String()) {
		t.Errorf("New with a 1m grace: %v, want a refusal naming the floor", err)
	}
	t.Setenv(gc.UnsafeMinGraceEnv, "1s")
	if _, err := New(cfg); err != nil {
		t.Errorf("New with a 1m grace and the floor lowered: %v", err)
	}
}

// One undecodable manifest of a task does not stop its checkpoints: the
// agent reuses nothing from it, and its status names it as a problem.
func TestAnUndecodableManifestIsAProblemNotAnOutage(t *testing.T) {
	h := start(t, nil, nil)
	bad := manifests.ManifestKey("job", "t1", 1)
	if err := h.store.Put(ctxT(t), bad, strings.NewReader("{garbage"), 8); err != nil {
		t.Fatal(err)
	}
	c := h.dial()
	dir := h.snapshot("s2", map[string]int{"000001.sst": 1000, "CURRENT": 16})
	p, err := c.Checkpoint(ctxT(t), "t1", 2, dir, "pebble")
	if err == nil {
		_, err = p.Wait(ctxT(t))
	}
	if err != nil {
		t.Fatalf("checkpoint beside an undecodable manifest: %v", err)
	}
	st, err := c.Status(ctxT(t), "t1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st.Raw), `"problems"`) || !strings.Contains(string(st.Raw), bad) || !strings.Contains(string(st.Raw), "not valid JSON") {
		t.Fatalf("status does not report %s: %s", bad, st.Raw)
	}
}

// Two agents on one local dir would remove each other's checkpoints in
// flight: the second one refuses to start, naming the dir and the holder.
func TestASecondAgentOnTheSameLocalDirRefusesToStart(t *testing.T) {
	h := start(t, nil, nil)
	b, err := New(Config{Socket: h.socket + "2", Store: h.store, Job: "job", LocalDir: h.local, AllowRoots: []string{h.root}, GCGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	select {
	case <-b.Ready():
		cancel()
		<-done
		t.Fatal("a second agent started on the same local dir")
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), h.local) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
			t.Fatalf("second agent: %v, want a refusal naming %s and pid %d", err, h.local, os.Getpid())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("second agent neither started nor failed")
	}
	// Once the first agent stops, the dir is free again.
	h.stop()
	c, err := New(Config{Socket: h.socket + "3", Store: h.store, Job: "job", LocalDir: h.local, AllowRoots: []string{h.root}, GCGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx3, cancel3 := context.WithCancel(context.Background())
	done3 := make(chan error, 1)
	go func() { done3 <- c.Run(ctx3) }()
	select {
	case <-c.Ready():
	case err := <-done3:
		t.Fatalf("an agent after the first stopped: %v", err)
	}
	cancel3()
	if err := <-done3; err != nil {
		t.Fatal(err)
	}
}

// A full local disk in the sync phase is a condition to retry later
// (unavailable), not a bug (internal); nothing is left behind.
func TestAFullLocalDiskFailsTheCheckpointAsUnavailable(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT} {
		t.Run(errno.Error(), func(t *testing.T) {
			orig := takeSnapshot
			t.Cleanup(func() { takeSnapshot = orig })
			takeSnapshot = func(s *localrecovery.Store, task string, n uint64, dir *safefs.Dir, handoff bool) (*localrecovery.Snapshot, error) {
				return nil, fmt.Errorf("link 000001.sst into the local store: %w", &os.LinkError{Op: "link", Old: dir.Path(), New: s.Root(), Err: errno})
			}
			h := start(t, nil, nil)
			c := h.dial()
			dir := h.snapshot("s1", map[string]int{"000001.sst": 1000, "CURRENT": 16})
			p, err := c.Checkpoint(ctxT(t), "t1", 1, dir, "pebble")
			if err == nil {
				_, err = p.Wait(ctxT(t))
			}
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Code != protocol.CodeUnavailable || !strings.Contains(pe.Message, "disk") {
				t.Fatalf("checkpoint on a full local disk: %v, want unavailable saying the disk is full", err)
			}
			takeSnapshot = orig
			p, err = c.Checkpoint(ctxT(t), "t1", 1, dir, "pebble")
			if err == nil {
				_, err = p.Wait(ctxT(t))
			}
			if err != nil {
				t.Fatalf("the retry once there is space: %v", err)
			}
		})
	}
}
