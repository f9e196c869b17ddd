package telemetry

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

func TestMetricsCarryBothSizesWithFlinksMeanings(t *testing.T) {
	tel, err := New(context.Background(), Options{Job: "orders", Storage: "file:///x", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	ctx := context.Background()
	tel.CheckpointStarted(ctx, "orders-3")
	tel.CheckpointEnded(ctx, CheckpointRecord{Task: "orders-3", Checkpoint: 7, Status: "completed",
		CheckpointSize: 4_297_628, FullSize: 14_780_068, FilesUploaded: 3, FilesReused: 10, BytesUploaded: 4_297_628,
		Sync: 2 * time.Millisecond, Async: 40 * time.Millisecond, Total: 42 * time.Millisecond})
	tel.CheckpointStarted(ctx, "orders-3")
	tel.CheckpointEnded(ctx, CheckpointRecord{Task: "orders-3", Checkpoint: 8, Status: "failed"})
	tel.GCEnded(ctx, 20_000_000, 5, 1000)
	tel.RestoreEnded(ctx, RestoreRecord{Task: "orders-3", BytesLocal: 100, BytesRemote: 50, Duration: time.Second, OK: true})
	tel.DrillEnded(ctx, DrillRecord{Task: "orders-3", Checkpoint: 7, Bytes: 14_780_068, Duration: 2 * time.Second, Throughput: 7_390_034, Verified: true, RPO: 1500 * time.Millisecond})
	tel.ReuseReplaced(ctx, "missing")
	tel.ScrubObject(ctx, "ok", 1000)
	tel.ScrubObject(ctx, "corrupt", 500)
	tel.ScrubObject(ctx, "healed", 0)

	code, body := get(t, tel.Handler(ServerOptions{}), "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`ckpt_checkpoint_last_size_bytes{ckpt_job="orders",task="orders-3"} 4.297628e+06`,
		`ckpt_checkpoint_last_full_size_bytes{ckpt_job="orders",task="orders-3"} 1.4780068e+07`,
		`ckpt_checkpoint_last_id{ckpt_job="orders",task="orders-3"} 7`,
		`ckpt_checkpoints_total{ckpt_job="orders",status="completed",task="orders-3"} 1`,
		`ckpt_checkpoints_total{ckpt_job="orders",status="failed",task="orders-3"} 1`,
		`ckpt_checkpoint_in_flight{ckpt_job="orders",task="orders-3"} 0`,
		`ckpt_checkpoint_files_reused_total{ckpt_job="orders",task="orders-3"} 10`,
		`ckpt_checkpoint_sync_duration_seconds_bucket{ckpt_job="orders",task="orders-3",le="0.0025"} 1`,
		`ckpt_storage_retained_bytes{ckpt_job="orders"} 2e+07`,
		`ckpt_state_logical_bytes{ckpt_job="orders"} 1.4780068e+07`,
		`ckpt_gc_deleted_objects_total{ckpt_job="orders"} 5`,
		`ckpt_reuse_replaced_total{ckpt_job="orders",reason="missing"} 1`,
		`ckpt_scrub_objects_total{ckpt_job="orders",result="ok"} 1`,
		`ckpt_scrub_objects_total{ckpt_job="orders",result="healed"} 1`,
		`ckpt_scrub_bytes_total{ckpt_job="orders"} 1500`,
		`ckpt_restore_bytes_total{ckpt_job="orders",source="local",task="orders-3"} 100`,
		`ckpt_drill_last_duration_seconds{ckpt_job="orders",task="orders-3"} 2`,
		`ckpt_drill_last_rpo_seconds{ckpt_job="orders",task="orders-3"} 1.5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
	v := tel.View()
	if len(v.Tasks) != 1 || len(v.Tasks[0].History) != 2 || v.Tasks[0].InFlight != 0 || v.Tasks[0].LastDrill == nil {
		t.Fatalf("view %+v", v)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	var tel *Telemetry // nil records nothing but still serves health
	notReady := errors.New("storage unreachable")
	ready := error(nil)
	page := func(w io.Writer, v View) error { _, err := io.WriteString(w, "page of "+v.Job); return err }
	h := tel.Handler(ServerOptions{Ready: func(context.Context) error { return ready }, Page: page})
	if code, _ := get(t, h, "/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, _ := get(t, h, "/readyz"); code != 200 {
		t.Fatalf("/readyz when ready: %d", code)
	}
	ready = notReady
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "storage unreachable") {
		t.Fatalf("/readyz when not ready: %d %q", code, body)
	}
	if code, _ := get(t, h, "/"); code != 200 {
		t.Fatalf("status page of a nil telemetry: %d", code)
	}
	if code, _ := get(t, tel.Handler(ServerOptions{}), "/"); code != 404 {
		t.Fatalf("status page without a renderer: %d, want 404", code)
	}
}

func TestATraceparentBecomesTheParent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(prev)

	const tp1 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := ContextWithTraceparent(context.Background(), tp1)
	_, span := Tracer().Start(ctx, "checkpoint")
	span.End()
	_, orphan := Tracer().Start(ContextWithTraceparent(context.Background(), "garbage"), "checkpoint")
	orphan.End()
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	if got := spans[0].SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("trace id %s, want the app's", got)
	}
	if got := spans[0].Parent().SpanID().String(); got != "00f067aa0ba902b7" {
		t.Fatalf("parent span %s, want the app's", got)
	}
	if spans[1].Parent().IsValid() {
		t.Fatal("an invalid traceparent produced a parent")
	}
}

func TestRequestsAreCountedByOpAndOutcome(t *testing.T) {
	var none *Telemetry
	none.RequestEnded(context.Background(), "hello", "ok") // nil records nothing
	tel, err := New(context.Background(), Options{Job: "orders", Storage: "file:///x", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	ctx := context.Background()
	tel.RequestEnded(ctx, "checkpoint", "ok")
	tel.RequestEnded(ctx, "checkpoint", "ok")
	tel.RequestEnded(ctx, "checkpoint", "bad_request")
	tel.RequestEnded(ctx, "connect", "forbidden")
	_, body := get(t, tel.Handler(ServerOptions{}), "/metrics")
	for _, want := range []string{
		`ckpt_requests_total{ckpt_job="orders",code="ok",op="checkpoint"} 2`,
		`ckpt_requests_total{ckpt_job="orders",code="bad_request",op="checkpoint"} 1`,
		`ckpt_requests_total{ckpt_job="orders",code="forbidden",op="connect"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
}

func TestForJobLabelsEveryTaskMetricWithItsJob(t *testing.T) {
	tel, err := New(context.Background(), Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	ctx := context.Background()
	orders, billing := tel.ForJob("orders", "file:///a"), tel.ForJob("billing", "file:///b")
	for _, j := range []*Telemetry{orders, billing} {
		j.CheckpointStarted(ctx, "t-0")
		j.CheckpointEnded(ctx, CheckpointRecord{Task: "t-0", Checkpoint: 3, Status: "completed", CheckpointSize: 10, FullSize: 20})
	}
	billing.Shutdown(ctx) // a job's telemetry stops nothing shared
	_, body := get(t, tel.Handler(ServerOptions{}), "/metrics")
	for _, want := range []string{
		`ckpt_checkpoint_last_id{ckpt_job="orders",task="t-0"} 3`,
		`ckpt_checkpoint_last_id{ckpt_job="billing",task="t-0"} 3`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if v := orders.View(); v.Job != "orders" || len(v.Tasks) != 1 {
		t.Errorf("orders view %+v", v)
	}
	if v := tel.View(); len(v.Tasks) != 2 || v.Tasks[0].Task != "billing/t-0" || v.Tasks[1].Task != "orders/t-0" || v.LogicalBytes != 40 {
		t.Errorf("the node's view of its jobs' tasks: %+v", v)
	}
}
