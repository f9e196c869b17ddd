package telemetry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// The health metrics: storage up and down, a task blocked with its reason
// and unblocked by a completed checkpoint, the last success's timestamp,
// GC runs by status; the job label is ckpt_job, never Prometheus's job;
// OTEL_SERVICE_NAME names the service.
func TestHealthMetricsAndLabels(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "orders-ckpt")
	tel, err := New(context.Background(), Options{Job: "orders", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	ctx := context.Background()
	h := tel.Handler(ServerOptions{Storage: func(context.Context) error { return errors.New("bucket refused") }})
	metrics := func() string { _, b := get(t, h, "/metrics"); return b }

	tel.StorageChecked(ctx, errors.New("connection refused"))
	tel.TaskBlocked(ctx, "t-0", "fenced", "taken over by node-2")
	tel.GCRun(ctx, "failed")
	body := metrics()
	for _, want := range []string{`ckpt_storage_up{ckpt_job="orders"} 0`, `ckpt_checkpoint_blocked{ckpt_job="orders",reason="fenced",task="t-0"} 1`,
		`ckpt_gc_runs_total{ckpt_job="orders",status="failed"} 1`, `service_name="orders-ckpt"`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `{job=`) || strings.Contains(body, `,job=`) {
		t.Errorf("a metric carries the label job, which Prometheus owns")
	}
	if v := tel.View(); v.StorageHealth == nil || v.StorageHealth.Up || v.Tasks[0].Blocked == nil || v.Tasks[0].Blocked.Reason != "fenced" {
		t.Errorf("view: storage %+v, tasks %+v", v.StorageHealth, v.Tasks)
	}
	if code, b := get(t, h, "/healthz/storage"); code != 503 || !strings.Contains(b, "bucket refused") {
		t.Errorf("/healthz/storage = %d %q, want 503 with the error", code, b)
	}

	at := time.Unix(1_800_000_000, 0)
	tel.CheckpointStarted(ctx, "t-0")
	tel.CheckpointEnded(ctx, CheckpointRecord{Task: "t-0", Checkpoint: 1, Status: "completed", At: at})
	tel.TaskUnblocked(ctx, "t-0")
	tel.StorageChecked(ctx, nil)
	tel.GCRun(ctx, "ok")
	body = metrics()
	for _, want := range []string{`ckpt_storage_up{ckpt_job="orders"} 1`, `ckpt_checkpoint_blocked{ckpt_job="orders",reason="fenced",task="t-0"} 0`,
		`ckpt_checkpoint_last_success_timestamp_seconds{ckpt_job="orders",task="t-0"} 1.8e+09`, `ckpt_gc_runs_total{ckpt_job="orders",status="ok"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
}
