package agent

import (
	"context"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
)

// A follow request adds a task to the warm standbys and starts a refresh
// at once; a task this agent serves is not followed; an agent with no
// standby service says so.
func TestAFollowRequestStartsAWarmStandby(t *testing.T) {
	refreshed := make(chan string, 16)
	h := start(t, nil, func(c *Config) {
		c.StandbyInterval = time.Hour // only the request can start a pass soon
		c.Standby = func(ctx context.Context, task string) (*restore.RefreshResult, error) {
			refreshed <- task
			return &restore.RefreshResult{}, nil
		}
	})
	r := h.raw()
	if ev := r.send(`{"op":"follow","task":"orders-7","id":1}`); ev["event"] != "following" || ev["task"] != "orders-7" {
		t.Fatalf("follow: %v", ev)
	}
	select {
	case task := <-refreshed:
		if task != "orders-7" {
			t.Fatalf("refreshed %s, want orders-7", task)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no refresh of the followed task")
	}
	if ev := r.send(`{"op":"follow"}`); code(ev) != protocol.CodeBadRequest {
		t.Fatalf("follow without a task: %v", ev)
	}

	c := h.dial()
	dir := h.snapshot("s", map[string]int{"000001.sst": 100, "CURRENT": 10})
	p, err := c.Checkpoint(ctxT(t), "mine", 1, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if ev := r.send(`{"op":"follow","task":"mine"}`); code(ev) != protocol.CodeConflict {
		t.Fatalf("follow a task this agent serves: %v", ev)
	}
}

func TestFollowWithoutAStandbyServiceIsUnavailable(t *testing.T) {
	h := start(t, nil, nil)
	if ev := h.raw().send(`{"op":"follow","task":"orders-7"}`); code(ev) != protocol.CodeUnavailable {
		t.Fatalf("follow with no standby service: %v", ev)
	}
}
