package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/servers"
)

// TestQuickRunReportsEveryFigureAndVerifiesRestores runs the bench in
// quick mode against the S3 server it starts itself and checks the report
// for correctness only: every figure present, every restore verified,
// every peer either measured or reported missing. It asserts nothing about
// time: machines here are shared and noisy.
func TestQuickRunReportsEveryFigureAndVerifiesRestores(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the bench starts versitygw and a ckpt agent process")
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := servers.RepoRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	// The agent processes run ckpt; the load controls re-execute ckpt-bench.
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/ckpt", "./cmd/ckpt-bench")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/ckpt ./cmd/ckpt-bench: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log bytes.Buffer
	rep, err := Run(ctx, Options{Quick: true, CkptExe: filepath.Join(bin, "ckpt"), LoadExe: filepath.Join(bin, "ckpt-bench"), Dir: t.TempDir(), Log: &log})
	if err != nil {
		t.Fatalf("bench: %v\nlog:\n%s", err, log.String())
	}
	if len(rep.Errors) > 0 {
		t.Fatalf("sections failed: %v\nlog:\n%s", rep.Errors, log.String())
	}

	// Cost growth: each size measured, each command's result checked by
	// the section against the job it built (checkScaleResults).
	if sc := rep.Scale; sc == nil || len(sc.Incremental) != 2 || len(sc.Objects) != 1 {
		t.Errorf("scale: %+v", sc)
	} else {
		for _, in := range sc.Incremental {
			if in.E2EMS <= 0 || in.ManifestBytes <= 0 || in.PeakRSSBytes <= 0 || in.PauseMS <= 0 {
				t.Errorf("scale at %d files: %+v", in.Files, in)
			}
		}
		ob := sc.Objects[0]
		if len(ob.Commands) != 4 || ob.Agent == nil || ob.Agent.PeakRSSBytes <= 0 || ob.Agent.PeakAnonBytes <= 0 {
			t.Errorf("scale job of %d objects: %+v", ob.Objects, ob)
		}
		for _, c := range ob.Commands {
			if c.RequestsTotal <= 0 || c.MaxRSSBytes <= 0 || c.MaxAnonBytes <= 0 {
				t.Errorf("scale: ckpt %s: %d requests, max RSS %d", c.Name, c.RequestsTotal, c.MaxRSSBytes)
			}
		}
	}

	if got, want := len(rep.Series), rep.Config.Checkpoints; got != want {
		t.Errorf("series has %d checkpoints, want %d", got, want)
	}
	for _, s := range rep.Series {
		// 0.99: a format 2 manifest holds the small private files compressed.
		if s.BytesWritten <= 0 || float64(s.FullBytesWritten) < 0.99*float64(s.FullSize) || s.NewBytes <= 0 {
			t.Errorf("checkpoint %d: written %d, full agent wrote %d of a %d-byte snapshot, new %d", s.Checkpoint, s.BytesWritten, s.FullBytesWritten, s.FullSize, s.NewBytes)
		}
	}
	if rs := rep.Restore; rs == nil || !rs.LocalVerified || !rs.RemoteVerified || rs.BytesLocal == 0 || rs.BytesRemote == 0 {
		t.Errorf("restores: %+v, want both verified, the local one from the local copy", rs)
	}
	if len(rep.Pause) != 4 {
		t.Errorf("pause figures: %+v, want 1,000 and 10,000 files, each with handoff and links", rep.Pause)
	}
	rclone := false
	if rep.Transfer == nil {
		t.Fatal("no transfer figures")
	}
	names := map[string]bool{}
	for _, tl := range rep.Transfer.Tools {
		names[strings.Fields(tl.Tool)[0]] = true
		switch {
		case !tl.Available && tl.Reason == "":
			t.Errorf("%s: missing without a reason", tl.Tool)
		case tl.Available && (!tl.RestoreVerified || tl.UploadMS <= 0 || tl.RestoreMS <= 0):
			t.Errorf("%s: available but not measured and verified: %+v", tl.Tool, tl)
		}
		if tl.Tool == "rclone" && tl.Available {
			rclone = true
		}
	}
	for _, n := range []string{"ckpt", "rclone", "restic", "ldb"} {
		if !names[n] {
			t.Errorf("tool %s is not in the report (a missing peer must be reported as missing)", n)
		}
	}
	// The app section: bytes shipped only in the phases with checkpoints,
	// all of them there (each phase waits for its uploads).
	apps := []*AppThroughput{rep.AppThroughput}
	if off := offNode(rep.AppThroughput); off != nil { // nil: no tmpfs here
		apps = append(apps, off)
	}
	for _, a := range apps {
		if a == nil || a.Checkpoints == 0 || len(a.PhaseShippedMBPerS) != len(a.Phases) || len(a.PhaseLSMWrittenMBPerS) != len(a.Phases) {
			t.Fatalf("app throughput: %+v", a)
		}
		for i, p := range a.Phases {
			if shipped := a.PhaseShippedMBPerS[i]; (p == "on") != (shipped > 0) {
				t.Errorf("app throughput (%s): phase %d (%s) shipped %g MB/s", a.Storage, i, p, shipped)
			}
		}
	}
	// The controls with no agent: checkpoints taken, nothing shipped, and
	// the hashing process (the agent's stand-in) busy only in the phases
	// with checkpoints.
	at := rep.AppThroughput
	controls := []*AppThroughput{at.OwnCheckpoints, at.OwnCheckpointsHashing}
	if offNode(at) != nil {
		// The copying control ships to the same tmpfs: bytes in the phases
		// with checkpoints only, like the agent.
		c := at.OwnCheckpointsCopying
		if c == nil || c.ShippedMBPerS <= 0 || len(c.PhaseShippedMBPerS) != len(c.Phases) {
			t.Fatalf("copying control: %+v", c)
		}
		for i, p := range c.Phases {
			if shipped := c.PhaseShippedMBPerS[i]; (p == "on") != (shipped > 0) {
				t.Errorf("copying control: phase %d (%s) shipped %g MB/s", i, p, shipped)
			}
		}
		controls = append(controls, c)
	}
	for _, c := range controls {
		copying := c != nil && c == at.OwnCheckpointsCopying
		if c == nil || c.Checkpoints == 0 || (!copying && c.ShippedMBPerS != 0) || len(c.PhaseCores) != len(c.Phases) {
			t.Fatalf("app throughput control: %+v", c)
		}
		for i, p := range c.Phases {
			// The copying process lives through the phases without
			// checkpoints, idle: a clock tick may land on its runtime.
			if p != "on" && !copying && c.PhaseCores[i].Agent != 0 {
				t.Errorf("app throughput control (%s): phase %d (%s) has another process using %g cores", c.Agent, i, p, c.PhaseCores[i].Agent)
			}
		}
	}
	if h := at.OwnCheckpointsHashing; h.HashLoadBytesPerS <= 0 || !strings.Contains(h.Agent, "hashing") {
		t.Errorf("hashing control: %+v", h)
	}
	if e := rep.EndToEnd; e == nil || e.CkptMS <= 0 || len(e.Peers) != 2 || !e.Scaled {
		t.Errorf("end to end: %+v", e)
	}
	if m := rep.Memory; m == nil || m.PeakRSSBytes <= 0 {
		t.Errorf("memory: %+v", m)
	}
	for _, tg := range rep.Targets {
		if !tg.Measured && !(strings.Contains(tg.Name, "rclone") && !rclone) {
			t.Errorf("target %q not measured", tg.Name)
		}
	}

	// The JSON is one object holding every figure.
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"amplification", "incremental_vs_full", "local_vs_remote_restore", "app_throughput", "transfer", "end_to_end", "pause", "memory", "series", "targets"} {
		if m[k] == nil {
			t.Errorf("JSON has no %q", k)
		}
	}
	var out bytes.Buffer
	if err := rep.Print(&out); err != nil || !strings.Contains(out.String(), "FIGURE") {
		t.Errorf("human report: %v\n%s", err, out.String())
	}
}

