package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildPlugins builds every plugin binary (go build -o DIR/ ./plugins/...)
// and the example memstore plugin into a new directory.
func buildPlugins(t *testing.T) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./plugins/...", "./examples/ckpt-plugin-memstore")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./plugins/...: %v\n%s", err, out)
	}
	return dir
}

type pluginEntry struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind"`
	Schemes  []string `json:"schemes"`
	Engine   string   `json:"engine"`
	Path     string   `json:"path"`
	Protocol int      `json:"protocol"`
}

// TestPluginsCommandListsAndRefuses: `ckpt plugins` lists what the
// directory serves and says, one line each, why it refused the rest.
func TestPluginsCommandListsAndRefuses(t *testing.T) {
	dir := buildPlugins(t)
	var found []pluginEntry
	ckptJSON(t, &found, "plugins", "--plugin-dir", dir, "--json")
	byName := map[string]pluginEntry{}
	for _, p := range found {
		byName[p.Name] = p
	}
	if s3 := byName["s3"]; s3.Kind != "storage" || strings.Join(s3.Schemes, ",") != "s3,s3+plugin" || s3.Protocol != 1 ||
		s3.Path != filepath.Join(dir, "ckpt-plugin-s3") {
		t.Errorf("plugins --json: s3 is %+v", s3)
	}
	if m := byName["memstore"]; m.Kind != "storage" || len(m.Schemes) != 1 || m.Schemes[0] != "mem" {
		t.Errorf("plugins --json: memstore is %+v", m)
	}

	os.WriteFile(filepath.Join(dir, "ckpt-plugin-noexec"), []byte("#!/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "ckpt-plugin-hello"), []byte("#!/bin/sh\necho hello\n"), 0o755)
	res := runCkptEnv(t, []string{"CKPT_PLUGIN_DIR=" + dir}, "plugins", "--json")
	if res.Code != 1 {
		t.Errorf("plugins with refused binaries: exit %d, want 1", res.Code)
	}
	if err := json.Unmarshal(res.Stdout, &found); err != nil || len(found) != len(byName) {
		t.Errorf("plugins --json with refused binaries: %v, %s", err, res.Stdout)
	}
	lines := strings.Split(strings.TrimSpace(string(res.Stderr)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "ckpt-plugin-hello: wrong handshake") || !strings.Contains(lines[1], "ckpt-plugin-noexec: not executable") {
		t.Errorf("refusals on stderr:\n%s", res.Stderr)
	}
	if res := runCkpt(t, "plugins"); res.Code != 2 {
		t.Errorf("plugins without a directory: exit %d, want 2", res.Code)
	}
}

// TestCheckpointThroughTheS3Plugin runs the agent, list, verify, restore
// and gc on s3+plugin:// URLs, so every storage call crosses a plugin
// process (ckpt-plugin-s3) on its way to versitygw; the plugin directory
// comes from $CKPT_PLUGIN_DIR.
func TestCheckpointThroughTheS3Plugin(t *testing.T) {
	direct := newBackend(t, "s3") // inspected straight on the server
	dir := buildPlugins(t)
	b := *direct
	b.url = strings.Replace(b.url, "s3://", "s3+plugin://", 1)
	b.env = append(b.env, "CKPT_PLUGIN_DIR="+dir)
	b.name = "s3 plugin"

	root, localDir := t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "orders", "orders-3"
	startAgent(t, "A", b.agentConfig(socket, job, localDir, []string{root}))
	snap1 := filepath.Join(root, "snap-1")
	writeSnapshot1(t, snap1)
	ev := trigger(t, socket, task, 1, snap1)
	if ev.FullSize != treeSize(t, snap1) {
		t.Errorf("full_size %d, the snapshot holds %d B", ev.FullSize, treeSize(t, snap1))
	}
	direct.requireObjectsOf(t, direct.manifest(t, job, task, 1))
	target, rr, _ := b.restoreFromStorage(t, job, task)
	if rr.Checkpoint != 1 {
		t.Errorf("restore: %+v", rr)
	}
	requireSameFiles(t, snap1, target)
	if list := b.list(t, job); len(list) != 1 || list[0].Checkpoint != 1 {
		t.Errorf("list: %+v", list)
	}
	b.verify(t, job)
	var gc map[string]any
	b.ckptJSON(t, &gc, "gc", "--storage", b.url, "--job", job, "--json")
	if gc["live_objects"] == nil {
		t.Errorf("gc --json: %v", gc)
	}
}
