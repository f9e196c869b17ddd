package main

import (
	"context"
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
