package agent

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/telemetry"
)

// A checkpoint whose upload hangs (a storage call that never answers, until
// its context ends) fails with unavailable once its timeout passes, naming
// the step it was in; it commits nothing, and the checkpoint queued behind
// it starts at once and completes. The request's timeout_ms lowers the
// agent's bound; the metric counts the checkpoint as a timeout.
func TestACheckpointPastItsTimeoutFailsAndTheNextStarts(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{Job: "job", Storage: "file:///x", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	var g *gate
	h := start(t, func(s storage.Store) storage.Store { g = newGate(s); return g }, func(c *Config) { c.Telemetry = tel })
	c := h.dial()

	dir1 := h.snapshot("s1", map[string]int{"000001.sst": 1000, "CURRENT": 10})
	began := time.Now()
	p1, err := c.Send(ctxT(t), client.Request{Task: "t1", Checkpoint: 1, Dir: dir1, TimeoutMS: 300})
	if err != nil {
		t.Fatal(err)
	}
	dir2 := h.snapshot("s2", map[string]int{"000001.sst": 1000, "000002.sst": 1000, "CURRENT": 10})
	p2, err := c.Checkpoint(ctxT(t), "t1", 2, dir2, "")
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered // checkpoint 1 is stuck in a Put
	_, err = p1.Wait(ctxT(t))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != protocol.CodeUnavailable {
		t.Fatalf("checkpoint past its timeout: %v, want unavailable", err)
	}
	if !strings.Contains(ce.Message, "timed out") || !strings.Contains(ce.Message, "uploading") {
		t.Fatalf("message %q does not say it timed out while uploading", ce.Message)
	}
	if d := time.Since(began); d < 300*time.Millisecond {
		t.Fatalf("failed after %v, before its timeout", d)
	}
	if _, err := h.store.Stat(ctxT(t), manifests.ManifestKey("job", "t1", 1)); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("timed-out checkpoint has a manifest: %v", err)
	}
	// The next one is under way at once: it reaches the same stuck Put.
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the checkpoint queued behind the timed-out one did not start")
	}
	g.release()
	ev, err := p2.Wait(ctxT(t))
	if err != nil || ev.Checkpoint != 2 {
		t.Fatalf("next checkpoint: %+v, %v", ev, err)
	}
	rec := httptest.NewRecorder()
	tel.Handler(telemetry.ServerOptions{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`ckpt_checkpoints_total{ckpt_job="job",status="timeout",task="t1"} 1`,
		`ckpt_checkpoints_total{ckpt_job="job",status="completed",task="t1"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The agent's own bound applies to requests that give none, and a request
// cannot raise it.
func TestTheAgentsCheckpointTimeoutBoundsEveryRequest(t *testing.T) {
	var g *gate
	h := start(t, func(s storage.Store) storage.Store { g = newGate(s); return g },
		func(c *Config) { c.CheckpointTimeout = 300 * time.Millisecond })
	c := h.dial()
	dir := h.snapshot("s1", map[string]int{"000001.sst": 1000, "CURRENT": 10})
	p, err := c.Send(ctxT(t), client.Request{Task: "t1", Checkpoint: 1, Dir: dir, TimeoutMS: 3_600_000})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := p.Wait(ctxT(t)); done <- err }()
	select {
	case err := <-done:
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != protocol.CodeUnavailable || !strings.Contains(ce.Message, "timed out") {
			t.Fatalf("checkpoint past the agent's timeout: %v", err)
		}
	case <-time.After(20 * time.Second):
		g.release()
		t.Fatal("a request's timeout_ms raised the agent's --checkpoint-timeout")
	}
	g.release()
}
