package e2e

import (
	"crypto/sha256"
	"encoding/hex"
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
	// The agent runs the plugin only as the build pinned here.
	startAgent(t, "A", b.agentConfig(socket, job, localDir, []string{root}, "--plugin-sha256", "s3="+fileSHA256(t, filepath.Join(dir, "ckpt-plugin-s3"))))
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

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestPluginPinsFromFlagsFileAndConfig: --plugin-sha256 and
// --plugin-sha256-file pin plugin binaries on `ckpt plugins` and, through
// --config, on the agent; a wrong pin refuses the binary before it runs
// and says what to do, a pin for a missing plugin is an error.
func TestPluginPinsFromFlagsFileAndConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds plugins and runs them (about 20 s)")
	}
	dir := buildPlugins(t)
	s3 := filepath.Join(dir, "ckpt-plugin-s3")
	right, wrong := fileSHA256(t, s3), strings.Repeat("0f", 32)

	var found []pluginEntry
	ckptJSON(t, &found, "plugins", "--plugin-dir", dir, "--plugin-sha256", "s3="+right, "--json")
	if len(found) < 2 {
		t.Errorf("plugins with a right pin: %+v", found)
	}
	ckptJSON(t, &found, "plugins", "--plugin-dir", dir, "--plugin-sha256",
		"s3="+right+",memstore="+fileSHA256(t, filepath.Join(dir, "ckpt-plugin-memstore")), "--json")
	pinFile := filepath.Join(t.TempDir(), "pins")
	os.WriteFile(pinFile, []byte(right+"  "+s3+"\n"), 0o600)
	ckptJSON(t, &found, "plugins", "--plugin-dir", dir, "--plugin-sha256-file", pinFile, "--json")

	res := runCkpt(t, "plugins", "--plugin-dir", dir, "--plugin-sha256", "s3="+wrong)
	if res.Code != 1 || !strings.Contains(string(res.Stdout), "memstore") || strings.Contains(string(res.Stdout), "ckpt-plugin-s3") {
		t.Errorf("plugins with a wrong pin: exit %d\n%s", res.Code, res.Stdout)
	}
	lines := strings.Split(strings.TrimSpace(string(res.Stderr)), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "refused "+s3+": checksum mismatch: plugin s3 is pinned to SHA-256 "+wrong+" but the binary's is "+right) ||
		!strings.Contains(lines[0], "pin the new hash") {
		t.Errorf("plugins with a wrong pin, stderr:\n%s", res.Stderr)
	}

	res = runCkpt(t, "plugins", "--plugin-dir", dir, "--plugin-sha256", "azblob2="+right)
	if res.Code != 1 || !strings.Contains(string(res.Stderr), "holds no ckpt-plugin-azblob2") {
		t.Errorf("plugins with a pin for a missing plugin: exit %d\n%s", res.Code, res.Stderr)
	}
	for _, bad := range []string{"s3", "s3=xyz"} {
		if res := runCkpt(t, "plugins", "--plugin-dir", dir, "--plugin-sha256", bad); res.Code != 2 {
			t.Errorf("--plugin-sha256 %s: exit %d, want 2\n%s", bad, res.Code, res.Stderr)
		}
	}

	// The agent takes its pins from --config: a wrong one keeps the
	// plugin from running, so its scheme is not served and the agent stops.
	cfg := filepath.Join(t.TempDir(), "agent.json")
	os.WriteFile(cfg, []byte(`{"plugin-dir":"`+dir+`","plugin-sha256":["s3=`+wrong+`"],"socket":"`+filepath.Join(shortDir(t), "a.sock")+
		`","storage":"s3+plugin://bucket/x","job":"j","local-dir":"`+t.TempDir()+`","allow-root":["/"]}`), 0o600)
	res = runCkpt(t, "agent", "--config", cfg)
	if res.Code != 1 || !strings.Contains(string(res.Stderr), "checksum mismatch: plugin s3 is pinned to SHA-256 "+wrong) {
		t.Errorf("agent with a wrong pin in --config: exit %d\n%s", res.Code, res.Stderr)
	}
}

// TestAgentLivesOnAPluginThatCrashes: a storage plugin that crashes
// mid-upload, every time, fails that checkpoint with unavailable and a
// message naming the plugin; the agent keeps serving, and once the plugin
// behaves the next checkpoint (restarting it) completes.
func TestAgentLivesOnAPluginThatCrashes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds plugins and runs them (about 20 s)")
	}
	dir := buildFaultyPlugin(t)
	crashFile := filepath.Join(t.TempDir(), "crash")
	writeFile(t, crashFile, nil)
	snaps, localDir := t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	a := startAgent(t, "A", agentConfig{Socket: socket, Storage: "faulty://" + t.TempDir(), Job: "orders", LocalDir: localDir,
		AllowRoots: []string{snaps}, Env: []string{"CKPT_PLUGIN_DIR=" + dir, "CKPT_TEST_CRASH_FILE=" + crashFile}})

	snap1 := filepath.Join(snaps, "snap-1")
	writeFencingSnapshot(t, snap1, 1)
	o := triggerAsync(socket, "orders-1", 1, snap1)
	if o.err != nil || o.code != 1 || o.ev.Event != "failed" || o.ev.Error == nil || o.ev.Error.Code != "unavailable" ||
		!strings.Contains(o.ev.Error.Message, "ckpt-plugin-faulty") || !strings.Contains(o.ev.Error.Message, "crashing on purpose") {
		t.Fatalf("checkpoint through a crashing plugin: exit %d, %+v, %v\n%s", o.code, o.ev, o.err, o.stder)
	}
	if err := hello(socket); err != nil {
		t.Fatalf("the agent after the plugin crashed: %v\n%s", err, a.stderr)
	}
	os.Remove(crashFile)
	snap2 := filepath.Join(snaps, "snap-2")
	writeFencingSnapshot(t, snap2, 2)
	trigger(t, socket, "orders-1", 2, snap2)
}

