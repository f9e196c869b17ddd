package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestHelpAndVersion holds the CLI conventions: --help on stdout with exit
// 0 (for ckpt and every command), bad usage exit 2 with the usage on
// stderr, and one version from `ckpt --version` and `ckpt version`.
func TestHelpAndVersion(t *testing.T) {
	top := runCkpt(t, "--help")
	if top.Code != 0 || !strings.Contains(string(top.Stdout), "Commands:") {
		t.Fatalf("ckpt --help: exit %d, stdout %q", top.Code, top.Stdout)
	}
	for _, cmd := range helpCommands(t, string(top.Stdout)) {
		h := runCkpt(t, cmd, "--help")
		if h.Code != 0 || !strings.HasPrefix(string(h.Stdout), "Usage: ckpt "+cmd) {
			t.Errorf("ckpt %s --help: exit %d, stdout %q", cmd, h.Code, h.Stdout)
		}
	}
	bad := runCkpt(t, "list", "--no-such-flag")
	if bad.Code != 2 || !strings.Contains(string(bad.Stderr), "Usage: ckpt list") || len(bad.Stdout) != 0 {
		t.Errorf("ckpt list --no-such-flag: exit %d, stdout %q, stderr %q", bad.Code, bad.Stdout, bad.Stderr)
	}
	if none := runCkpt(t); none.Code != 2 {
		t.Errorf("ckpt with no command: exit %d, want 2", none.Code)
	}
	v1, v2 := runCkpt(t, "--version"), runCkpt(t, "version")
	if v1.Code != 0 || v2.Code != 0 || string(v1.Stdout) != string(v2.Stdout) || len(strings.TrimSpace(string(v1.Stdout))) == 0 {
		t.Errorf("ckpt --version %q (exit %d) and ckpt version %q (exit %d) differ or are empty", v1.Stdout, v1.Code, v2.Stdout, v2.Code)
	}
}

// TestTheREADMEListsEveryCommand keeps README.md's command list equal to
// what `ckpt --help` lists.
func TestTheREADMEListsEveryCommand(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The first code block after the "## Commands" heading.
	_, section, ok := strings.Cut(string(readme), "\n## Commands\n")
	if !ok {
		t.Fatal(`README.md has no "## Commands" section`)
	}
	parts := strings.SplitN(section, "```", 3)
	if len(parts) < 3 {
		t.Fatal("README.md's Commands section has no code block")
	}
	var inREADME []string
	for _, m := range regexp.MustCompile(`(?m)^ckpt ([a-z]+)\b`).FindAllStringSubmatch(parts[1], -1) {
		if !slices.Contains(inREADME, m[1]) {
			inREADME = append(inREADME, m[1])
		}
	}
	inHelp := helpCommands(t, string(runCkpt(t, "--help").Stdout))
	slices.Sort(inREADME)
	slices.Sort(inHelp)
	if !slices.Equal(inREADME, inHelp) {
		t.Fatalf("README.md lists commands %v, ckpt --help lists %v", inREADME, inHelp)
	}
}

// helpCommands returns the command names of `ckpt --help`.
func helpCommands(t *testing.T, help string) []string {
	t.Helper()
	_, list, ok := strings.Cut(help, "Commands:\n")
	if !ok {
		t.Fatalf("ckpt --help has no command list: %q", help)
	}
	var out []string
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  ") {
			out = append(out, f[0])
		}
	}
	if len(out) < 5 {
		t.Fatalf("ckpt --help lists %d commands: %q", len(out), list)
	}
	return out
}
