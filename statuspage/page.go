// Package statuspage renders the agent's status page: one self-contained
// HTML document per request, drawn from a telemetry.View.
package statuspage

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/telemetry"
)

// The status page is one self-contained HTML document: inline CSS, inline
// SVG, no script and no external reference, so that it renders under the
// server's CSP (default-src 'none'; style-src 'unsafe-inline'; img-src data:)
// and every number is in the HTML itself. Elements that tests and scrapers
// look for carry stable classes and data attributes holding raw values:
// data-task on each task's section and chart, data-bytes on sizes (bytes),
// data-ns on durations (nanoseconds), data-checkpoint on each bar. The job
// section (#job-status, shown once the job was scanned) carries
// data-complete, data-newest and data-behind, and each of its rows
// (tr.job-task) data-task, data-newest, data-lag, data-node, data-epoch and
// data-behind.

// Render writes the status page for v.
func Render(w io.Writer, v telemetry.View) error { return pageTmpl.Execute(w, newPage(v)) }

// page is what the template draws: the telemetry.View with every number formatted
// and every chart laid out.
type page struct {
	Job, Storage, Version string
	// StorageHealth is the last check of storage (nil: none yet).
	StorageHealth     *telemetry.StorageHealth
	Now               string
	Tasks             []taskPage
	Retained, Logical int64
	GCDeleted         int64
	Bar               storageBar
	JobStatus         *jobStatus // nil: no scan of the job yet
}

// jobStatus is the job as the last scan of storage saw it, formatted.
type jobStatus struct {
	telemetry.JobView
	ScannedUnix int64 // ScannedAt, in Unix seconds
	At, Ago     string
}

// newJobStatus is the job section of the page (nil without a scan).
func newJobStatus(v *telemetry.JobView, now time.Time) *jobStatus {
	if v == nil {
		return nil
	}
	j := &jobStatus{JobView: *v, At: stamp(v.ScannedAt), Ago: ago(now, v.ScannedAt)}
	if !v.ScannedAt.IsZero() {
		j.ScannedUnix = v.ScannedAt.Unix()
	}
	return j
}

// storageBar compares retained bytes in storage with the logical state.
type storageBar struct {
	Measured        bool    // a GC has reported what storage holds
	RetainedW       float64 // bar widths in the SVG's units
	LogicalW        float64
	Ratio           string // retained / logical, "" when undefined
	Retained, Logic string
}

type taskPage struct {
	Task     string
	Blocked  *telemetry.BlockedRecord
	Chart    *chart
	Last     *lastCheckpoint
	Drill    *drillSummary
	Standby  *standbySummary
	WAL      *walSummary
	InFlight int
	Window   int // records in History
	Counts   struct{ Completed, Failed, Aborted int }
	LastBad  string // status of the newest record when it did not complete
	Rows     []historyRow
}

type lastCheckpoint struct {
	Checkpoint            uint64
	Size, Full            int64
	SizeH, FullH          string
	Uploaded, Reused      int
	Sync, Async, Total    time.Duration
	SyncH, AsyncH, TotalH string
	At, Ago               string
	BytesUploaded         int64
	BytesUploadedH        string
}

type drillSummary struct {
	Checkpoint       uint64
	Duration         time.Duration
	DurationH        string
	Throughput       float64
	ThroughputH      string
	Bytes            string
	Verified         bool
	Error            string
	Ago              string
	VsCheckpoint     string // drill duration over the last checkpoint's, "1.4×"
	ThroughputBytesS int64
	Sample           bool // a sample drill: Bytes were read and verified, not restored
	RPO              time.Duration
	RPOH             string // the recovery point, "2.1s" ("" when not measured)
}

// standbySummary is this agent's warm copy of a task it follows.
type standbySummary struct {
	Held, Newest uint64
	Lag          time.Duration
	LagH         string
	Remote       string // bytes the last refresh fetched from storage
	Failover     time.Duration
	FailoverH    string // measured failover restore from the copy
	FailoverOf   string
	Error        string
	Ago          string
}

// walSummary is the shipping of a task's WAL between checkpoints: its
// lag is the task's recovery point.
type walSummary struct {
	Checkpoint, Seq uint64
	Lag             time.Duration
	LagH            string
	Bytes           string
	Segments, Gaps  int64
	Ended           string
	Ago             string
}

