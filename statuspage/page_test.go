package statuspage

import (
	"bytes"
	"encoding/xml"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/telemetry"
)

var pageOut = flag.String("page.out", "", "write the sample status page of TestStatusPage to this file (to look at it in a browser)")

const (
	kib = 1 << 10
	mib = 1 << 20
)

// sawtooth is the history of an LSM store under steady writes: every
// checkpoint uploads the newly flushed SSTs, so the full size climbs; every
// sixth one follows a compaction, which rewrites the state into fewer, new
// files: a large checkpoint size while the full size drops. One checkpoint
// failed and one was aborted.
func sawtooth(n int, flush, base int64, start time.Time) []telemetry.CheckpointRecord {
	var h []telemetry.CheckpointRecord
	full := base
	for i := 1; i <= n; i++ {
		r := telemetry.CheckpointRecord{Task: "t", Checkpoint: uint64(i), Status: "completed", At: start.Add(time.Duration(i) * time.Minute),
			Sync: time.Duration(20+i) * time.Millisecond, Async: time.Duration(800+10*i) * time.Millisecond}
		r.Total = r.Sync + r.Async
		switch {
		case i == 9:
			r.Status = "failed"
		case i == 16:
			r.Status = "aborted"
		case i%6 == 0:
			full = base + flush
			r.CheckpointSize, r.FullSize = full, full
			r.FilesUploaded, r.FilesReused = 5, 0
		default:
			full += flush
			r.CheckpointSize, r.FullSize = flush+37*kib, full
			r.FilesUploaded, r.FilesReused = 3, i%6+2
		}
		r.BytesUploaded = r.CheckpointSize
		h = append(h, r)
	}
	return h
}

func sampleView() telemetry.View {
	now := time.Date(2025, 5, 1, 12, 30, 0, 0, time.UTC)
	start := now.Add(-30 * time.Minute)
	tasks := []telemetry.TaskView{
		{Task: "orders-0", History: sawtooth(24, 8*mib, 40*mib, start), InFlight: 1,
			LastDrill: &telemetry.DrillRecord{Task: "orders-0", Checkpoint: 23, Bytes: 88 * mib, Files: 14,
				Duration: 1700 * time.Millisecond, Throughput: 88 * mib / 1.7, Verified: true, At: now.Add(-90 * time.Second), RPO: 2100 * time.Millisecond}},
		{Task: "orders-1", History: sawtooth(7, 3*mib, 1200*mib, start),
			Standby: &telemetry.StandbyRecord{Task: "orders-1", Held: 6, Newest: 7, Lag: 4 * time.Second, BytesRemote: 3 * mib,
				Failover: 90 * time.Millisecond, FailoverBytes: 1200 * mib, At: now.Add(-5 * time.Second)}},
		{Task: "orders-2", History: sawtooth(3, 300*kib, 2*mib, start),
			LastDrill: &telemetry.DrillRecord{Task: "orders-2", Checkpoint: 2, Error: "object gone", At: now.Add(-time.Minute)}},
	}
	for i := range tasks {
		for j := range tasks[i].History {
			tasks[i].History[j].Task = tasks[i].Task
		}
	}
	v := telemetry.View{Job: "orders", Storage: "s3://ckpt-bucket/prod", Version: "v0.3.1", Tasks: tasks,
		RetainedBytes: 1900 * mib, GCDeleted: 212, Now: now}
	for _, tv := range tasks {
		for i := len(tv.History) - 1; i >= 0; i-- {
			if tv.History[i].Status == "completed" {
				v.LogicalBytes += tv.History[i].FullSize
				break
			}
		}
	}
	return v
}

func render(t *testing.T, v telemetry.View) string {
	t.Helper()
	var b bytes.Buffer
	if err := Render(&b, v); err != nil {
		t.Fatalf("RenderStatus: %v", err)
	}
	return b.String()
}

var svgChart = regexp.MustCompile(`(?s)<svg class="chart" data-task="([^"]*)".*?</svg>`)

// charts returns each task's chart SVG by task name.
func charts(page string) map[string]string {
	out := map[string]string{}
	for _, m := range svgChart.FindAllStringSubmatch(page, -1) {
		out[m[1]] = m[0]
	}
	return out
}

func lastCompleted(h []telemetry.CheckpointRecord) telemetry.CheckpointRecord {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Status == "completed" {
			return h[i]
		}
	}
	return telemetry.CheckpointRecord{}
}