// TestBadOptionsAreRefusedBeforeAnythingRuns: every out-of-range option is
// refused with an error that names it, and the scratch directory stays
// empty (no server started, no store loaded).
func TestBadOptionsAreRefusedBeforeAnythingRuns(t *testing.T) {
	for name, tc := range map[string]struct {
		o    Options
		want string
	}{
		"tiny state":         {Options{StateBytes: 1 << 10}, "state bytes"},
		"churn above 1":      {Options{Churn: 1.5}, "churn"},
		"one checkpoint":     {Options{Checkpoints: 1}, "checkpoints"},
		"interval too short": {Options{AppInterval: time.Millisecond}, "app interval"},
		"interval too long":  {Options{AppInterval: time.Hour}, "app interval"},
		"negative interval":  {Options{AppInterval: -time.Second}, "app interval"},
		"unknown section":    {Options{Only: []string{"nope"}}, "unknown section"},
		"no scale files":     {Options{ScaleFiles: []int{0}}, "scale files"},
		"tiny scale job":     {Options{ScaleObjects: []int{10}}, "scale objects"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			tc.o.Dir = dir
			_, err := Run(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run(%+v) = %v, want an error about %s", tc.o, err, tc.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Fatalf("a refused run left %d entries in its directory", len(ents))
			}
		})
	}
}

