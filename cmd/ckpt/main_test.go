package main

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestBenchIsNotACkptCommand: the benchmark lab is its own binary
// (ckpt-bench); the product's command list does not offer it.
func TestBenchIsNotACkptCommand(t *testing.T) {
	var usage strings.Builder
	printUsage(&usage, commands())
	if strings.Contains(usage.String(), "bench") {
		t.Errorf("ckpt's usage mentions bench:\n%s", usage.String())
	}
	if got := run(context.Background(), []string{"bench", "--quick"}); got != 2 {
		t.Errorf("ckpt bench: exit %d, want 2 (unknown command)", got)
	}
}

// TestReleasesInstallByTag: a tagged release installs with `go install
// github.com/ckpt-io/ckpt/cmd/ckpt@vX.Y.Z`, which refuses a go.mod with
// replace directives, and the README says how.
func TestReleasesInstallByTag(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(mod), "\n")
	if first != "module github.com/ckpt-io/ckpt" {
		t.Errorf("go.mod starts with %q, want the module path github.com/ckpt-io/ckpt", first)
	}
	for _, line := range strings.Split(string(mod), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "replace") {
			t.Errorf("go.mod has %q: go install ...@version refuses a module with replace directives", line)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"go install github.com/ckpt-io/ckpt/cmd/ckpt@v", "vMAJOR.MINOR.PATCH"} {
		if !strings.Contains(string(readme), w) {
			t.Errorf("README.md does not say %q", w)
		}
	}
}