type historyRow struct {
	Checkpoint       uint64
	Status           string
	Size, Full       string
	Uploaded, Reused int
	Total            string
	At               string
}

// chart is one task's history laid out in SVG units.
type chart struct {
	W, H                     float64
	Left, Right, Top, Bottom float64
	PlotH, TickEnd           float64
	Bars                     []bar
	Hits                     []hit
	Line                     string // polyline points of full size
	Dots                     []dot
	Marks                    []mark
	YTicks                   []tick
	XTicks                   []tick
	AnyBad                   bool
	Count                    int
	Task                     string
}

type bar struct {
	X, Y, W, H float64
	Checkpoint uint64
	Bytes      int64
	Title      string
}

type hit struct {
	X, W  float64
	Title string
}

type dot struct {
	X, Y  float64
	Bytes int64
	Title string
}

type mark struct {
	X, Y   float64
	Status string
	Title  string
}

type tick struct {
	Pos   float64
	Label string
}

func newPage(v telemetry.View) page {
	p := page{Job: v.Job, Storage: v.Storage, Version: v.Version, Retained: v.RetainedBytes,
		Logical: v.LogicalBytes, GCDeleted: v.GCDeleted}
	now := v.Now
	if now.IsZero() {
		now = time.Now()
	}
	p.Now = now.UTC().Format("2006-01-02 15:04:05 UTC")
	p.Bar = newStorageBar(v.RetainedBytes, v.LogicalBytes)
	p.JobStatus = newJobStatus(v.JobStatus, now)
	p.StorageHealth = v.StorageHealth
	for _, tv := range v.Tasks {
		p.Tasks = append(p.Tasks, newTaskPage(tv, now))
	}
	return p
}

// storageBarWidth is the width of the longer bar of the storage comparison.
const storageBarWidth = 320

func newStorageBar(retained, logical int64) storageBar {
	s := storageBar{Measured: retained > 0 || logical == 0, Retained: human.Bytes(retained), Logic: human.Bytes(logical)}
	top := max(retained, logical)
	if top > 0 {
		s.RetainedW = r1(storageBarWidth * float64(retained) / float64(top))
		s.LogicalW = r1(storageBarWidth * float64(logical) / float64(top))
	}
	if s.Measured && logical > 0 && retained > 0 {
		s.Ratio = strconv.FormatFloat(float64(retained)/float64(logical), 'f', 2, 64) + "×"
	}
	return s
}

