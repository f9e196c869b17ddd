package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// logRecords returns the agent's JSON log records whose msg is msg.
func logRecords(a *agentProc, msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(a.stderr.String()))
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// waitLogRecords waits until the agent logged n records with msg (its
// stderr reaches the test through a pipe) and returns them.
func waitLogRecords(t *testing.T, a *agentProc, msg string, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		recs := logRecords(a, msg)
		if len(recs) >= n || time.Now().After(deadline) {
			return recs
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rawDial connects to the socket; the connection closes with the test.
func rawDial(t *testing.T, socket string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// readEvent reads one event within d.
func readEvent(t *testing.T, c net.Conn, r *bufio.Reader, d time.Duration) map[string]any {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	line, err := r.ReadBytes('\n')
	if err != nil {
		t.Fatalf("read event: %v", err)
	}
	var ev map[string]any
	if err := json.Unmarshal(line, &ev); err != nil {
		t.Fatalf("event is not JSON: %q", line)
	}
	return ev
}

func errorCode(ev map[string]any) string {
	e, _ := ev["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// requireClosed requires the agent to close c within d.
func requireClosed(t *testing.T, c net.Conn, r *bufio.Reader, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	if b, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("connection still open (read %q, %v), want it closed by the agent", b, err)
	}
}

// runAgentBriefly runs `ckpt agent args...` expecting it to exit at once.
func runAgentBriefly(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, ckptBin, append([]string{"agent"}, args...)...)
	out, _ := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("ckpt agent %s: still running after 15s, want it to refuse to start\n%s", strings.Join(args, " "), out)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// TestTheAgentRequiresAnAbsoluteAllowRoot: without --allow-root any peer of
// the socket could checkpoint or restore into any dir the agent reaches.
func TestTheAgentRequiresAnAbsoluteAllowRoot(t *testing.T) {
	storageDir, localDir := t.TempDir(), t.TempDir()
	base := []string{"--socket", filepath.Join(shortDir(t), "ckpt.sock"), "--storage", "file://" + storageDir, "--job", "j", "--local-dir", localDir}
	code, out := runAgentBriefly(t, base...)
	if code != 2 || !strings.Contains(out, "--allow-root is required") || !strings.Contains(out, "--allow-root /") {
		t.Errorf("no --allow-root: exit %d, want 2 with a message that says why and names --allow-root /:\n%s", code, out)
	}
	code, out = runAgentBriefly(t, append(base, "--allow-root", "data")...)
	if code != 2 || !strings.Contains(out, "relative") {
		t.Errorf("relative --allow-root: exit %d, want 2:\n%s", code, out)
	}

	socket := filepath.Join(shortDir(t), "ckpt.sock")
	a := startAgent(t, "any", agentConfig{Socket: socket, StorageDir: storageDir, Job: "j", LocalDir: localDir, AllowRoots: []string{"/"}})
	if w := waitLogRecords(t, a, "allow root / lets any peer of the socket checkpoint any directory the agent can read and restore into any the agent can write; name the app's data directories with --allow-root instead", 1); len(w) != 1 || w[0]["level"] != "WARN" {
		t.Errorf("--allow-root / logged no warning:\n%s", a.stderr)
	}
}

// TestPeerCredentialsDecideWhoMayConnect: --allow-uid and --allow-gid
// restrict the socket to the listed users and groups (SO_PEERCRED).
func TestPeerCredentialsDecideWhoMayConnect(t *testing.T) {
	storageDir, localDir, root := t.TempDir(), t.TempDir(), t.TempDir()
	other := fmt.Sprint(os.Getuid() + 1)
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	a := launchAgent(t, "strict", agentConfig{Socket: socket, StorageDir: storageDir, Job: "j", LocalDir: localDir, AllowRoots: []string{root},
		Extra: []string{"--allow-uid", other, "--allow-gid", fmt.Sprint(os.Getgid() + 1)}})
	var c net.Conn
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if c, err = net.DialTimeout("unix", socket, time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent does not listen: %v\n%s", err, a.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if ev := readEvent(t, c, r, 5*time.Second); ev["event"] != "error" || errorCode(ev) != "forbidden" {
		t.Fatalf("a peer not allowed: %v, want forbidden", ev)
	}
	requireClosed(t, c, r, 5*time.Second)
	recs := waitLogRecords(t, a, "connection refused", 1)
	if len(recs) != 1 || recs[0]["level"] != "WARN" || recs[0]["code"] != "forbidden" ||
		recs[0]["peer_uid"] != float64(os.Getuid()) || recs[0]["peer_gid"] != float64(os.Getgid()) || recs[0]["peer_pid"] != float64(os.Getpid()) {
		t.Fatalf("refusal logged as %v, want forbidden with this process's credentials\n%s", recs, a.stderr)
	}

	socket2 := filepath.Join(shortDir(t), "ckpt.sock")
	startAgent(t, "allowed", agentConfig{Socket: socket2, StorageDir: storageDir, Job: "j", LocalDir: t.TempDir(), AllowRoots: []string{root},
		Extra: []string{"--allow-uid", other, "--allow-uid", fmt.Sprint(os.Getuid())}})
}

// TestRefusedRequestsAreLoggedAndCounted: every request is counted by op
// and outcome in ckpt_requests_total; every refused one is logged at warn
// with the peer's credentials, as is every checkpoint's outcome.
func TestRefusedRequestsAreLoggedAndCounted(t *testing.T) {
	root, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	port := statusPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	a := startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: "j", LocalDir: localDir,
		AllowRoots: []string{root}, Extra: []string{"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port)}})
	waitStatusServer(t, a, base+"/healthz")
	snap := filepath.Join(root, "snap")
	writeFile(t, filepath.Join(snap, "000001.sst"), randomBytes(4096, 1))
	writeFile(t, filepath.Join(snap, "CURRENT"), []byte("MANIFEST-000001\n"))
	trigger(t, socket, "t", 5, snap)

	c, r := rawDial(t, socket)
	lines := []struct{ op, line string }{
		{"invalid", `garbage`},
		{"checkpoint", `{"op":"checkpoint","task":"../x","checkpoint":1,"dir":"` + snap + `"}`},
		{"checkpoint", `{"op":"checkpoint","task":"t","checkpoint":6,"dir":"/etc"}`},
		{"checkpoint", `{"op":"checkpoint","task":"t","checkpoint":4,"dir":"` + snap + `"}`},
		{"abort", `{"op":"abort","task":"t","checkpoint":99}`},
	}
	codes := map[string]int{}
	for _, l := range lines {
		fmt.Fprintln(c, l.line)
		ev := readEvent(t, c, r, 10*time.Second)
		code := errorCode(ev)
		if code == "" {
			t.Fatalf("%s: %v, want an error", l.line, ev)
		}
		codes[l.op+"/"+code]++
	}
	recs := waitLogRecords(t, a, "request refused", len(lines))
	if len(recs) != len(lines) {
		t.Fatalf("%d requests refused, %d logged:\n%s", len(lines), len(recs), a.stderr)
	}
	for i, rec := range recs {
		if rec["level"] != "WARN" || rec["op"] != lines[i].op || rec["code"] == nil || rec["message"] == nil || rec["task"] == nil ||
			rec["peer_uid"] != float64(os.Getuid()) || rec["peer_pid"] != float64(os.Getpid()) {
			t.Errorf("refusal of %s logged as %v", lines[i].line, rec)
		}
	}
	done := waitLogRecords(t, a, "checkpoint completed", 1)
	if len(done) != 1 || done[0]["peer_uid"] != float64(os.Getuid()) || done[0]["peer_pid"] == nil || done[0]["peer_pid"] == float64(os.Getpid()) {
		t.Errorf("checkpoint completed logged as %v, want the trigger process as its peer", done)
	}

	_, metrics := statusGet(t, base+"/metrics")
	codes["checkpoint/ok"]++
	for k, n := range codes {
		op, code, _ := strings.Cut(k, "/")
		got, ok := promSample(t, metrics, "ckpt_requests_total", map[string]string{"job": "j", "op": op, "code": code})
		if !ok || got != float64(n) {
			t.Errorf("ckpt_requests_total{op=%q,code=%q} = %v (present %v), want %d", op, code, got, ok, n)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", metrics)
	}
}

// TestConnectionsAreBoundedAndIdleOnesClosed: beyond --max-connections a
// connection gets unavailable and is closed; one idle past --idle-timeout
// is closed, which makes room again.
func TestConnectionsAreBoundedAndIdleOnesClosed(t *testing.T) {
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	startAgent(t, "A", agentConfig{Socket: socket, StorageDir: t.TempDir(), Job: "j", LocalDir: t.TempDir(), AllowRoots: []string{t.TempDir()},
		Extra: []string{"--max-connections", "1", "--idle-timeout", "1s"}})
	// The connection of startAgent's hello may not be closed on the
	// agent's side yet: retry until this one is served.
	var c1 net.Conn
	var r1 *bufio.Reader
	for deadline := time.Now().Add(10 * time.Second); ; {
		c1, r1 = rawDial(t, socket)
		fmt.Fprintln(c1, `{"op":"hello"}`)
		ev := readEvent(t, c1, r1, 5*time.Second)
		if ev["event"] == "hello" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hello: %v", ev)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c2, r2 := rawDial(t, socket)
	ev := readEvent(t, c2, r2, 5*time.Second)
	if msg, _ := ev["error"].(map[string]any)["message"].(string); errorCode(ev) != "unavailable" || !strings.Contains(msg, "too many connections") {
		t.Fatalf("second connection of one allowed: %v", ev)
	}
	requireClosed(t, c2, r2, 5*time.Second)
	requireClosed(t, c1, r1, 10*time.Second) // idle for 1s
	deadline := time.Now().Add(10 * time.Second)
	for hello(socket) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("no connection served after the idle one was closed: %v", hello(socket))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// setNofile lowers the soft RLIMIT_NOFILE of process pid to n (prlimit(2)).
func setNofile(t *testing.T, pid int, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_NOFILE, 0, uintptr(unsafe.Pointer(&lim)), 0, 0); e != 0 {
		t.Fatalf("prlimit: %v", e)
	}
	lim.Cur = n
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_NOFILE, uintptr(unsafe.Pointer(&lim)), 0, 0, 0); e != 0 {
		t.Fatalf("prlimit: %v", e)
	}
}

// TestTheAgentSurvivesRunningOutOfFileDescriptors: an agent whose accepts
// fail with EMFILE (accept4: too many open files) keeps its socket: it is
// unready while accepts fail, and serves again once descriptors are free.
func TestTheAgentSurvivesRunningOutOfFileDescriptors(t *testing.T) {
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	port := statusPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	a := startAgent(t, "A", agentConfig{Socket: socket, StorageDir: t.TempDir(), Job: "j", LocalDir: t.TempDir(), AllowRoots: []string{t.TempDir()},
		Extra: []string{"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port)}})
	waitStatusServer(t, a, base+"/healthz")
	// One kept-alive HTTP connection, opened now: /readyz stays reachable
	// when the agent can accept nothing.
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}}
	readyz := func() (int, string) {
		t.Helper()
		resp, err := probe.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("/readyz: %v\n%s", err, a.stderr)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := readyz(); code != 200 {
		t.Fatalf("/readyz before: %d %s", code, body)
	}

	pid := a.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Skipf("cannot count the agent's descriptors: %v", err)
	}
	setNofile(t, pid, uint64(len(fds)+3))
	var held []net.Conn
	for range 20 {
		c, err := net.DialTimeout("unix", socket, 2*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(held), err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := readyz()
		if code == http.StatusServiceUnavailable && strings.Contains(body, "cannot accept connections") && strings.Contains(body, "too many open files") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz while the agent is out of descriptors: %d %s\n%s", code, body, a.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(waitLogRecords(t, a, "accept failed: the socket takes no connections; retrying", 1)) == 0 {
		t.Errorf("the failed accepts were not logged:\n%s", a.stderr)
	}

	for _, c := range held {
		c.Close()
	}
	held = nil
	deadline = time.Now().Add(10 * time.Second)
	for {
		err := hello(socket)
		code, body := readyz()
		if err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("once descriptors are free: hello %v, /readyz %d %s\n%s", err, code, body, a.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
