package e2e

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/internal/human"
)

// chromiumPath is Debian's chromium package; .ci/run installs it.
const chromiumPath = "/usr/bin/chromium"

var statusPNG = flag.String("statuspage.png", "", "also save the status page screenshot of TestStatusPageOfARunningAgent to this path")

// statusPort returns a TCP port on 127.0.0.1 that was free a moment
// ago.
func statusPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// statusGet fetches url and requires a 200.
func statusGet(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return resp, body
}

// waitStatusServer polls url until it answers 200.
func waitStatusServer(t *testing.T, a *agentProc, url string) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer after 20s: %v\n%s", url, err, a.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// promSample finds the sample of metric whose labels include every label
// in want, and returns its value.
func promSample(t *testing.T, exposition []byte, metric string, want map[string]string) (float64, bool) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		end := strings.LastIndex(line, "}")
		labels, value := line[len(metric)+1:end], strings.TrimSpace(line[end+1:])
		ok := true
		for k, v := range want {
			if !strings.Contains(labels, fmt.Sprintf("%s=%q", k, v)) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return f, true
	}
	return 0, false
}

// runChromium runs headless Chromium with args and returns its stdout. The
// browser and its helpers run in their own process group, which is killed
// if the run takes longer than a minute.
func runChromium(t *testing.T, args ...string) []byte {
	t.Helper()
	profile := t.TempDir()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + profile}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromiumPath, append(base, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "HOME="+profile)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if cmd.Process != nil {
		// Helpers that outlive the browser go with its group.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatalf("chromium %s: %v\nstderr:\n%s", strings.Join(args, " "), err, errb.Bytes())
	}
	return out.Bytes()
}

var statusChartSVG = regexp.MustCompile(`(?s)<svg class="chart" data-task="([^"]*)".*?</svg>`)
var statusBarRect = regexp.MustCompile(`<rect class="bar" data-checkpoint="(\d+)" data-bytes="(\d+)"`)

// requireStatusPage checks a status page's markup (as served, or as the
// browser's DOM) for one task that took the checkpoints evs.
func requireStatusPage(t *testing.T, what, page, task string, evs []completedEvent) {
	t.Helper()
	var svg string
	for _, m := range statusChartSVG.FindAllStringSubmatch(page, -1) {
		if m[1] == task {
			svg = m[0]
		}
	}
	if svg == "" {
		t.Fatalf("%s: no chart SVG for task %s:\n%s", what, task, page)
	}
	bars := statusBarRect.FindAllStringSubmatch(svg, -1)
	if len(bars) != len(evs) {
		t.Fatalf("%s: chart of %s has %d bars, want %d (one per checkpoint):\n%s", what, task, len(bars), len(evs), svg)
	}
	for i, ev := range evs {
		if bars[i][1] != fmt.Sprint(ev.Checkpoint) || bars[i][2] != fmt.Sprint(ev.CheckpointSize) {
			t.Errorf("%s: bar %d is checkpoint %s of %s bytes, want checkpoint %d of %d bytes (trigger's report)",
				what, i, bars[i][1], bars[i][2], ev.Checkpoint, ev.CheckpointSize)
		}
	}
	last := evs[len(evs)-1]
	for _, want := range []string{
		fmt.Sprintf(`<span class="value last-checkpoint-size" data-bytes="%d">%s</span>`, last.CheckpointSize, human.Bytes(last.CheckpointSize)),
		fmt.Sprintf(`<span class="value last-full-size" data-bytes="%d">%s</span>`, last.FullSize, human.Bytes(last.FullSize)),
		fmt.Sprintf(`<span class="value files-uploaded">%d</span>`, last.FilesUploaded),
		fmt.Sprintf(`<span class="value files-reused">%d</span>`, last.FilesReused),
		`<span class="value in-flight">0</span>`,
		"no drill yet",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("%s: page lacks %s", what, want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://"} {
		if strings.Contains(strings.ToLower(page), bad) {
			t.Errorf("%s: page is not self-contained: it holds %q", what, bad)
		}
	}
}

func TestStatusPageOfARunningAgent(t *testing.T) {
	root, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "orders", "orders-0"
	port := statusPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	a := startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: localDir,
		AllowRoots: []string{root}, Extra: []string{"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port)}})
	waitStatusServer(t, a, base+"/healthz")

	// Checkpoint 1: ten SSTs and private files; checkpoint 2 keeps the
	// SSTs (hard links), adds one and rewrites the private files.
	snap1 := filepath.Join(root, "snap-1")
	writeSnapshot1(t, snap1)
	ev1 := trigger(t, socket, task, 1, snap1)
	snap2 := filepath.Join(root, "snap-2")
	for i := 1; i <= 10; i++ {
		name := fmt.Sprintf("%06d.sst", i)
		if err := os.MkdirAll(snap2, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(snap1, name), filepath.Join(snap2, name)); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(snap2, "000011.sst"), randomBytes(3<<20, 11))
	writeFile(t, filepath.Join(snap2, "CURRENT"), []byte("MANIFEST-000001\n"))
	writeFile(t, filepath.Join(snap2, "MANIFEST-000001"), randomBytes(100<<10+517, 101))
	ev2 := trigger(t, socket, task, 2, snap2)
	evs := []completedEvent{ev1, ev2}

	// /metrics says what trigger said.
	_, metrics := statusGet(t, base+"/metrics")
	labels := map[string]string{"job": job, "task": task}
	for metric, want := range map[string]int64{
		"ckpt_checkpoint_last_size_bytes":      ev2.CheckpointSize,
		"ckpt_checkpoint_last_full_size_bytes": ev2.FullSize,
		"ckpt_checkpoint_last_id":              int64(ev2.Checkpoint),
	} {
		got, ok := promSample(t, metrics, metric, labels)
		if !ok {
			t.Errorf("/metrics has no %s with labels %v:\n%s", metric, labels, metrics)
		} else if int64(got) != want {
			t.Errorf("/metrics: %s = %v, trigger reported %d", metric, got, want)
		}
	}

	// The page as served: HTML under a CSP that allows no script and no
	// outside reference.
	resp, served := statusGet(t, base+"/")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("status page Content-Type %q, want text/html", ct)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("status page CSP %q, want default-src 'none'", csp)
	}
	requireStatusPage(t, "served page", string(served), task, evs)

	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing: install Debian's chromium package (apt-get install -y --no-install-recommends chromium); .ci/run does", chromiumPath)
		}
		t.Skipf("%s is missing (install Debian's chromium package to render the page in a browser)", chromiumPath)
	}

	// The page as a browser builds it.
	dom := runChromium(t, "--dump-dom", base+"/")
	requireStatusPage(t, "browser DOM", string(dom), task, evs)

	// And as a person sees it.
	shot := filepath.Join(t.TempDir(), "status.png")
	runChromium(t, "--screenshot="+shot, "--window-size=1200,900", base+"/")
	data, err := os.ReadFile(shot)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot %s is not a PNG: %v", shot, err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 900 {
		t.Errorf("screenshot is %dx%d, want 1200x900", b.Dx(), b.Dy())
	}
	// A blank page compresses to almost nothing; the chart and numbers do not.
	if len(data) < 20<<10 {
		t.Errorf("screenshot is only %d bytes: is the page blank?", len(data))
	}
	if *statusPNG != "" {
		if err := os.WriteFile(*statusPNG, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshot: %d bytes, 1200x900", len(data))
	a.stop()
}
