package agent

import (
	"fmt"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ckpt-io/ckpt/client"
)

// An incremental checkpoint reads only its new files: the unchanged ones
// are known from the previous checkpoint's local copy (same name, same
// inode, size and mtime), their objects reused from its manifest. With
// and without handoff, and for three checkpoints in a row, so that the
// knowledge passes from each checkpoint to the next.
func TestAnIncrementalCheckpointHashesOnlyItsNewFiles(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	old := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(old) })
	hashed := func() int64 { // bytes hashed by the last checkpoint
		spans := rec.Ended()
		for i := len(spans) - 1; i >= 0; i-- {
			if spans[i].Name() == "upload" {
				for _, kv := range spans[i].Attributes() {
					if kv.Key == attribute.Key("ckpt.bytes_hashed") {
						return kv.Value.AsInt64()
					}
				}
			}
		}
		t.Fatal("no upload span")
		return 0
	}
	for _, handoff := range []bool{false, true} {
		t.Run(fmt.Sprintf("handoff=%v", handoff), func(t *testing.T) {
			h := start(t, nil, nil)
			c := h.dial()
			h.snapshot("db", map[string]int{"000001.sst": 300_000, "000002.sst": 70_000})
			send := func(n uint64, dir string) {
				t.Helper()
				p, err := c.Send(ctxT(t), client.Request{Task: "t", Checkpoint: n, Dir: dir, Handoff: handoff})
				if err == nil {
					_, err = p.Wait(ctxT(t))
				}
				if err != nil {
					t.Fatalf("checkpoint %d: %v", n, err)
				}
			}
			send(1, h.linkSnapshot(h.root+"/db", "s1", map[string]int{"CURRENT": 16}))
			if got := hashed(); got != 370_000 {
				t.Fatalf("first checkpoint hashed %d bytes, want 370000", got)
			}
			for n, add := range []int{50_000, 20_000} {
				name := fmt.Sprintf("%06d.sst", n+3)
				h.snapshot("db", map[string]int{name: add})
				send(uint64(n+2), h.linkSnapshot(h.root+"/db", fmt.Sprint("s", n+2), map[string]int{"CURRENT": 16}))
				if got := hashed(); got != int64(add) {
					t.Fatalf("checkpoint %d hashed %d bytes, want %d (%s only)", n+2, got, add, name)
				}
				m := h.sharedKeys("t", uint64(n+2))
				if len(m) != n+3 {
					t.Fatalf("checkpoint %d names %d shared objects, want %d", n+2, len(m), n+3)
				}
			}
			if p := h.verify("t", 3); len(p) != 0 {
				t.Fatalf("verify: %+v", p)
			}
		})
	}
}
