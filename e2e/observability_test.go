package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/lab/workload"
)

// consoleSpan is the part of a span as the console exporter prints it that
// these tests read.
type consoleSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Attributes  []struct {
		Key   string
		Value struct {
			Type  string
			Value any
		}
	}
}

func (s consoleSpan) attr(key string) any {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.Value
		}
	}
	return nil
}

// spansIn decodes every console-exported span from an agent's output,
// which interleaves them with JSON log lines.
func spansIn(out string) []consoleSpan {
	var spans []consoleSpan
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return spans
		}
		var s consoleSpan
		if json.Unmarshal(raw, &s) == nil && s.Name != "" && s.SpanContext.TraceID != "" {
			spans = append(spans, s)
		}
	}
}

func TestConsoleTracesCarryTheCheckpointFiguresAndTheAppsParent(t *testing.T) {
	root, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	a := startAgent(t, "traced", agentConfig{Socket: socket, StorageDir: storageDir, Job: "obs", LocalDir: localDir,
		AllowRoots: []string{root}, Env: []string{"OTEL_TRACES_EXPORTER=console"}})
	snap := filepath.Join(root, "snap")
	for i := range 3 {
		writeFile(t, filepath.Join(snap, fmt.Sprintf("00000%d.sst", i)), randomBytes(200_000, uint64(i)))
	}
	writeFile(t, filepath.Join(snap, "CURRENT"), []byte("MANIFEST-000001\n"))
	first := trigger(t, a.cfg.Socket, "t1", 1, snap)

	// The second checkpoint carries the app's trace context.
	writeFile(t, filepath.Join(snap, "000009.sst"), randomBytes(50_000, 9))
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, `{"op":"checkpoint","task":"t1","checkpoint":2,"dir":%q,"traceparent":"00-%s-%s-01"}`+"\n", snap, traceID, parentID)
	r := bufio.NewReader(conn)
	var second completedEvent
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	for second.Event != "completed" {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("waiting for checkpoint 2: %v", err)
		}
		json.Unmarshal(line, &second)
		if second.Event == "failed" {
			t.Fatalf("checkpoint 2 failed: %s", line)
		}
	}

	// Spans are flushed when the agent stops.
	a.signal(syscall.SIGTERM)
	if code := a.waitExit(30 * time.Second); code != 0 {
		t.Fatalf("agent exit %d", code)
	}
	spans := spansIn(a.stderr.String())
	byCheckpoint := map[float64]consoleSpan{}
	names := map[string]int{}
	for _, s := range spans {
		names[s.Name]++
		if s.Name == "checkpoint" {
			n, _ := s.attr("ckpt.checkpoint").(float64)
			byCheckpoint[n] = s
		}
	}
	for n, ev := range map[float64]completedEvent{1: first, 2: second} {
		s, ok := byCheckpoint[n]
		if !ok {
			t.Fatalf("no checkpoint span for checkpoint %v among %v", n, names)
		}
		if got := s.attr("ckpt.checkpoint_size"); got != float64(ev.CheckpointSize) {
			t.Errorf("checkpoint %v span: checkpoint size %v, trigger said %d", n, got, ev.CheckpointSize)
		}
		if got := s.attr("ckpt.full_size"); got != float64(ev.FullSize) {
			t.Errorf("checkpoint %v span: full size %v, trigger said %d", n, got, ev.FullSize)
		}
		if s.attr("ckpt.task") != "t1" || s.attr("ckpt.status") != "completed" {
			t.Errorf("checkpoint %v span attributes: %+v", n, s.Attributes)
		}
	}
	if s := byCheckpoint[2]; s.SpanContext.TraceID != traceID || s.Parent.SpanID != parentID {
		t.Errorf("checkpoint 2 span: trace %s parent %s, want the app's %s %s", s.SpanContext.TraceID, s.Parent.SpanID, traceID, parentID)
	}
	for _, child := range []string{"sync", "upload", "commit", "upload.object"} {
		if names[child] == 0 {
			t.Errorf("no %q span (spans seen: %v)", child, names)
		}
	}
}

func TestDrillRestoresVerifiesAndOpensTheNewestCheckpoint(t *testing.T) {
	storeParent, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	startAgent(t, "drilled", agentConfig{Socket: socket, StorageDir: storageDir, Job: "drill", LocalDir: localDir, AllowRoots: []string{storeParent}})
	storeDir := filepath.Join(storeParent, "store")
	w, err := workload.Open(storeDir, workload.Options{Seed: 7, StateBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var last client.Event
	for n := uint64(1); n <= 2; n++ {
		if _, err := w.Round(ctx); err != nil {
			t.Fatal(err)
		}
		p, err := pebble.Checkpoint(ctx, c, w.DB(), storeDir, "kv", n)
		if err != nil {
			t.Fatal(err)
		}
		if last, err = p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	scratch := t.TempDir()
	var res struct {
		Checkpoint          uint64  `json:"checkpoint"`
		Bytes               int64   `json:"bytes"`
		Files               int     `json:"files"`
		DurationMS          *int64  `json:"duration_ms"`
		ThroughputBytesPerS float64 `json:"throughput_bytes_per_s"`
		Verified            bool    `json:"verified"`
		EngineChecked       bool    `json:"engine_checked"`
		Keys                int64   `json:"keys"`
	}
	ckptJSON(t, &res, "drill", "--storage", "file://"+storageDir, "--job", "drill", "--task", "kv", "--scratch", scratch, "--json")
	if !res.Verified || res.Checkpoint != 2 || res.Bytes != last.FullSize || res.DurationMS == nil || res.ThroughputBytesPerS <= 0 {
		t.Fatalf("drill: %+v, want checkpoint 2 verified with %d bytes", res, last.FullSize)
	}
	if !res.EngineChecked || res.Keys == 0 {
		t.Fatalf("drill did not open the restored Pebble store: %+v", res)
	}
	if left := listTree(t, scratch); len(left) != 0 {
		t.Fatalf("drill left files in its scratch dir: %v", left)
	}
	// A corrupt object makes the drill fail, naming the file.
	m := readManifest(t, storageDir, "drill", "kv", 2)
	for _, f := range m.Files {
		if f.Kind == "shared" {
			p := filepath.Join(storageDir, f.Key)
			data := bytes.Clone(readAll(t, p))
			data[len(data)/2] ^= 1
			writeFile(t, p, data)
			res := runCkpt(t, "drill", "--storage", "file://"+storageDir, "--job", "drill", "--task", "kv", "--scratch", scratch, "--json")
			if res.Code != 1 || !strings.Contains(string(res.Stderr), f.Name) {
				t.Fatalf("drill over a corrupt object: exit %d, stderr %s", res.Code, res.Stderr)
			}
			break
		}
	}
}

func readAll(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