func TestHashLoadRefusesANonPositiveRateAndStopsWithItsContext(t *testing.T) {
	if err := HashLoad(context.Background(), 0); err == nil {
		t.Error("HashLoad(0): no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- HashLoad(ctx, 1<<20) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("HashLoad after cancel: %v", err)
	}
}

func TestCopyLoadCopiesNewFilesOnceAndRemovesReplacedCheckpoints(t *testing.T) {
	root := t.TempDir()
	dst := filepath.Join(root, "dst")
	write := func(dir, name, data string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c1, c2 := filepath.Join(root, "c1"), filepath.Join(root, "c2")
	write(c1, "000001.sst", "0123456789")
	write(c1, "MANIFEST-000001", "abcde")
	write(c1, "000003.sst", "gone")       // compacted away before c2
	write(c2, "000001.sst", "0123456789") // the same file, linked again
	write(c2, "000002.sst", "xyz")
	write(c2, "MANIFEST-000001", "abcdefgh") // grew
	var out strings.Builder
	if err := CopyLoad(context.Background(), dst, strings.NewReader(c1+"\n"+c2+"\n"), &out); err != nil {
		t.Fatal(err)
	}
	if want := "19 " + c1 + "\n11 " + c2 + "\n"; out.String() != want {
		t.Errorf("answers %q, want %q", out.String(), want)
	}
	for name, want := range map[string]string{"000001.sst": "0123456789", "000002.sst": "xyz", "MANIFEST-000001": "abcdefgh"} {
		if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	for _, d := range []string{c1, c2, filepath.Join(dst, "000003.sst")} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s: still there after the run (%v)", d, err)
		}
	}
}

func TestCopyLoadRefusesBadInputAndNamesIt(t *testing.T) {
	root := t.TempDir()
	for _, tc := range []struct{ dst, in, want string }{
		{"rel/dst", "", "want an absolute path"},
		{filepath.Join(root, "dst"), "relative/dir\n", `"relative/dir": want an absolute path`},
		{filepath.Join(root, "dst"), filepath.Join(root, "missing") + "\n", filepath.Join(root, "missing")},
	} {
		var out strings.Builder
		err := CopyLoad(context.Background(), tc.dst, strings.NewReader(tc.in), &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CopyLoad(%q, %q): %v, want an error naming %q", tc.dst, tc.in, err, tc.want)
		}
		if out.Len() != 0 {
			t.Errorf("CopyLoad(%q, %q) answered %q", tc.dst, tc.in, out.String())
		}
	}
}

// TestFindCkptBuildsTheRepositorysCkpt: inside the ckpt repository the
// agent binary is built from its source, and it runs.
func TestFindCkptBuildsTheRepositorysCkpt(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds ./cmd/ckpt")
	}
	dir := t.TempDir()
	exe, err := FindCkpt(context.Background(), dir, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "ckpt"); exe != want {
		t.Errorf("FindCkpt = %s, want the build %s", exe, want)
	}
	if out, err := exec.Command(exe, "version").CombinedOutput(); err != nil {
		t.Errorf("%s version: %v\n%s", exe, err, out)
	}
}
