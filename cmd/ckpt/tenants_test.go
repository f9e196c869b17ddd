package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTenantsModeRefusesSidecarFlagsAndBadFiles: --tenants replaces
// --storage, --job and the allow flags (combining them is bad usage), and
// a bad tenants file is bad usage too; both exit 2 before anything starts.
func TestTenantsModeRefusesSidecarFlagsAndBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "tenants.yaml")
	os.WriteFile(good, []byte("tenants:\n- {name: a, uid: 1, job: a, storage: 'file://"+dir+"', allow_roots: ['"+dir+"'], tasks: '*'}\n"), 0o644)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("tenants:\n- {name: a, uid: 1, job: a, storage: 'file://"+dir+"', allow_roots: [rel], tasks: '*'}\n"), 0o644)
	base := []string{"agent", "--socket", filepath.Join(dir, "s.sock"), "--local-dir", filepath.Join(dir, "local")}
	for name, extra := range map[string][]string{
		"--storage":     {"--tenants", good, "--storage", "file://" + dir},
		"--job":         {"--tenants", good, "--job", "j"},
		"--allow-root":  {"--tenants", good, "--allow-root", dir},
		"--allow-uid":   {"--tenants", good, "--allow-uid", "5"},
		"--standby-for": {"--tenants", good, "--standby-for", "t-0"},
		"a bad file":    {"--tenants", bad},
		"no file":       {"--tenants", filepath.Join(dir, "missing.yaml")},
	} {
		// A flag let through would start the agent: the deadline stops it.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		got := run(ctx, append(append([]string{}, base...), extra...))
		cancel()
		if got != 2 {
			t.Errorf("%s: exit %d, want 2", name, got)
		}
	}
	// Without --socket, even a good file is bad usage.
	if got := run(context.Background(), []string{"agent", "--tenants", good, "--local-dir", dir}); got != 2 {
		t.Errorf("no --socket: exit %d, want 2", got)
	}
}
