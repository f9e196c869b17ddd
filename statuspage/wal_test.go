package statuspage

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/telemetry"
)

// A task that ships its WAL shows its lag (the recovery point) and what
// was shipped; one whose WAL stopped at a gap says so.
func TestStatusPageShowsTheWALLagOfEachTask(t *testing.T) {
	now := time.Now()
	v := telemetry.View{Job: "orders", Now: now, Tasks: []telemetry.TaskView{
		{Task: "orders-0", WAL: &telemetry.WALRecord{Checkpoint: 7, Seq: 12, Through: now.Add(-1500 * time.Millisecond),
			Bytes: 3 << 20, Segments: 14, At: now}},
		{Task: "orders-1", WAL: &telemetry.WALRecord{Checkpoint: 3, Seq: 2, Through: now.Add(-40 * time.Second),
			Gaps: 1, Ended: "log 000012.log went away", At: now}},
		{Task: "orders-2"},
	}}
	var b bytes.Buffer
	if err := Render(&b, v); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{
		`<span class="value wal-lag" data-ns="1500000000">1.50 s</span>`,
		"WAL of checkpoint 7: 12 commits, 14 segments, 3.00 MiB",
		`<span class="value wal-lag bad" data-ns="40000000000">`,
		"stopped until the next checkpoint: log 000012.log went away",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if got := strings.Count(page, "WAL lag (RPO)"); got != 2 {
		t.Errorf("%d tasks show a WAL lag; two ship their WAL", got)
	}
}
