package metered

import (
	"bytes"
	"context"
	"io"
	"testing"

	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.Store {
		s, err := file.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return New(s, "file")
	}, storagetest.Options{LargeSize: 4 << 20})
}

func TestCallsAndBytesAreCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	defer otel.SetMeterProvider(prev)

	inner, _ := file.New(t.TempDir())
	s := New(inner, "file")
	ctx := context.Background()
	s.Put(ctx, "a/b", bytes.NewReader(make([]byte, 1000)), 1000)
	rc, err := s.Get(ctx, "a/b")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, rc)
	rc.Close()
	s.Stat(ctx, "missing")

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					key := m.Name
					for _, kv := range dp.Attributes.ToSlice() {
						if kv.Key != "backend" {
							key += "," + string(kv.Key) + "=" + kv.Value.AsString()
						}
					}
					got[key] += dp.Value
				}
			}
		}
	}
	for key, want := range map[string]int64{
		"ckpt.storage.requests,op=put,outcome=ok":         1,
		"ckpt.storage.requests,op=get,outcome=ok":         1,
		"ckpt.storage.requests,op=stat,outcome=not_found": 1,
		"ckpt.storage.transferred,direction=up":           1000,
		"ckpt.storage.transferred,direction=down":         1000,
	} {
		if got[key] != want {
			t.Errorf("%s = %d, want %d (all: %v)", key, got[key], want, got)
		}
	}
}
