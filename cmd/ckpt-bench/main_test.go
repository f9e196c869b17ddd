package main

import (
	"context"
	"strings"
	"testing"
)

// TestBadUsageExitsTwoAndNamesTheFlag: every bad flag or value is refused
// with status 2 before anything runs, naming what was wrong.
func TestBadUsageExitsTwoAndNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nope"}, "nope"},
		{[]string{"stray"}, `unexpected argument "stray"`},
		{[]string{"--state-bytes", "1K"}, "state bytes"},
		{[]string{"--state-bytes", "lots"}, "--state-bytes"},
		{[]string{"--churn", "2"}, "churn"},
		{[]string{"--checkpoints", "1"}, "checkpoints"},
		{[]string{"--hash-load", "0"}, "--hash-load"},
		{[]string{"--copy-load", "relative/dir"}, "--copy-load"},
		{[]string{"--scale-files", "ten"}, "--scale-files"},
		{[]string{"--scale-objects", "1k,0"}, "--scale-objects"},
		{[]string{"--scale-objects", "10"}, "scale objects"},
	} {
		var stdout, stderr strings.Builder
		if got := run(context.Background(), tc.args, &stdout, &stderr); got != 2 {
			t.Errorf("ckpt-bench %v: exit %d, want 2 (stderr %q)", tc.args, got, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("ckpt-bench %v: stderr %q does not name %q", tc.args, stderr.String(), tc.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("ckpt-bench %v: printed %q on stdout", tc.args, stdout.String())
		}
	}
}

func TestHelpGoesToStdoutAndNamesEveryFlag(t *testing.T) {
	var stdout, stderr strings.Builder
	if got := run(context.Background(), []string{"--help"}, &stdout, &stderr); got != 0 {
		t.Fatalf("ckpt-bench --help: exit %d, stderr %q", got, stderr.String())
	}
	for _, f := range []string{"Usage: ckpt-bench", "-storage", "-quick", "-json", "-state-bytes", "-only", "-ckpt", "-hash-load", "-copy-load", "-scale-files", "-scale-objects"} {
		if !strings.Contains(stdout.String(), f) {
			t.Errorf("--help does not mention %q:\n%s", f, stdout.String())
		}
	}
}

// TestHashLoadControlRunsUntilInterrupted: `ckpt-bench --hash-load RATE`
// is the control the bench starts beside the app; it stops cleanly when
// its context ends.
func TestHashLoadControlRunsUntilInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr strings.Builder
	if got := run(ctx, []string{"--hash-load", "1MB"}, &stdout, &stderr); got != 0 || stdout.Len() != 0 {
		t.Errorf("ckpt-bench --hash-load 1MB: exit %d, stdout %q, stderr %q", got, stdout.String(), stderr.String())
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"123": 123, "64MiB": 64 << 20, "1GiB": 1 << 30, "512KiB": 512 << 10, "150MB": 150 << 20, "1.5K": 1536} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1MiB", "lots"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q): no error", in)
		}
	}
}

func TestParseCounts(t *testing.T) {
	got, err := parseCounts("1k, 10K,100000,1M")
	if err != nil || len(got) != 4 || got[0] != 1000 || got[1] != 10000 || got[2] != 100000 || got[3] != 1000000 {
		t.Errorf("parseCounts: %v, %v", got, err)
	}
	for _, in := range []string{"", "1k,", "-5", "1.5k", "many"} {
		if _, err := parseCounts(in); err == nil {
			t.Errorf("parseCounts(%q): no error", in)
		}
	}
}
