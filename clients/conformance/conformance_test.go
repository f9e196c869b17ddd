package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/file"
)

// clientsDir is the repository's clients folder (this package's parent).
func clientsDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// need skips the test under -short and when a tool is missing
// (scripts/deps.sh installs them); with CKPTTEST_REQUIRE_CLIENTS=1, as
// scripts/test.sh sets it, a missing tool fails the test instead.
func need(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a client in another language: not under -short")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CKPTTEST_REQUIRE_CLIENTS") == "1" {
				t.Fatalf("%s is not installed: run scripts/deps.sh", tool)
			}
			t.Skipf("%s is not installed (scripts/deps.sh installs it)", tool)
		}
	}
}

// suite runs the conformance suite against a driver and returns its
// report and the number of failed scenarios.
func suite(t *testing.T, mode string, argv ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	start := time.Now()
	failed, err := Run(argv, mode, "", &out)
	if err != nil {
		t.Fatalf("the suite could not run: %v\n%s", err, out.String())
	}
	t.Logf("%d scenarios failed of %d, in %v", failed, len(scenarios), time.Since(start).Round(time.Millisecond))
	return out.String(), failed
}

func pythonDriver(t *testing.T, extra ...string) []string {
	return append([]string{"python3", filepath.Join(clientsDir(t), "python", "tests", "driver.py")}, extra...)
}

func TestThePythonClientConforms(t *testing.T) {
	need(t, "python3")
	for _, mode := range []string{"", "async"} {
		t.Run("mode="+mode, func(t *testing.T) {
			if out, failed := suite(t, mode, pythonDriver(t)...); failed > 0 {
				t.Errorf("the Python client fails the suite:\n%s", out)
			}
		})
	}
}

// buildJava builds the Java client with its build script (the JDK alone).
func buildJava(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "build")
	start := time.Now()
	cmd := exec.Command(filepath.Join(clientsDir(t), "java", "build.sh"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("clients/java/build.sh: %v\n%s", err, b)
	}
	t.Logf("clients/java/build.sh: %v", time.Since(start).Round(time.Millisecond))
	return out
}

func TestTheJavaClientConforms(t *testing.T) {
	need(t, "javac", "java", "jar")
	build := buildJava(t)
	for _, mode := range []string{"", "async"} {
		t.Run("mode="+mode, func(t *testing.T) {
			out, failed := suite(t, mode, "java", "-cp", filepath.Join(build, "test"), "io.ckpt.client.ConformanceDriver")
			if failed > 0 {
				t.Errorf("the Java client fails the suite:\n%s", out)
			}
		})
	}
}

// TestTheGoClientConforms runs the suite against package client, through
// its driver (client/internal/driver).
func TestTheGoClientConforms(t *testing.T) {
	need(t, "go")
	bin := filepath.Join(t.TempDir(), "driver")
	build := exec.Command("go", "build", "-o", bin, "./client/internal/driver")
	build.Dir = filepath.Dir(clientsDir(t))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the Go driver: %v\n%s", err, out)
	}
	if out, failed := suite(t, "", bin); failed > 0 {
		t.Errorf("the Go client fails the suite:\n%s", out)
	}
}

// TestTheSuiteFailsABrokenClient: the Python client broken on purpose, one
// ignoring ids and one taking synced for the end of a checkpoint, fails
// the suite, in the scenarios that say so.
func TestTheSuiteFailsABrokenClient(t *testing.T) {
	need(t, "python3")
	for _, c := range []struct{ breakage, scenario string }{
		{"ids", "ids-echoed-and-matched"},
		{"ids", "wait-runs-out-and-late-events-are-skipped"},
		{"synced", "checkpoint-synced-is-not-done"},
		{"synced", "checkpoint-completed-with-every-option"},
	} {
		t.Run(c.breakage+"/"+c.scenario, func(t *testing.T) {
			var out bytes.Buffer
			failed, err := Run(pythonDriver(t, "--break", c.breakage), "", "^"+c.scenario+"$", &out)
			if err != nil {
				t.Fatal(err)
			}
			if failed != 1 || !strings.Contains(out.String(), "--- FAIL "+c.scenario) {
				t.Fatalf("a client broken with %s passes %s:\n%s", c.breakage, c.scenario, out.String())
			}
			t.Logf("%s", strings.TrimSpace(out.String()))
		})
	}
}

