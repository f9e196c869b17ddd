package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// runCaptured runs ckpt in-process with args and returns its exit status,
// stdout and stderr.
func runCaptured(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = outW, errW
	var stdout, stderr bytes.Buffer
	done := make(chan struct{}, 2)
	go func() { io.Copy(&stdout, outR); done <- struct{}{} }()
	go func() { io.Copy(&stderr, errR); done <- struct{}{} }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, args)
	os.Stdout, os.Stderr = oldOut, oldErr
	outW.Close()
	errW.Close()
	<-done
	<-done
	return code, stdout.String(), stderr.String()
}

// storageDir returns a file:// URL of a fresh storage directory and the
// store on it.
func storageDir(t *testing.T) (string, storage.Store) {
	t.Helper()
	dir := t.TempDir()
	s, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return "file://" + dir, s
}

func TestGCRefusesAGraceBelowTheFloor(t *testing.T) {
	url, _ := storageDir(t)
	for _, grace := range []string{"0s", "1m", "9m59s"} {
		code, _, stderr := runCaptured(t, "gc", "--storage", url, "--job", "j", "--grace", grace)
		if code != 2 {
			t.Errorf("gc --grace %s: exit %d, want 2\n%s", grace, code, stderr)
		}
		for _, want := range []string{"--grace", gc.MinGrace.String(), "in flight"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("gc --grace %s: the message does not say %q:\n%s", grace, want, stderr)
			}
		}
	}
	if code, _, stderr := runCaptured(t, "gc", "--storage", url, "--job", "j", "--grace", gc.MinGrace.String()); code != 0 {
		t.Errorf("gc --grace at the floor: exit %d\n%s", code, stderr)
	}
	t.Setenv(gc.UnsafeMinGraceEnv, "0s")
	if code, _, stderr := runCaptured(t, "gc", "--storage", url, "--job", "j", "--grace", "0s"); code != 0 {
		t.Errorf("gc --grace 0s with %s=0s: exit %d\n%s", gc.UnsafeMinGraceEnv, code, stderr)
	}
}

func TestAgentRefusesUnsafeGCSettings(t *testing.T) {
	url, _ := storageDir(t)
	base := t.TempDir()
	common := []string{"agent", "--socket", filepath.Join(base, "s.sock"), "--storage", url, "--job", "j",
		"--local-dir", filepath.Join(base, "local"), "--allow-root", base}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--gc-grace", "0s"}, []string{"--gc-grace", gc.MinGrace.String(), "in flight"}},
		{[]string{"--gc-grace", "5m"}, []string{"--gc-grace", gc.MinGrace.String()}},
		{[]string{"--gc-interval", "0s"}, []string{"--gc-interval", "negative"}},
		{[]string{"--retain", "0"}, []string{"--retain", "at least 1"}},
		{[]string{"--retain", "-1"}, []string{"--retain", "at least 1"}},
	} {
		code, _, stderr := runCaptured(t, append(common, c.args...)...)
		if code != 2 {
			t.Errorf("agent %v: exit %d, want 2\n%s", c.args, code, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("agent %v: the message does not say %q:\n%s", c.args, w, stderr)
			}
		}
	}
}

func TestGCRefusesRetainZero(t *testing.T) {
	url, _ := storageDir(t)
	for _, n := range []string{"0", "-1"} {
		code, _, stderr := runCaptured(t, "gc", "--storage", url, "--job", "j", "--retain", n)
		if code != 2 || !strings.Contains(stderr, "at least 1") {
			t.Errorf("gc --retain %s: exit %d, want 2 with a reason\n%s", n, code, stderr)
		}
	}
	if code, _, stderr := runCaptured(t, "gc", "--storage", url, "--job", "j"); code != 0 {
		t.Errorf("gc without --retain: exit %d\n%s", code, stderr)
	}
}

func TestTriggerRefusesAnUnknownEngine(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := runCaptured(t, "trigger", "--socket", filepath.Join(dir, "none.sock"), "--task", "t",
		"--checkpoint", "1", "--dir", dir, "--engine", "pebbel")
	if code != 2 {
		t.Errorf("trigger --engine pebbel: exit %d, want 2\n%s", code, stderr)
	}
	for _, w := range []string{"pebbel", "pebble", "generic", "rocksdb"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("trigger --engine pebbel: the message does not name %q:\n%s", w, stderr)
		}
	}
}
