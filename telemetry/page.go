package telemetry

import (
	"html/template"
	"io"
)

var pageTmpl = template.Must(template.New("status").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ckpt {{.Job}}</title></head>
<body><h1>ckpt: job {{.Job}}</h1>
<p>storage {{.Storage}}, version {{.Version}}; retained in storage {{.RetainedBytes}} B, logical state {{.LogicalBytes}} B</p>
{{range .Tasks}}<h2>task {{.Task}}</h2><p>in flight: {{.InFlight}}</p>
<table><tr><th>checkpoint</th><th>status</th><th>checkpoint size</th><th>full size</th></tr>
{{range .History}}<tr><td>{{.Checkpoint}}</td><td>{{.Status}}</td><td>{{.CheckpointSize}}</td><td>{{.FullSize}}</td></tr>{{end}}
</table>{{end}}
</body></html>
`))

// RenderStatus writes the status page for v.
func RenderStatus(w io.Writer, v View) error { return pageTmpl.Execute(w, v) }