func newTaskPage(tv telemetry.TaskView, now time.Time) taskPage {
	tp := taskPage{Task: tv.Task, Blocked: tv.Blocked, InFlight: tv.InFlight, Window: len(tv.History)}
	var last *telemetry.CheckpointRecord
	for i := range tv.History {
		r := &tv.History[i]
		switch r.Status {
		case "completed":
			tp.Counts.Completed++
			last = r
		case "failed":
			tp.Counts.Failed++
		case "aborted":
			tp.Counts.Aborted++
		}
	}
	if n := len(tv.History); n > 0 && tv.History[n-1].Status != "completed" {
		tp.LastBad = tv.History[n-1].Status
	}
	if last != nil {
		tp.Last = &lastCheckpoint{Checkpoint: last.Checkpoint, Size: last.CheckpointSize, Full: last.FullSize,
			SizeH: human.Bytes(last.CheckpointSize), FullH: human.Bytes(last.FullSize),
			Uploaded: last.FilesUploaded, Reused: last.FilesReused,
			Sync: last.Sync, Async: last.Async, Total: last.Total,
			SyncH: human.Duration(last.Sync), AsyncH: human.Duration(last.Async), TotalH: human.Duration(last.Total),
			At: stamp(last.At), Ago: ago(now, last.At),
			BytesUploaded: last.BytesUploaded, BytesUploadedH: human.Bytes(last.BytesUploaded)}
	}
	if d := tv.LastDrill; d != nil {
		ds := &drillSummary{Checkpoint: d.Checkpoint, Duration: d.Duration, DurationH: human.Duration(d.Duration),
			Throughput: d.Throughput, ThroughputH: human.Rate(d.Throughput), Bytes: human.Bytes(d.Bytes),
			Verified: d.Verified, Error: d.Error, Ago: ago(now, d.At), ThroughputBytesS: int64(d.Throughput), Sample: d.Sample}
		if d.RPO > 0 {
			ds.RPO, ds.RPOH = d.RPO, human.Duration(d.RPO)
		}
		if last != nil && last.Total > 0 && d.Duration > 0 && !d.Sample {
			ds.VsCheckpoint = strconv.FormatFloat(float64(d.Duration)/float64(last.Total), 'f', 1, 64) + "×"
		}
		tp.Drill = ds
	}
	if sb := tv.Standby; sb != nil {
		tp.Standby = &standbySummary{Held: sb.Held, Newest: sb.Newest, Lag: sb.Lag, LagH: human.Duration(sb.Lag),
			Remote: human.Bytes(sb.BytesRemote), Error: sb.Error, Ago: ago(now, sb.At)}
		if sb.Failover > 0 {
			tp.Standby.Failover, tp.Standby.FailoverH, tp.Standby.FailoverOf = sb.Failover, human.Duration(sb.Failover), human.Bytes(sb.FailoverBytes)
		}
	}
	if w := tv.WAL; w != nil {
		ws := &walSummary{Checkpoint: w.Checkpoint, Seq: w.Seq, Bytes: human.Bytes(w.Bytes), Segments: w.Segments,
			Gaps: w.Gaps, Ended: w.Ended, Ago: ago(now, w.At)}
		if !w.Through.IsZero() {
			ws.Lag = max(now.Sub(w.Through), 0)
			ws.LagH = human.Duration(ws.Lag)
		}
		tp.WAL = ws
	}
	for i := len(tv.History) - 1; i >= 0; i-- {
		r := tv.History[i]
		tp.Rows = append(tp.Rows, historyRow{Checkpoint: r.Checkpoint, Status: r.Status,
			Size: human.Bytes(r.CheckpointSize), Full: human.Bytes(r.FullSize),
			Uploaded: r.FilesUploaded, Reused: r.FilesReused, Total: human.Duration(r.Total), At: stamp(r.At)})
	}
	if len(tv.History) > 0 {
		tp.Chart = newChart(tv.History)
		tp.Chart.Task = tv.Task
	}
	return tp
}

// Chart geometry, in SVG user units (the SVG scales to its box).
const (
	chartW, chartH                        = 680.0, 260.0
	chartLeft, chartRight                 = 64.0, 12.0
	chartTop, chartBottom                 = 34.0, 40.0
	maxXLabels                            = 8
	barFill                               = 0.72 // share of a slot a bar fills
	maxBarW                               = 32.0 // few checkpoints still draw slim bars
	minBarH                               = 1.0  // a non-empty checkpoint stays visible
	markSize                              = 5.0
	chartPlotW, chartPlotH                = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
	chartPlotRight, chartPlotBottomYCoord = chartW - chartRight, chartH - chartBottom
)

// newChart lays out a history (oldest first): one slot per record, a bar
// for the checkpoint size of each completed checkpoint, a line through the
// full sizes, and a mark at the baseline for each failed or aborted one.
// Both series share one byte axis from zero, so a compaction shows as a
// tall bar where the line steps down: the sawtooth.
func newChart(h []telemetry.CheckpointRecord) *chart {
	c := &chart{W: chartW, H: chartH, Left: chartLeft, Right: chartPlotRight, Top: chartTop,
		Bottom: chartPlotBottomYCoord, PlotH: chartPlotH, TickEnd: chartPlotBottomYCoord + 4, Count: len(h)}
	var top int64
	for _, r := range h {
		if r.Status == "completed" {
			top = max(top, r.CheckpointSize, r.FullSize)
		}
	}
	ticks, axisMax := byteTicks(top)
	y := func(b int64) float64 {
		return chartPlotBottomYCoord - chartPlotH*float64(b)/axisMax
	}
	for _, t := range ticks {
		c.YTicks = append(c.YTicks, tick{Pos: r1(y(int64(t.value))), Label: t.label})
	}
	slot := chartPlotW / float64(len(h))
	bw := math.Min(maxBarW, math.Max(1, slot*barFill))
	stride := (len(h) + maxXLabels - 1) / maxXLabels
	var line []byte
	for i, r := range h {
		cx := chartLeft + (float64(i)+0.5)*slot
		title := recordTitle(r)
		c.Hits = append(c.Hits, hit{X: r1(chartLeft + float64(i)*slot), W: r1(slot), Title: title})
		if (len(h)-1-i)%stride == 0 {
			c.XTicks = append(c.XTicks, tick{Pos: r1(cx), Label: strconv.FormatUint(r.Checkpoint, 10)})
		}
		if r.Status != "completed" {
			c.AnyBad = true
			c.Marks = append(c.Marks, mark{X: r1(cx), Y: chartPlotBottomYCoord, Status: r.Status, Title: title})
			continue
		}
		by := y(r.CheckpointSize)
		bh := chartPlotBottomYCoord - by
		if r.CheckpointSize > 0 && bh < minBarH {
			bh, by = minBarH, chartPlotBottomYCoord-minBarH
		}
		c.Bars = append(c.Bars, bar{X: r1(cx - bw/2), Y: r1(by), W: r1(bw), H: r1(bh),
			Checkpoint: r.Checkpoint, Bytes: r.CheckpointSize, Title: title})
		fy := r1(y(r.FullSize))
		c.Dots = append(c.Dots, dot{X: r1(cx), Y: fy, Bytes: r.FullSize, Title: title})
		if len(line) > 0 {
			line = append(line, ' ')
		}
		line = strconv.AppendFloat(line, r1(cx), 'f', -1, 64)
		line = append(line, ',')
		line = strconv.AppendFloat(line, fy, 'f', -1, 64)
	}
	c.Line = string(line)
	return c
}

