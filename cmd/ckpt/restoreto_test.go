package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestRestoreRefusesABadTo(t *testing.T) {
	url, _ := storageDir(t)
	target := filepath.Join(t.TempDir(), "db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--to", "yesterday"}, "latest or checkpoint"},
		{[]string{"--to", "latest", "--job-consistent"}, "--job-consistent"},
	} {
		args := append([]string{"restore", "--storage", url, "--job", "j", "--task", "t", "--target", target}, c.args...)
		code, _, stderr := runCaptured(t, args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("restore %v: exit %d, want 2 saying %q\n%s", c.args, code, c.want, stderr)
		}
	}
}
