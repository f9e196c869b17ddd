package statuspage

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/telemetry"
)

// fleetJobView is a job of four tasks on three nodes after a takeover:
// checkpoint 11 is the newest job-complete one, orders-1 lags (its newest
// is 12 while the job reached 16), orders-3 joined after checkpoint 11
// (not listed in it), and orders-4 owns nothing yet but an ownership record.
func fleetJobView(now time.Time) *telemetry.JobView {
	return &telemetry.JobView{ScannedAt: now.Add(-4 * time.Second), Complete: 11, CompleteTasks: []string{"orders-0", "orders-1", "orders-2"}, Newest: 16,
		Tasks: []telemetry.JobTask{
			{Task: "orders-0", Newest: 16, Node: "node-4", Epoch: 3},
			{Task: "orders-1", Newest: 12, Lag: 4, Node: "node-4", Epoch: 3},
			{Task: "orders-2", Newest: 16, Node: "node-2", Epoch: 1},
			{Task: "orders-3", Newest: 16, Behind: true, Reason: "job-complete checkpoint 11 does not list it", Node: "node-3", Epoch: 1},
			{Task: "orders-4", Lag: 16, Behind: true, Reason: "no complete checkpoint; job-complete checkpoint 11 does not list it", Node: "node-5", Epoch: 1},
		}}
}

var jobRowRE = regexp.MustCompile(`<tr class="job-task( behind)?" data-task="([^"]*)" data-newest="(\d+)" data-lag="(\d+)" data-node="([^"]*)" data-epoch="(\d+)" data-behind="(true|false)">`)

func TestStatusPageShowsTheJobsNewestCompleteCheckpointOwnersAndTasksBehind(t *testing.T) {
	v := sampleView()
	v.JobStatus = fleetJobView(v.Now)
	page := render(t, v)
	requireSelfContained(t, page)
	for _, want := range []string{
		`id="job-status" data-complete="11" data-newest="16" data-behind="2"`,
		`<span id="job-complete" data-checkpoint="11">11</span>`,
		`<span id="job-complete-tasks">3</span>`,
		`<span id="job-newest" data-checkpoint="16">16</span>`,
		`<span id="job-behind" class="bad">2</span>`,
		"scanned 4 s ago",
		"behind: job-complete checkpoint 11 does not list it",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page does not hold %q", want)
		}
	}
	rows := jobRowRE.FindAllStringSubmatch(page, -1)
	if len(rows) != len(v.JobStatus.Tasks) {
		t.Fatalf("%d job task rows, want %d:\n%s", len(rows), len(v.JobStatus.Tasks), page)
	}
	for i, r := range rows {
		jt := v.JobStatus.Tasks[i]
		got := []string{r[2], r[3], r[4], r[5], r[6], r[7]}
		want := []string{jt.Task, itoa(jt.Newest), itoa(jt.Lag), jt.Node, itoa(jt.Epoch), map[bool]string{true: "true", false: "false"}[jt.Behind]}
		if strings.Join(got, "|") != strings.Join(want, "|") || (r[1] != "") != jt.Behind {
			t.Errorf("row %d: %q, want %q (behind class %q)", i, got, want, r[1])
		}
	}
}

func TestStatusPageJobSectionWithoutAScanOrACompleteCheckpoint(t *testing.T) {
	now := time.Date(2025, 5, 1, 12, 30, 0, 0, time.UTC)
	if page := render(t, telemetry.View{Now: now}); strings.Contains(page, `id="job-status"`) {
		t.Error("a view without a job scan shows a job section")
	}
	page := render(t, telemetry.View{Now: now, JobStatus: &telemetry.JobView{ScannedAt: now, Newest: 3,
		Tasks: []telemetry.JobTask{{Task: "a", Newest: 3, Node: "n1", Epoch: 1}, {Task: "b"}}}})
	for _, want := range []string{`data-complete="0"`, `<span id="job-complete" data-checkpoint="0" class="bad">none</span>`, `<span id="job-behind" class="ok">0</span>`} {
		if !strings.Contains(page, want) {
			t.Errorf("without a job-complete checkpoint, the page does not hold %q", want)
		}
	}
	page = render(t, telemetry.View{Now: now, JobStatus: &telemetry.JobView{ScannedAt: now, Error: "scan checkpoints of job j: connection refused"}})
	if !strings.Contains(page, `class="bad job-status-error">cannot scan the job: scan checkpoints of job j: connection refused`) {
		t.Errorf("a failed scan is not shown:\n%s", page)
	}
}

func TestStatusPageJobSectionEscapes(t *testing.T) {
	const hostile = `"><script>alert(1)</script>`
	v := telemetry.View{Now: time.Now(), JobStatus: &telemetry.JobView{ScannedAt: time.Now(), Complete: 1, CompleteTasks: []string{"x"},
		Tasks: []telemetry.JobTask{{Task: hostile, Node: hostile, Epoch: 2, Behind: true, Reason: hostile, Problem: hostile}}}}
	page := render(t, v)
	requireSelfContained(t, page)
	if strings.Contains(page, `data-task=""`) || strings.Contains(page, `data-node=""`) {
		t.Error("a hostile task or node name breaks out of its attribute")
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