// A storage plugin whose Put never returns, whatever its context says,
// cannot hold a checkpoint past --checkpoint-timeout: the deadline crosses
// the boundary, the checkpoint fails with unavailable, and the next one
// completes through the same plugin once it answers again.
func TestAHungPluginIsCutOffByTheCheckpointTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a plugin and runs it")
	}
	dir := buildFaultyPlugin(t)
	hangFile := filepath.Join(t.TempDir(), "hang")
	writeFile(t, hangFile, nil)
	snaps, localDir := t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	startAgent(t, "A", agentConfig{Socket: socket, Storage: "faulty://" + t.TempDir(), Job: "orders", LocalDir: localDir,
		AllowRoots: []string{snaps}, Env: []string{"CKPT_PLUGIN_DIR=" + dir, "CKPT_TEST_HANG_FILE=" + hangFile},
		Extra: []string{"--checkpoint-timeout", "2s"}})

	snap1 := filepath.Join(snaps, "snap-1")
	writeFencingSnapshot(t, snap1, 1)
	o := triggerAsync(socket, "orders-1", 1, snap1)
	if o.err != nil || o.code != 1 || o.ev.Error == nil || o.ev.Error.Code != "unavailable" || !strings.Contains(o.ev.Error.Message, "timed out") {
		t.Fatalf("checkpoint through a hung plugin: exit %d, %+v, %v\n%s", o.code, o.ev, o.err, o.stder)
	}
	os.Remove(hangFile)
	snap2 := filepath.Join(snaps, "snap-2")
	writeFencingSnapshot(t, snap2, 2)
	trigger(t, socket, "orders-1", 2, snap2)
}

// buildFaultyPlugin builds plugins/testdata/ckpt-plugin-faulty into a
// fresh plugin directory and returns the directory.
func buildFaultyPlugin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "ckpt-plugin-faulty"), "./plugins/testdata/ckpt-plugin-faulty")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the faulty plugin: %v\n%s", err, out)
	}
	return dir
}

// TestRequirePinsFromFlagEnvAndConfig: --require-pins (or
// CKPT_REQUIRE_PINS, or require-pins in the agent's --config) refuses
// every plugin that is not pinned, saying how to pin it; pinned ones run.
func TestRequirePinsFromFlagEnvAndConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds plugins and runs them (about 20 s)")
	}
	dir := buildPlugins(t)
	s3 := filepath.Join(dir, "ckpt-plugin-s3")
	pin := "s3=" + fileSHA256(t, s3)
	check := func(what string, res cliResult) {
		t.Helper()
		if res.Code != 1 || !strings.Contains(string(res.Stdout), s3) || strings.Contains(string(res.Stdout), "ckpt-plugin-memstore") ||
			!strings.Contains(string(res.Stderr), "refused "+filepath.Join(dir, "ckpt-plugin-memstore")+": not pinned, and pins are required (--require-pins)") {
			t.Errorf("%s: exit %d\n%s\n%s", what, res.Code, res.Stdout, res.Stderr)
		}
	}
	check("--require-pins", runCkpt(t, "plugins", "--plugin-dir", dir, "--plugin-sha256", pin, "--require-pins"))
	check("CKPT_REQUIRE_PINS=true", runCkptEnv(t, []string{"CKPT_REQUIRE_PINS=true"}, "plugins", "--plugin-dir", dir, "--plugin-sha256", pin))
	if res := runCkptEnv(t, []string{"CKPT_REQUIRE_PINS=1"}, "plugins", "--plugin-dir", dir, "--plugin-sha256", pin, "--require-pins=false"); res.Code != 0 {
		t.Errorf("--require-pins=false over the environment: exit %d\n%s", res.Code, res.Stderr)
	}
	if res := runCkptEnv(t, []string{"CKPT_REQUIRE_PINS=yes"}, "plugins", "--plugin-dir", dir); res.Code != 2 ||
		!strings.Contains(string(res.Stderr), "CKPT_REQUIRE_PINS") {
		t.Errorf("CKPT_REQUIRE_PINS=yes: exit %d, want 2\n%s", res.Code, res.Stderr)
	}
	if res := runCkpt(t, "list", "--plugin-dir", dir, "--require-pins", "--storage", "s3+plugin://bucket/x", "--job", "j"); res.Code == 0 ||
		!strings.Contains(string(res.Stderr), "ckpt-plugin-s3: not pinned, and pins are required") {
		t.Errorf("list with an unpinned plugin required: exit %d\n%s", res.Code, res.Stderr)
	}

	// The agent takes it from --config: its unpinned storage plugin is
	// refused, so its scheme is not served and the agent stops.
	cfg := filepath.Join(t.TempDir(), "agent.json")
	os.WriteFile(cfg, []byte(`{"plugin-dir":"`+dir+`","require-pins":true,"socket":"`+filepath.Join(shortDir(t), "a.sock")+
		`","storage":"s3+plugin://bucket/x","job":"j","local-dir":"`+t.TempDir()+`","allow-root":["/"]}`), 0o600)
	res := runCkpt(t, "agent", "--config", cfg)
	if res.Code != 1 || !strings.Contains(string(res.Stderr), "ckpt-plugin-s3: not pinned, and pins are required") {
		t.Errorf("agent with require-pins in --config: exit %d\n%s", res.Code, res.Stderr)
	}
}
