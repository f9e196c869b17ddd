package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/telemetry"
)

// logSink collects an agent's JSON log lines while it writes them.
type logSink struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *logSink) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(s, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records returns the log records whose msg is msg.
func (s *logSink) records(msg string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(s.b.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// requirePeer checks that a log record names this process as the peer.
func requirePeer(t *testing.T, rec map[string]any) {
	t.Helper()
	if rec["peer_uid"] != float64(os.Getuid()) || rec["peer_gid"] != float64(os.Getgid()) || rec["peer_pid"] != float64(os.Getpid()) {
		t.Errorf("log record %v: peer_uid/peer_gid/peer_pid are not %d/%d/%d", rec, os.Getuid(), os.Getgid(), os.Getpid())
	}
}

// TestRefusedRequestsAreLoggedAndCounted: every request is counted by op
// and outcome in ckpt_requests_total, and every refused one is logged at
// warn with its op, code, task, message and the peer's credentials.
func TestRefusedRequestsAreLoggedAndCounted(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{Job: "job", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	logs := &logSink{}
	h := start(t, nil, func(c *Config) { c.Telemetry, c.Logger = tel, logs.logger() })
	r := h.raw()
	dir := h.snapshot("s", map[string]int{"000001.sst": 1000, "CURRENT": 10})

	if ev := r.send(`{"op":"checkpoint","task":"t","checkpoint":5,"dir":"` + dir + `"}`); ev["event"] != "synced" {
		t.Fatalf("checkpoint 5: %v", ev)
	}
	if ev := r.next(); ev["event"] != "completed" {
		t.Fatalf("checkpoint 5: %v", ev)
	}
	r.send(`{"op":"hello"}`)
	r.send(`{"op":"status"}`)
	type refusal struct{ op, task, line string }
	refusals := []refusal{
		{"invalid", "", `garbage`},
		{"invalid", "", `{"op":"explode"}`},
		{"checkpoint", "../x", `{"op":"checkpoint","task":"../x","checkpoint":1,"dir":"` + dir + `"}`},
		{"checkpoint", "t", `{"op":"checkpoint","task":"t","checkpoint":6,"dir":"/etc"}`},
		{"checkpoint", "t", `{"op":"checkpoint","task":"t","checkpoint":3,"dir":"` + dir + `"}`},
		{"abort", "t", `{"op":"abort","task":"t","checkpoint":99}`},
		{"restore", "t", `{"op":"restore","task":"t","target":"` + filepath.Join(h.root, "r") + `"}`},
	}
	want := map[[2]string]int{{"checkpoint", "ok"}: 1, {"hello", "ok"}: 1, {"status", "ok"}: 1}
	for _, rf := range refusals {
		ev := r.send(rf.line)
		c := code(ev)
		if c == "" {
			t.Fatalf("%s: reply %v, want an error", rf.line, ev)
		}
		want[[2]string{rf.op, c}]++
	}

	// Log lines: one per refusal, in order, with the code the peer got.
	recs := logs.records("request refused")
	if len(recs) != len(refusals) {
		t.Fatalf("%d requests refused, %d logged as refused:\n%s", len(refusals), len(recs), logs)
	}
	for i, rec := range recs {
		if rec["level"] != "WARN" || rec["op"] != refusals[i].op || rec["task"] != refusals[i].task ||
			rec["code"] == "" || rec["code"] == nil || rec["message"] == "" || rec["message"] == nil {
			t.Errorf("refusal of %s logged as %v", refusals[i].line, rec)
		}
		requirePeer(t, rec)
	}
	// The checkpoint's own log line names its peer too.
	done := logs.records("checkpoint completed")
	if len(done) != 1 {
		t.Fatalf("checkpoint completed logged %d times:\n%s", len(done), logs)
	}
	requirePeer(t, done[0])

	rec := httptest.NewRecorder()
	tel.Handler(telemetry.ServerOptions{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for k, n := range want {
		line := fmt.Sprintf(`ckpt_requests_total{ckpt_job="job",code=%q,op=%q} %d`, k[1], k[0], n)
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// TestAnAgentNeedsAnAbsoluteAllowRoot: a peer of the socket may name any
// path, so the agent does not start without roots to confine them to; "/"
// is allowed, explicitly, with a warning.
func TestAnAgentNeedsAnAbsoluteAllowRoot(t *testing.T) {
	store, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	cfg := func(roots ...string) Config {
		return Config{Socket: filepath.Join(base, "s.sock"), Store: store, Job: "job", LocalDir: filepath.Join(base, "local"), AllowRoots: roots}
	}
	if _, err := New(cfg()); err == nil || !strings.Contains(err.Error(), "allowed root") {
		t.Errorf("no allow root: %v, want an error", err)
	}
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, base)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg(rel)); err == nil || !strings.Contains(err.Error(), "relative") {
		t.Errorf("relative allow root %s: %v, want an error", rel, err)
	}
	logs := &logSink{}
	c := cfg("/")
	c.Logger = logs.logger()
	if _, err := New(c); err != nil {
		t.Fatalf("allow root /: %v", err)
	}
	if !strings.Contains(logs.String(), `"level":"WARN"`) || !strings.Contains(logs.String(), "allow root /") {
		t.Errorf("allow root / logged no warning:\n%s", logs)
	}
}