func TestStatusPage(t *testing.T) {
	v := sampleView()
	page := render(t, v)
	if *pageOut != "" {
		if err := os.WriteFile(*pageOut, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cs := charts(page)
	if len(cs) != len(v.Tasks) {
		t.Fatalf("page has charts for %d tasks, want %d", len(cs), len(v.Tasks))
	}
	for _, tv := range v.Tasks {
		t.Run(tv.Task, func(t *testing.T) {
			svg, ok := cs[tv.Task]
			if !ok {
				t.Fatalf("no chart for task %s", tv.Task)
			}
			// The chart is well-formed XML (so it is valid inline SVG).
			var anyXML struct{}
			if err := xml.Unmarshal([]byte(svg), &anyXML); err != nil {
				t.Errorf("chart of %s is not well-formed: %v", tv.Task, err)
			}
			var completed, bad int
			for _, r := range tv.History {
				if r.Status == "completed" {
					completed++
					bar := fmt.Sprintf(`<rect class="bar" data-checkpoint="%d" data-bytes="%d"`, r.Checkpoint, r.CheckpointSize)
					if !strings.Contains(svg, bar) {
						t.Errorf("no bar for checkpoint %d (%s)", r.Checkpoint, bar)
					}
				} else {
					bad++
				}
			}
			if got := strings.Count(svg, `<rect class="bar"`); got != completed {
				t.Errorf("chart has %d bars, want one per completed checkpoint (%d)", got, completed)
			}
			if got := strings.Count(svg, `<circle class="full-dot"`); got != completed {
				t.Errorf("chart has %d full-size points, want %d", got, completed)
			}
			if got := strings.Count(svg, `class="mark mark-`); got != bad {
				t.Errorf("chart has %d failed/aborted marks, want %d", got, bad)
			}
			if got := strings.Count(svg, `<title>`); got < 2*len(tv.History) {
				t.Errorf("chart has %d title elements, want hover titles for every checkpoint", got)
			}
			for _, want := range []string{"checkpoint size", "full size", `class="full-line"`, `class="y-label"`} {
				if !strings.Contains(svg, want) {
					t.Errorf("chart lacks %q", want)
				}
			}
			if !regexp.MustCompile(`class="y-label"[^>]*>\d+(\.\d+)? (KiB|MiB|GiB)<`).MatchString(svg) {
				t.Errorf("y axis is not labelled in binary units:\n%s", svg)
			}

			last := lastCompleted(tv.History)
			for _, want := range []string{
				fmt.Sprintf(`<span class="value last-checkpoint-size" data-bytes="%d">%s</span>`, last.CheckpointSize, human.Bytes(last.CheckpointSize)),
				fmt.Sprintf(`<span class="value last-full-size" data-bytes="%d">%s</span>`, last.FullSize, human.Bytes(last.FullSize)),
				fmt.Sprintf(`<span class="value files-uploaded">%d</span>`, last.FilesUploaded),
				fmt.Sprintf(`<span class="value files-reused">%d</span>`, last.FilesReused),
				fmt.Sprintf(`data-ns="%d">%s</span>`, last.Sync.Nanoseconds(), human.Duration(last.Sync)),
				fmt.Sprintf(`data-ns="%d">%s</span>`, last.Async.Nanoseconds(), human.Duration(last.Async)),
				fmt.Sprintf(`<span class="value total-duration" data-ns="%d">%s</span>`, last.Total.Nanoseconds(), human.Duration(last.Total)),
				fmt.Sprintf(`<span class="value in-flight">%d</span>`, tv.InFlight),
			} {
				if !strings.Contains(page, want) {
					t.Errorf("page lacks %s", want)
				}
			}
		})
	}

	for _, want := range []string{
		// Task orders-0: a verified drill, beside its last checkpoint's duration.
		`<span class="value drill-duration" data-ns="1700000000">1.70 s</span>`,
		`<span class="value drill-throughput" data-bytes-per-second="54279228">51.8 MiB/s</span>`,
		// Its recovery point beside the restore time.
		`recovery point <span class="value drill-rpo" data-ns="2100000000">2.10 s</span>`,
		"88.0 MiB of checkpoint 23, verified",
		// Task orders-1: no drill, a warm standby one checkpoint behind.
		"no drill yet",
		`holds checkpoint <span class="value standby-held">6</span> of 7 · lag <span class="value standby-lag" data-ns="4000000000">4.00 s</span>`,
		`measured <span class="value standby-failover" data-ns="90000000">`,
		// Task orders-2: a failed drill says why.
		"object gone",
		// Failed and aborted counts over the history window (24 records).
		`<span class="value failed-count bad">1</span> · <span class="value aborted-count bad">1</span> <span class="sub">of the last 24</span>`,
		`<span class="pill busy">1 in flight</span>`,
		// The job's storage against its state.
		`<span id="retained-bytes" data-bytes="1992294400">1.86 GiB</span>`,
		fmt.Sprintf(`<span id="logical-bytes" data-bytes="%d">%s</span>`, v.LogicalBytes, human.Bytes(v.LogicalBytes)),
		`<rect class="retained-bar"`, `<rect class="logical-bar"`,
		`<meta http-equiv="refresh" content="10">`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if got := strings.Count(page, "no drill yet"); got != 1 {
		t.Errorf(`"no drill yet" appears %d times, want once (orders-1 only)`, got)
	}
	requireSelfContained(t, page)
}

func TestStatusPageShowsTheSawtooth(t *testing.T) {
	// The compaction checkpoints (6, 12, 18, 24) have the tallest bars,
	// and the full-size line drops at each of them.
	h := sawtooth(24, 8*mib, 40*mib, time.Now())
	c := newChart(h)
	heights := map[uint64]float64{}
	for _, b := range c.Bars {
		heights[b.Checkpoint] = b.H
	}
	for _, n := range []uint64{6, 12, 18, 24} {
		if heights[n] <= 2*heights[n-1] {
			t.Errorf("compaction checkpoint %d has a bar %.1f high, not clearly above checkpoint %d's %.1f", n, heights[n], n-1, heights[n-1])
		}
	}
	var prevY float64
	for i, d := range c.Dots {
		// SVG y grows downwards: a smaller full size has a larger y.
		if i > 0 && c.Bars[i].Checkpoint%6 == 0 && d.Y <= prevY {
			t.Errorf("full-size line does not drop at compaction checkpoint %d", c.Bars[i].Checkpoint)
		}
		prevY = d.Y
	}
	for _, b := range c.Bars {
		if b.Y < c.Top || b.Y+b.H > c.Bottom+0.05 || b.X < c.Left || b.X+b.W > c.Right+0.05 {
			t.Errorf("bar of checkpoint %d (%+v) leaves the plot area", b.Checkpoint, b)
		}
	}
}

func TestEmptyViewRenders(t *testing.T) {
	for name, v := range map[string]telemetry.View{
		"zero view":            {},
		"task without history": {Job: "j", Tasks: []telemetry.TaskView{{Task: "fresh", InFlight: 1}}},
		"only failures": {Job: "j", Tasks: []telemetry.TaskView{{Task: "down", History: []telemetry.CheckpointRecord{
			{Task: "down", Checkpoint: 1, Status: "failed", Total: time.Second},
			{Task: "down", Checkpoint: 2, Status: "aborted"}}}}},
	} {
		t.Run(name, func(t *testing.T) {
			page := render(t, v)
			if !strings.Contains(page, "</html>") {
				t.Fatalf("page is cut short:\n%s", page)
			}
			requireSelfContained(t, page)
			switch name {
			case "zero view":
				if !strings.Contains(page, "no task has checkpointed yet") || strings.Contains(page, `class="chart"`) {
					t.Errorf("empty view should say no task has checkpointed and draw no chart:\n%s", page)
				}
			case "task without history":
				if !strings.Contains(page, "no checkpoints yet") || !strings.Contains(page, "none completed") {
					t.Errorf("a task without history should say so:\n%s", page)
				}
			case "only failures":
				svg := charts(page)["down"]
				if strings.Count(svg, `class="mark mark-`) != 2 || strings.Contains(svg, `class="bar"`) {
					t.Errorf("a history of failures draws two marks and no bars:\n%s", svg)
				}
				if !strings.Contains(page, "last checkpoint aborted") {
					t.Errorf("page does not say the last checkpoint was aborted")
				}
			}
		})
	}
}

func TestStatusPageEscapes(t *testing.T) {
	const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>'"&`
	v := sampleView()
	v.Storage = hostile
	v.Job = hostile
	v.Version = `"><svg onload=alert(1)>`
	v.Tasks[0].Task = `a"><script>b</script>`
	v.Tasks[0].LastDrill.Error = hostile
	v.Tasks[0].LastDrill.Verified = false
	page := render(t, v)
	requireSelfContained(t, page)
	for _, bad := range []string{"<img", "<svg onload", `data-task="a"`} {
		if strings.Contains(page, bad) {
			t.Errorf("page holds unescaped %q", bad)
		}
	}
	if !strings.Contains(page, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
		t.Errorf("hostile storage is not shown escaped")
	}
}

// requireSelfContained fails if the page runs script or refers to anything
// outside itself.
func requireSelfContained(t *testing.T, page string) {
	t.Helper()
	lower := strings.ToLower(page)
	for _, bad := range []string{"<script", "http://", "https://", "//", "url(", "@import", "javascript:"} {
		if bad == "//" {
			// Protocol-relative references: src="//host" or href="//host".
			if regexp.MustCompile(`(src|href)\s*=\s*["']?//`).MatchString(lower) {
				t.Errorf("page refers to a protocol-relative URL")
			}
			continue
		}
		if strings.Contains(lower, bad) {
			t.Errorf("page is not self-contained: it holds %q", bad)
		}
	}
}

func TestByteTicksAreRoundAndCoverTheData(t *testing.T) {
	for _, top := range []int64{0, 1, 700, 5000, 3 * mib, 95 * mib, 1200 * mib, 7 << 40} {
		ticks, axisMax := byteTicks(top)
		if len(ticks) < 2 || len(ticks) > 7 {
			t.Errorf("top %d: %d ticks, want 2 to 7", top, len(ticks))
		}
		if ticks[0].value != 0 || axisMax < float64(top) {
			t.Errorf("top %d: axis runs from %v to %v, want 0 to at least the data", top, ticks[0].value, axisMax)
		}
		for _, tk := range ticks {
			if !regexp.MustCompile(`^(0|\d+(\.\d)? (B|KiB|MiB|GiB|TiB))$`).MatchString(tk.label) {
				t.Errorf("top %d: tick label %q is not a round binary size", top, tk.label)
			}
		}
	}
}