func recordTitle(r telemetry.CheckpointRecord) string {
	if r.Status != "completed" {
		return fmt.Sprintf("checkpoint %d %s after %s", r.Checkpoint, r.Status, human.Duration(r.Total))
	}
	return fmt.Sprintf("checkpoint %d: checkpoint size %s, full size %s, %d files uploaded, %d reused, took %s",
		r.Checkpoint, human.Bytes(r.CheckpointSize), human.Bytes(r.FullSize), r.FilesUploaded, r.FilesReused, human.Duration(r.Total))
}

type axisTick struct {
	value float64
	label string
}

// byteTicks picks about four round ticks from zero past top, in the binary
// unit that keeps the labels below 1024, and returns them with the axis
// maximum in bytes.
func byteTicks(top int64) ([]axisTick, float64) {
	if top <= 0 {
		top = 1024
	}
	unit, div := 0, 1.0
	for float64(top)/div >= 1024 && unit < len(human.ByteUnits)-1 {
		unit++
		div *= 1024
	}
	m := float64(top) / div
	rough := m / 4
	mag := math.Pow(10, math.Floor(math.Log10(rough)))
	step := 10 * mag
	for _, f := range []float64{1, 2, 2.5, 5} {
		if f*mag >= rough {
			step = f * mag
			break
		}
	}
	if unit == 0 && step < 1 {
		step = 1
	}
	n := int(math.Ceil(m/step - 1e-9))
	prec := 0
	if step < 1 {
		prec = int(math.Ceil(-math.Log10(step) - 1e-9))
	}
	if step != math.Trunc(step) && step*10 == math.Trunc(step*10) {
		prec = max(prec, 1)
	}
	ticks := make([]axisTick, 0, n+1)
	for i := 0; i <= n; i++ {
		v := float64(i) * step
		label := "0"
		if i > 0 {
			label = strconv.FormatFloat(v, 'f', prec, 64) + " " + human.ByteUnits[unit]
		}
		ticks = append(ticks, axisTick{value: v * div, label: label})
	}
	return ticks, float64(n) * step * div
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("15:04:05")
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return strconv.FormatInt(int64(d/time.Second), 10) + " s ago"
	}
	return human.Duration(d.Truncate(time.Second)) + " ago"
}

// r1 rounds to a tenth of an SVG unit, which keeps the markup short.
func r1(v float64) float64 { return math.Round(v*10) / 10 }

