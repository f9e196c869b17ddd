package agent

import (
	"context"
	"net/http/httptest"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/telemetry"
)

// TestAScheduledSampleDrillSaysItWasASample: with a drill that verifies a
// sample (--drill-sample-bytes), the agent's drill log line and its
// ckpt_drill_last_sample_ratio gauge say the drill was a sample, and the drill
// wrote nothing to its scratch dir.
func TestAScheduledSampleDrillSaysItWasASample(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{Job: "job", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	logs := &logSink{}
	scratch := t.TempDir()
	var h *harness
	h = start(t, nil, func(c *Config) {
		c.Telemetry, c.Logger, c.GCInterval = tel, logs.logger(), -1
		c.DrillInterval = 20 * time.Millisecond
		c.Drill = func(ctx context.Context, task string) (*restore.DrillResult, error) {
			return restore.Drill(ctx, restore.DrillOptions{Store: h.store, Job: "job", Task: task, ScratchDir: scratch, SampleBytes: 1, SampleSeed: 3})
		}
	})
	r := h.raw()
	dir := h.snapshot("s", map[string]int{"000001.sst": 100_000, "000002.sst": 50_000, "CURRENT": 10})
	if ev := r.send(`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"` + dir + `"}`); ev["event"] != "synced" {
		t.Fatalf("checkpoint: %v", ev)
	}
	if ev := r.next(); ev["event"] != "completed" {
		t.Fatalf("checkpoint: %v", ev)
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(logs.records("restore drill of a sample")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no sample drill logged in 20s:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rec := logs.records("restore drill of a sample")[0]
	if rec["sample"] != true || rec["sample_files"] != 1.0 || rec["verified"] != true || rec["seed"] != 3.0 || rec["files"] != 3.0 {
		t.Fatalf("sample drill logged as %v", rec)
	}
	if len(logs.records("restore drill")) != 0 {
		t.Fatalf("a sample drill was logged as a whole restore drill:\n%s", logs)
	}
	w := httptest.NewRecorder()
	tel.Handler(telemetry.ServerOptions{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if !regexp.MustCompile(`(?m)^ckpt_drill_last_sample_ratio\{[^}]*task="t"[^}]*\} 1$`).MatchString(w.Body.String()) {
		t.Fatalf("/metrics lacks ckpt_drill_last_sample_ratio 1 for task t:\n%s", w.Body)
	}
	if entries, _ := os.ReadDir(scratch); len(entries) != 0 {
		t.Fatalf("a sample drill wrote %v to the scratch dir", entries)
	}
}