// realAgent starts an in-process agent on file storage with the restore
// op and a standby service, and returns its socket and allowed root.
func realAgent(t *testing.T, mod func(*agent.Config)) (socket, root string) {
	t.Helper()
	base, err := os.MkdirTemp("", "ckpt-drift-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	root, socket = filepath.Join(base, "apps"), filepath.Join(base, "s.sock")
	local := filepath.Join(root, "local")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	store, err := file.New(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{Socket: socket, Store: store, Job: "job", LocalDir: local, AllowRoots: []string{root},
		GCGrace: time.Hour, ShutdownGrace: 5 * time.Second, Version: "v1.0.0-test",
		Restore: func(ctx context.Context, r agent.RestoreRequest) (*restore.Result, error) {
			return restore.Run(ctx, restore.Options{Store: store, Job: "job", Task: r.Task, Checkpoint: r.Checkpoint,
				JobConsistent: r.JobConsistent, To: restore.DefaultTo(r.To, r.Checkpoint, r.JobConsistent), Target: r.Target, TargetParent: r.Parent, LocalDir: local})
		},
		Standby: func(ctx context.Context, task string) (*restore.RefreshResult, error) {
			return &restore.RefreshResult{}, nil
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-a.Ready():
	case err := <-done:
		t.Fatalf("agent: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	return socket, root
}

// shape is what must not drift between the fake and the real agent: an
// event's name and its fields' names, with the fields of nested objects
// (the first element of an array stands for all).
func shape(line []byte) string {
	var v any
	if err := json.Unmarshal(line, &v); err != nil {
		return fmt.Sprintf("not JSON: %q", line)
	}
	var walk func(v any) string
	walk = func(v any) string {
		switch v := v.(type) {
		case map[string]any:
			ks := make([]string, 0, len(v))
			for k, x := range v {
				if k == "event" {
					k += "=" + fmt.Sprint(x)
				}
				ks = append(ks, k+walk(x))
			}
			sort.Strings(ks)
			return "{" + strings.Join(ks, ",") + "}"
		case []any:
			if len(v) == 0 {
				return "[]"
			}
			return "[" + walk(v[0]) + "]"
		}
		return ""
	}
	return walk(v)
}

// fakeLine is the line the fake agent sends for ev answering a request
// with id.
func fakeLine(t *testing.T, ev protocol.Event, id any) []byte {
	t.Helper()
	if ev.ID == noID {
		ev.ID = nil
	} else {
		ev.ID = id
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTheFakeAgentAnswersAsTheRealOne sends the scenarios' requests to a
// real agent and requires its answers to have the events, order and
// fields the fake agent's script has: the script cannot drift from the
// agent without this test failing.
func TestTheFakeAgentAnswersAsTheRealOne(t *testing.T) {
	socket, root := realAgent(t, nil)
	snap := filepath.Join(root, "snap-7")
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, size := range map[string]int{"000001.sst": 4096, "CURRENT": 16, "MANIFEST-000001": 100} {
		if err := os.WriteFile(filepath.Join(snap, name), bytes.Repeat([]byte{'x'}, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rd := bufio.NewReader(nc)
	n := 0
	exchange := func(what string, req map[string]any, want ...protocol.Event) {
		t.Helper()
		n++
		id := fmt.Sprintf("r%d", n)
		req["id"] = id
		b, _ := json.Marshal(req)
		nc.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := nc.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			line, err := rd.ReadBytes('\n')
			if err != nil {
				t.Fatalf("%s: event %d: %v", what, i, err)
			}
			if got, fake := shape(line), shape(fakeLine(t, w, id)); got != fake {
				t.Fatalf("%s: event %d drifted:\nthe agent sends %s\n  shape %s\nthe fake sends    %s\n  shape %s", what, i, line, got, fakeLine(t, w, id), fake)
			}
		}
	}
	exchange("hello", map[string]any{"op": "hello"}, evHello)
	exchange("checkpoint", map[string]any{"op": "checkpoint", "task": "t1", "checkpoint": 7, "dir": snap, "engine": "rocksdb", "timeout_ms": 60000},
		evSynced, evCompleted)
	exchange("status", map[string]any{"op": "status"}, evStatus)
	exchange("checkpoint refused before synced", map[string]any{"op": "checkpoint", "task": "t1", "checkpoint": 7, "dir": snap},
		failedEv(protocol.CodeConflict))
	exchange("invalid checkpoint", map[string]any{"op": "checkpoint", "task": "t1", "checkpoint": 0, "dir": snap}, evInvalid)
	exchange("abort of a checkpoint not in flight", map[string]any{"op": "abort", "task": "t1", "checkpoint": 7},
		errorEv("t1", 7, protocol.CodeNotFound))
	exchange("restore", map[string]any{"op": "restore", "task": "t1", "target": filepath.Join(root, "restored")}, evRestored)
	exchange("restore of a missing checkpoint", map[string]any{"op": "restore", "task": "t1", "checkpoint": 5, "target": filepath.Join(root, "r2")},
		evRestoreFailed)
	exchange("follow", map[string]any{"op": "follow", "task": "t9"}, evFollowing)
	exchange("follow of a served task", map[string]any{"op": "follow", "task": "t1"}, errorEv("t9", 0, protocol.CodeConflict))

	// An agent that refuses the peer: one error event without an id.
	socket2, _ := realAgent(t, func(c *agent.Config) { c.AllowUIDs = []uint32{uint32(os.Getuid()) + 4242} })
	nc2, err := net.Dial("unix", socket2)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	nc2.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(nc2).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	if got, fake := shape(line), shape(fakeLine(t, evRefused, nil)); got != fake {
		t.Errorf("refusal drifted: the agent sends %s, the fake %s", line, fakeLine(t, evRefused, nil))
	}
}