var pageTmpl = template.Must(template.New("status").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="10">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ckpt · {{.Job}}</title>
<style>
:root{--ink:#1f2430;--muted:#667085;--line:#e4e7ec;--bg:#f6f7f9;--card:#fff;--size:#3b6fb6;--full:#e8772e;--bad:#d92d20;--ok:#12875b}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
header{background:var(--card);border-bottom:1px solid var(--line);padding:14px 24px;display:flex;flex-wrap:wrap;gap:6px 28px;align-items:baseline}
header h1{font-size:18px;margin:0}
header .meta{color:var(--muted)}
header .meta b{color:var(--ink);font-weight:600}
main{padding:16px 24px;display:grid;gap:16px}
section.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px 18px}
h2{font-size:15px;margin:0 0 10px;display:flex;flex-wrap:wrap;gap:10px;align-items:center}
.pill{font-size:12px;font-weight:500;border-radius:10px;padding:1px 8px;background:#eef2f6;color:var(--muted)}
.pill.bad{background:#fee4e2;color:var(--bad)}
.pill.busy{background:#e0ecfb;color:var(--size)}
.job-storage{display:flex;flex-wrap:wrap;gap:10px 36px;align-items:flex-end}
.big{font-size:20px;font-weight:600;font-variant-numeric:tabular-nums}
.label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.task-body{display:flex;flex-wrap:wrap;gap:14px 28px;align-items:flex-start}
.chart-box{flex:1 1 560px;min-width:360px;max-width:860px}
svg.chart{width:100%;height:auto;display:block}
svg text{font:11px system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;fill:var(--muted)}
svg .grid{stroke:var(--line);stroke-width:1}
svg .axis{stroke:#98a2b3;stroke-width:1}
svg .bar{fill:var(--size)}
svg .full-line{fill:none;stroke:var(--full);stroke-width:2;stroke-linejoin:round}
svg .full-dot{fill:var(--full);stroke:#fff;stroke-width:1}
svg .hit{fill:transparent}
svg .hit:hover{fill:rgba(16,24,40,.07)}
svg .mark{fill:var(--bad)}
svg .legend text{fill:var(--ink);font-size:12px}
svg .axis-title{font-size:11px}
.numbers{flex:0 1 320px;min-width:270px;border-collapse:collapse}
.numbers th{text-align:left;font-weight:400;color:var(--muted);padding:3px 14px 3px 0;white-space:nowrap;vertical-align:top}
.numbers td{padding:3px 0;font-variant-numeric:tabular-nums}
.numbers tr.sep th,.numbers tr.sep td{border-top:1px solid var(--line);padding-top:7px}
.sub{color:var(--muted);font-size:12px;font-weight:400}
.value{font-weight:600}
.bad{color:var(--bad)}
.ok{color:var(--ok)}
.empty{color:var(--muted);padding:24px 0}
details{margin-top:10px}
summary{cursor:pointer;color:var(--muted)}
table.history{border-collapse:collapse;margin-top:6px;font-variant-numeric:tabular-nums}
table.history th,table.history td{padding:2px 14px 2px 0;text-align:right;white-space:nowrap}
table.history th{color:var(--muted);font-weight:400}
table.history td.status{text-align:left}
footer{color:var(--muted);padding:0 24px 20px;font-size:12px}
</style></head>
<body>
<header>
<h1>ckpt · job <span id="job">{{.Job}}</span></h1>
<span class="meta">storage <b id="storage">{{.Storage}}</b></span>
<span class="meta">version <b id="version">{{.Version}}</b></span>
<span class="meta">tasks <b id="task-count">{{len .Tasks}}</b></span>
</header>
<main>
{{with .StorageHealth}}{{if not .Up}}<section class="card" id="storage-down"><h2><span class="pill bad">storage down</span></h2><p class="bad">storage does not answer: {{.Error}}; checkpoints answer unavailable until it does</p></section>{{end}}{{end}}
<section class="card" id="job-summary">
<h2>Storage against state</h2>
<div class="job-storage">
<div><div class="label" title="bytes held in storage by the retained checkpoints, as of the last GC">retained in storage</div><div class="big"><span id="retained-bytes" data-bytes="{{.Retained}}">{{if .Bar.Measured}}{{.Bar.Retained}}{{else}}not measured yet{{end}}</span></div></div>
<div><div class="label">logical state</div><div class="big"><span id="logical-bytes" data-bytes="{{.Logical}}">{{.Bar.Logic}}</span></div></div>
<div><div class="label">storage ÷ state</div><div class="big"><span id="retained-ratio">{{if .Bar.Ratio}}{{.Bar.Ratio}}{{else}}–{{end}}</span></div></div>
<svg class="storage-bar" width="400" height="44" viewBox="0 0 400 44" role="img" aria-label="retained bytes in storage against logical state">
<text x="0" y="15">retained</text>
<rect class="retained-bar" x="64" y="5" width="{{.Bar.RetainedW}}" height="13" rx="2" fill="#3b6fb6"><title>retained in storage: {{.Bar.Retained}}</title></rect>
<text x="0" y="37">logical</text>
<rect class="logical-bar" x="64" y="27" width="{{.Bar.LogicalW}}" height="13" rx="2" fill="#e8772e"><title>logical state: {{.Bar.Logic}}</title></rect>
</svg>
<div class="sub">retained: as of the last GC, which has deleted <span id="gc-deleted">{{.GCDeleted}}</span> objects so far</div>
</div>
</section>
{{with .JobStatus}}{{template "job" .}}{{end}}
{{range .Tasks}}
<section class="card task" id="task-{{.Task}}" data-task="{{.Task}}">
<h2>task <span class="task-name">{{.Task}}</span>
{{if .LastBad}}<span class="pill bad">last checkpoint {{.LastBad}}</span>{{end}}
{{with .Blocked}}<span class="pill bad task-blocked" title="{{.Message}}">blocked: {{.Reason}}</span>{{end}}
{{if .InFlight}}<span class="pill busy">{{.InFlight}} in flight</span>{{end}}
{{with .Last}}<span class="pill">checkpoint {{.Checkpoint}}{{if .Ago}} · {{.Ago}}{{end}}</span>{{end}}
</h2>
<div class="task-body">
<div class="chart-box">
{{with .Chart}}{{template "chart" .}}{{else}}<div class="empty">no checkpoints yet</div>{{end}}
</div>
<table class="numbers">
{{with .Last}}
<tr><th>last checkpoint</th><td><span class="value last-checkpoint-id">{{.Checkpoint}}</span>{{if .At}} <span class="sub">at {{.At}}</span>{{end}}</td></tr>
<tr><th>checkpoint size</th><td><span class="value last-checkpoint-size" data-bytes="{{.Size}}">{{.SizeH}}</span></td></tr>
<tr><th>full size</th><td><span class="value last-full-size" data-bytes="{{.Full}}">{{.FullH}}</span></td></tr>
<tr><th>files</th><td><span class="value files-uploaded">{{.Uploaded}}</span> uploaded · <span class="value files-reused">{{.Reused}}</span> reused</td></tr>
<tr class="sep"><th>sync</th><td><span class="value sync-duration" data-ns="{{.Sync.Nanoseconds}}">{{.SyncH}}</span> <span class="sub">app waited</span></td></tr>
<tr><th>async</th><td><span class="value async-duration" data-ns="{{.Async.Nanoseconds}}">{{.AsyncH}}</span> <span class="sub">upload + commit</span></td></tr>
<tr><th>checkpoint took</th><td><span class="value total-duration" data-ns="{{.Total.Nanoseconds}}">{{.TotalH}}</span></td></tr>
{{else}}
<tr><th>last checkpoint</th><td><span class="value last-checkpoint-id">none completed</span></td></tr>
{{end}}
{{with .Drill}}
<tr><th>restore drill</th><td>{{if .Verified}}<span class="value drill-duration" data-ns="{{.Duration.Nanoseconds}}">{{.DurationH}}</span> at <span class="value drill-throughput" data-bytes-per-second="{{.ThroughputBytesS}}">{{.ThroughputH}}</span>{{if .RPOH}} · recovery point <span class="value drill-rpo" data-ns="{{.RPO.Nanoseconds}}">{{.RPOH}}</span>{{end}}
<div class="sub">{{.Bytes}}{{if .Sample}} sample{{end}} of checkpoint {{.Checkpoint}}, verified{{if .VsCheckpoint}} · {{.VsCheckpoint}} the last checkpoint's duration{{end}}{{if .Ago}} · {{.Ago}}{{end}}</div>
{{else}}<span class="value bad drill-failed">failed</span><div class="sub">checkpoint {{.Checkpoint}}{{if .Error}}: {{.Error}}{{end}}</div>{{end}}</td></tr>
{{else}}
<tr><th>restore drill</th><td><span class="sub drill-none">no drill yet</span></td></tr>
{{end}}
{{with .Standby}}
<tr><th>warm standby</th><td>{{if .Error}}<span class="value bad standby-failed">refresh failed</span><div class="sub">holds checkpoint {{.Held}}: {{.Error}}</div>{{else}}holds checkpoint <span class="value standby-held">{{.Held}}</span> of {{.Newest}} · lag <span class="value standby-lag" data-ns="{{.Lag.Nanoseconds}}">{{.LagH}}</span>
<div class="sub">a failover restore on this node is local{{if .FailoverH}}: measured <span class="value standby-failover" data-ns="{{.Failover.Nanoseconds}}">{{.FailoverH}}</span> for {{.FailoverOf}}{{end}} · last refresh fetched {{.Remote}}{{if .Ago}} · {{.Ago}}{{end}}</div>{{end}}</td></tr>
{{end}}
{{with .WAL}}
<tr><th>WAL lag (RPO)</th><td>{{if .LagH}}<span class="value wal-lag{{if .Ended}} bad{{end}}" data-ns="{{.Lag.Nanoseconds}}">{{.LagH}}</span>{{else}}<span class="value wal-lag">none shipped yet</span>{{end}}
<div class="sub">WAL of checkpoint {{.Checkpoint}}: {{.Seq}} commits, {{.Segments}} segments, {{.Bytes}}{{if .Gaps}} · <span class="bad">{{.Gaps}} gaps</span>{{end}}{{if .Ended}} · stopped until the next checkpoint: {{.Ended}}{{end}}{{if .Ago}} · {{.Ago}}{{end}}</div></td></tr>
{{end}}
<tr class="sep"><th>in flight</th><td><span class="value in-flight">{{.InFlight}}</span></td></tr>
<tr><th>failed · aborted</th><td><span class="value failed-count{{if .Counts.Failed}} bad{{end}}">{{.Counts.Failed}}</span> · <span class="value aborted-count{{if .Counts.Aborted}} bad{{end}}">{{.Counts.Aborted}}</span> {{if .Window}}<span class="sub">of the last {{.Window}}</span>{{end}}</td></tr>
</table>
</div>
{{if .Rows}}<details><summary>history ({{len .Rows}} checkpoints, newest first)</summary>
<table class="history"><tr><th>checkpoint</th><th>status</th><th>checkpoint size</th><th>full size</th><th>uploaded</th><th>reused</th><th>took</th><th>at</th></tr>
{{range .Rows}}<tr><td>{{.Checkpoint}}</td><td class="status{{if ne .Status "completed"}} bad{{end}}">{{.Status}}</td><td>{{.Size}}</td><td>{{.Full}}</td><td>{{.Uploaded}}</td><td>{{.Reused}}</td><td>{{.Total}}</td><td>{{.At}}</td></tr>
{{end}}</table></details>{{end}}
</section>
{{end}}
{{if not .Tasks}}<section class="card"><div class="empty" id="no-tasks">no task has checkpointed yet</div></section>{{end}}
</main>
<footer>refreshes every 10 s · rendered {{.Now}}</footer>
</body></html>
{{define "job"}}<section class="card" id="job-status" data-complete="{{.Complete}}" data-newest="{{.Newest}}" data-behind="{{.BehindCount}}" data-scanned="{{.ScannedUnix}}">
<h2>Job checkpoints <span class="sub">every task of the job, as storage shows them</span>{{if .Ago}}<span class="pill" title="scanned at {{.At}}">scanned {{.Ago}}</span>{{end}}</h2>
{{if .Error}}<div class="bad job-status-error">cannot scan the job: {{.Error}}</div>{{else}}
<div class="job-storage">
<div><div class="label">newest job-complete checkpoint</div><div class="big">{{if .Complete}}<span id="job-complete" data-checkpoint="{{.Complete}}">{{.Complete}}</span> <span class="sub">of <span id="job-complete-tasks">{{len .CompleteTasks}}</span> tasks</span>{{else}}<span id="job-complete" data-checkpoint="0" class="bad">none</span>{{end}}</div></div>
<div><div class="label">newest checkpoint of any task</div><div class="big"><span id="job-newest" data-checkpoint="{{.Newest}}">{{if .Newest}}{{.Newest}}{{else}}–{{end}}</span></div></div>
<div><div class="label">tasks behind it</div><div class="big"><span id="job-behind" class="{{if .BehindCount}}bad{{else}}ok{{end}}">{{.BehindCount}}</span> <span class="sub">of {{len .Tasks}}</span></div></div>
</div>
{{if .Tasks}}<table class="history job-tasks"><tr><th>task</th><th>newest checkpoint</th><th>lag</th><th>owner node</th><th>epoch</th><th class="status">against the job-complete checkpoint</th></tr>
{{range .Tasks}}<tr class="job-task{{if .Behind}} behind{{end}}" data-task="{{.Task}}" data-newest="{{.Newest}}" data-lag="{{.Lag}}" data-node="{{.Node}}" data-epoch="{{.Epoch}}" data-behind="{{.Behind}}"><td class="status job-task-name">{{.Task}}</td><td class="job-task-newest">{{if .Newest}}{{.Newest}}{{else}}–{{end}}</td><td class="job-task-lag">{{.Lag}}</td><td class="job-task-node">{{if .Node}}{{.Node}}{{else}}–{{end}}</td><td class="job-task-epoch">{{if .Epoch}}{{.Epoch}}{{else}}–{{end}}</td><td class="status job-task-state{{if or .Behind .Problem}} bad{{end}}">{{if .Behind}}behind: {{.Reason}}{{else if $.Complete}}in checkpoint {{$.Complete}}{{else}}–{{end}}{{if .Problem}} · ownership: {{.Problem}}{{end}}</td></tr>
{{end}}</table>{{end}}{{end}}
</section>{{end}}
{{define "chart"}}<svg class="chart" data-task="{{.Task}}" viewBox="0 0 {{.W}} {{.H}}" role="img" aria-label="checkpoint size and full size of the last {{.Count}} checkpoints of task {{.Task}}">
<g class="legend" transform="translate({{.Left}},14)">
<rect x="0" y="-9" width="12" height="10" rx="1" class="bar-swatch" fill="#3b6fb6"/><text x="17" y="0">checkpoint size (uploaded)</text>
<line x1="190" y1="-4" x2="210" y2="-4" stroke="#e8772e" stroke-width="2"/><circle cx="200" cy="-4" r="3" fill="#e8772e"/><text x="216" y="0">full size (what a restore fetches)</text>
{{if .AnyBad}}<path d="M420,-9 l5,9 l-10,0 z" fill="#d92d20"/><text x="431" y="0">failed / aborted</text>{{end}}
</g>
{{range .YTicks}}<line class="grid" x1="{{$.Left}}" x2="{{$.Right}}" y1="{{.Pos}}" y2="{{.Pos}}"/><text class="y-label" x="{{$.Left}}" dx="-6" y="{{.Pos}}" dy="4" text-anchor="end">{{.Label}}</text>
{{end}}<line class="axis" x1="{{.Left}}" x2="{{.Right}}" y1="{{.Bottom}}" y2="{{.Bottom}}"/>
{{range .XTicks}}<line class="axis" x1="{{.Pos}}" x2="{{.Pos}}" y1="{{$.Bottom}}" y2="{{$.TickEnd}}"/><text class="x-label" x="{{.Pos}}" y="{{$.Bottom}}" dy="15" text-anchor="middle">{{.Label}}</text>
{{end}}<text class="axis-title" x="{{.Right}}" y="{{.H}}" dy="-4" text-anchor="end">checkpoint number →</text>
{{range .Bars}}<rect class="bar" data-checkpoint="{{.Checkpoint}}" data-bytes="{{.Bytes}}" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Title}}</title></rect>
{{end}}{{if .Line}}<polyline class="full-line" points="{{.Line}}"/>{{end}}
{{range .Dots}}<circle class="full-dot" data-bytes="{{.Bytes}}" cx="{{.X}}" cy="{{.Y}}" r="{{if gt $.Count 40}}2{{else}}3.5{{end}}"><title>{{.Title}}</title></circle>
{{end}}{{range .Marks}}<path class="mark mark-{{.Status}}" d="M{{.X}},{{.Y}} m0,-9 l5,9 l-10,0 z"><title>{{.Title}}</title></path>
{{end}}{{range .Hits}}<rect class="hit" x="{{.X}}" y="{{$.Top}}" width="{{.W}}" height="{{$.PlotH}}"><title>{{.Title}}</title></rect>
{{end}}</svg>{{end}}`))
