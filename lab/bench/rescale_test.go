package bench

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// The rescale section alone, scaled down, on file:// storage: both
// scenarios measured and verified, every key of the state in each, and
// both figures of each in the targets. It asserts nothing about time.
func TestRescaleSectionMeasuresBothScenarios(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log bytes.Buffer
	rep, err := Run(ctx, Options{Quick: true, Only: []string{"rescale"}, RescaleBytes: 4 << 20, Storage: "file://" + t.TempDir(), Dir: t.TempDir(), Log: &log})
	if err != nil {
		t.Fatalf("bench: %v\nlog:\n%s", err, log.String())
	}
	if len(rep.Errors) > 0 {
		t.Fatalf("sections failed: %v\nlog:\n%s", rep.Errors, log.String())
	}
	rs := rep.Rescale
	if rs == nil || len(rs.Scenarios) != 2 || rs.PlainMS <= 0 || rs.PlainBytes <= 0 || !rs.Scaled {
		t.Fatalf("rescale figure: %+v", rs)
	}
	for i, sc := range rs.Scenarios {
		if want := []int{3, 6}[i]; sc.From != 4 || sc.To != want || !sc.Verified || sc.Keys <= 0 || sc.Bytes <= 0 || sc.BytesInRange <= 0 || sc.MS <= 0 || sc.TimeRatio <= 0 {
			t.Errorf("scenario %d: %+v, want 4->%d measured and verified", i, sc, want)
		}
		if sc.Keys != rs.Scenarios[0].Keys {
			t.Errorf("4->%d holds %d keys, 4->3 %d: the new tasks together must hold every key", sc.To, sc.Keys, rs.Scenarios[0].Keys)
		}
	}
	n := 0
	for _, tg := range rep.Targets {
		if tg.Measured && bytes.HasPrefix([]byte(tg.Name), []byte("rescale ")) {
			n++
		}
	}
	if n != 4 {
		t.Errorf("%d rescale targets measured, want 4: %+v", n, rep.Targets)
	}
}
