package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestANodeAgentStopsAtStartOnATenantStorageURLItCannotUse: a tenant's
// storage that is down is an outage the node agent rides out, but a URL
// ckpt cannot use at all (an unknown scheme, a file:// directory that does
// not exist) is a mistake to fix: the agent exits at start, 2 for a
// scheme it does not know (bad usage), 1 for a directory that is not there.
func TestANodeAgentStopsAtStartOnATenantStorageURLItCannotUse(t *testing.T) {
	want := map[string]int{"unknown scheme": 2, "missing file dir": 1}
	for name, storage := range map[string]string{
		"unknown scheme":   "s4://bucket/x",
		"missing file dir": "file:///nonexistent/ckpt-store",
	} {
		dir := t.TempDir()
		root := filepath.Join(dir, "root")
		os.MkdirAll(root, 0o755)
		f := filepath.Join(dir, "tenants.yaml")
		os.WriteFile(f, []byte("tenants:\n- {name: a, uid: 1, job: a, storage: '"+storage+"', allow_roots: ['"+root+"'], tasks: '*'}\n"), 0o644)
		// Started by mistake, the agent would serve: the deadline stops it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		got := run(ctx, []string{"agent", "--tenants", f, "--socket", filepath.Join(dir, "s.sock"), "--local-dir", filepath.Join(dir, "local")})
		cancel()
		if got != want[name] || time.Since(start) > 5*time.Second {
			t.Errorf("%s: exit %d after %v, want %d at once", name, got, time.Since(start), want[name])
		}
	}
}
