package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/manifests"
)

// ckptBin is the ckpt binary built once by TestMain.
var ckptBin string

// scratch is a directory TestMain owns: the binary and data shared by tests.
var scratch string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	scratch, err = os.MkdirTemp("", "ckpt-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(scratch)
	ckptBin = filepath.Join(scratch, "ckpt")
	build := exec.Command("go", "build", "-o", ckptBin, "./cmd/ckpt")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build ./cmd/ckpt: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// repoRoot walks up from the working directory to the directory of go.mod.
func repoRoot() (string, error) { return testservers.RepoRoot() }

// lockedBuffer collects a process's stderr; the process writes while the
// test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// agentConfig is the command line of one agent process.
type agentConfig struct {
	Socket     string
	StorageDir string // file:// storage in this directory, unless Storage is set
	Storage    string // storage URL (overrides StorageDir)
	Env        []string
	Job        string
	LocalDir   string
	AllowRoots []string // none: "/" (the agent requires at least one)
	Extra      []string // more flags
	Bin        string   // the ckpt binary to run (default ckptBin)
}

func (c agentConfig) storageURL() string {
	if c.Storage != "" {
		return c.Storage
	}
	return "file://" + c.StorageDir
}

func (c agentConfig) args() []string {
	args := []string{"agent", "--socket", c.Socket, "--storage", c.storageURL(),
		"--job", c.Job, "--local-dir", c.LocalDir, "--log-level", "debug"}
	if c.Storage == "" {
		args = append(args, "--create-storage")
	}
	roots := c.AllowRoots
	if len(roots) == 0 {
		roots = []string{"/"} // the agent requires one; "/" allows any dir
	}
	for _, r := range roots {
		args = append(args, "--allow-root", r)
	}
	return append(args, c.Extra...)
}

// agentProc is a running `ckpt agent`.
type agentProc struct {
	t      *testing.T
	name   string
	cfg    agentConfig
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exited chan struct{}
	state  *os.ProcessState
}

// launchAgent starts an agent process without waiting for it to serve. The
// process is killed when the test ends, and its stderr is logged if the
// test failed.
func launchAgent(t *testing.T, name string, cfg agentConfig) *agentProc {
	t.Helper()
	a := &agentProc{t: t, name: name, cfg: cfg, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	bin := ckptBin
	if cfg.Bin != "" {
		bin = cfg.Bin
	}
	a.cmd = exec.Command(bin, cfg.args()...)
	a.cmd.Env = childEnv(cfg.Env)
	a.cmd.Stdout = a.stderr
	a.cmd.Stderr = a.stderr
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("start agent %s: %v", name, err)
	}
	go func() {
		a.cmd.Wait()
		a.state = a.cmd.ProcessState
		close(a.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-a.exited:
		default:
			a.cmd.Process.Kill()
			<-a.exited
		}
		if t.Failed() {
			t.Logf("agent %s (%s) stderr:\n%s", name, strings.Join(cfg.args(), " "), a.stderr)
		}
	})
	return a
}

// startAgent starts an agent and waits until it answers hello.
func startAgent(t *testing.T, name string, cfg agentConfig) *agentProc {
	t.Helper()
	a := launchAgent(t, name, cfg)
	a.waitReady()
	return a
}

func (a *agentProc) waitReady() {
	a.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-a.exited:
			a.t.Fatalf("agent %s exited before serving (%v):\n%s", a.name, a.state, a.stderr)
		default:
		}
		if err := hello(a.cfg.Socket); err == nil {
			return
		} else if time.Now().After(deadline) {
			a.t.Fatalf("agent %s does not answer hello on %s after 20s: %v\n%s", a.name, a.cfg.Socket, err, a.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hello dials the socket and exchanges one hello.
func hello(socket string) error {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(`{"op":"hello"}` + "\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return err
	}
	var ev struct {
		Event    string `json:"event"`
		Protocol int    `json:"protocol"`
	}
	if err := json.Unmarshal(line, &ev); err != nil || ev.Event != "hello" || ev.Protocol != 1 {
		return fmt.Errorf("unexpected hello reply %q", line)
	}
	return nil
}

func (a *agentProc) signal(sig os.Signal) {
	a.t.Helper()
	if err := a.cmd.Process.Signal(sig); err != nil {
		a.t.Fatalf("signal agent %s: %v", a.name, err)
	}
}

// kill SIGKILLs the agent and waits for it to be gone.
func (a *agentProc) kill() {
	a.t.Helper()
	a.signal(syscall.SIGKILL)
	a.waitExit(10 * time.Second)
}

// stop SIGTERMs the agent and requires a clean exit.
func (a *agentProc) stop() {
	a.t.Helper()
	a.signal(syscall.SIGTERM)
	if code := a.waitExit(40 * time.Second); code != 0 {
		a.t.Fatalf("agent %s exited %d after SIGTERM, want 0", a.name, code)
	}
}

// waitExit waits for the agent to exit and returns its exit code (-1 when
// killed by a signal).
func (a *agentProc) waitExit(timeout time.Duration) int {
	a.t.Helper()
	select {
	case <-a.exited:
		return a.state.ExitCode()
	case <-time.After(timeout):
		a.t.Fatalf("agent %s still running %v after being asked to stop", a.name, timeout)
		return 0
	}
}

// shortDir makes a directory with a short path for Unix sockets (their
// paths are limited to about 100 bytes, and test names are long).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "ckpt-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// cliResult is the outcome of one ckpt command.
type cliResult struct {
	Stdout, Stderr []byte
	Code           int
	Elapsed        time.Duration
}

// unsafeGCGrace lowers the GC grace floor of a ckpt process to zero: the
// tests collect garbage in seconds, on storage nothing else writes to.
const unsafeGCGrace = "CKPT_UNSAFE_MIN_GC_GRACE=0s"

// unsafeGCMarkDelay lets a collection delete what an earlier one marked
// at once (D = 0): two `ckpt gc` runs in a row collect everything.
const unsafeGCMarkDelay = "CKPT_UNSAFE_GC_MARK_DELAY=0s"

// unsafeGCLockExpiry lets a collection take over the deletion lock of a
// collection that was killed holding it, at once (tests only).
const unsafeGCLockExpiry = "CKPT_UNSAFE_GC_LOCK_EXPIRY=0s"

// childEnv is the environment of a ckpt process: the test's, plus env
// (whose entries win).
func childEnv(env []string) []string {
	if len(env) == 0 {
		return nil
	}
	return append(os.Environ(), env...)
}

// runCkpt runs the ckpt binary with args, bounded to two minutes.
func runCkpt(t *testing.T, args ...string) cliResult {
	t.Helper()
	return runCkptEnv(t, nil, args...)
}

// runCkptEnv runs the ckpt binary with args and env added to the
// environment, bounded to two minutes.
func runCkptEnv(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	return runBinEnv(t, ckptBin, env, args...)
}

// runBinEnv runs the ckpt binary bin with args and env added to the
// environment, bounded to two minutes. A process killed by a signal has
// Code -1.
func runBinEnv(t *testing.T, bin string, env []string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv(env)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	res := cliResult{Stdout: out.Bytes(), Stderr: errb.Bytes(), Elapsed: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.Code = ee.ExitCode()
	default:
		t.Fatalf("ckpt %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("ckpt %s: timed out\nstderr: %s", strings.Join(args, " "), errb.Bytes())
	}
	return res
}

// ckptJSON runs a ckpt command that must succeed and decodes its --json
// output into v.
func ckptJSON(t *testing.T, v any, args ...string) cliResult {
	t.Helper()
	return ckptJSONEnv(t, nil, v, args...)
}

// ckptJSONEnv is ckptJSON with env added to the environment.
func ckptJSONEnv(t *testing.T, env []string, v any, args ...string) cliResult {
	t.Helper()
	res := runCkptEnv(t, env, args...)
	if res.Code != 0 {
		t.Fatalf("ckpt %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.Code, res.Stdout, res.Stderr)
	}
	if err := json.Unmarshal(res.Stdout, v); err != nil {
		t.Fatalf("ckpt %s: stdout is not one JSON value: %v\n%s", strings.Join(args, " "), err, res.Stdout)
	}
	return res
}

// restoreResult is `ckpt restore --json`.
type restoreResult struct {
	Restored       bool   `json:"restored"`
	Reason         string `json:"reason"`
	Task           string `json:"task"`
	Checkpoint     uint64 `json:"checkpoint"`
	Files          int    `json:"files"`
	Bytes          int64  `json:"bytes"`
	BytesLocal     int64  `json:"bytes_local"`
	BytesRemote    int64  `json:"bytes_remote"`
	FilesLocal     int    `json:"files_local"`
	FilesRemote    int    `json:"files_remote"`
	LocalFallbacks int    `json:"local_fallbacks"`
	DurationMS     int64  `json:"duration_ms"`
	Target         string `json:"target"`
}

// listEntry is one element of `ckpt list --json`.
type listEntry struct {
	Task           string    `json:"task"`
	Checkpoint     uint64    `json:"checkpoint"`
	Created        time.Time `json:"created"`
	CheckpointSize int64     `json:"checkpoint_size"`
	FullSize       int64     `json:"full_size"`
	Files          int       `json:"files"`
	Epoch          uint64    `json:"epoch"`
}

// gcReport is `ckpt gc --json`.
type gcReport struct {
	DeletedObjects      int   `json:"deleted_objects"`
	DeletedBytes        int64 `json:"deleted_bytes"`
	LiveObjects         int   `json:"live_objects"`
	LiveBytes           int64 `json:"live_bytes"`
	RetainedCheckpoints int   `json:"retained_checkpoints"`
	MarkedObjects       int   `json:"marked_objects"`
	PendingObjects      int   `json:"pending_objects"`
	IncompleteUploads   int   `json:"incomplete_uploads_removed"`
}

// completedEvent is the completed event of `ckpt trigger --json` and of
// the socket protocol.
type completedEvent struct {
	Event          string `json:"event"`
	Task           string `json:"task"`
	Checkpoint     uint64 `json:"checkpoint"`
	CheckpointSize int64  `json:"checkpoint_size"`
	FullSize       int64  `json:"full_size"`
	FilesUploaded  int    `json:"files_uploaded"`
	FilesReused    int    `json:"files_reused"`
	DurationMS     int64  `json:"duration_ms"`
}

// trigger runs `ckpt trigger --json` and requires a completed event.
func trigger(t *testing.T, socket, task string, n uint64, dir string) completedEvent {
	t.Helper()
	var ev completedEvent
	ckptJSON(t, &ev, "trigger", "--socket", socket, "--task", task, "--checkpoint", fmt.Sprint(n), "--dir", dir, "--json")
	if ev.Event != "completed" || ev.Task != task || ev.Checkpoint != n {
		t.Fatalf("trigger %s %d: got %+v, want its completed event", task, n, ev)
	}
	return ev
}

// storedManifest is a manifest as this suite reads it from storage: the
// envelope and the fields of the body the tests check.
type storedManifest struct {
	Key            string
	Size           int64 // bytes of the manifest object
	Task           string
	Checkpoint     uint64
	Files          []manifestFile
	FullSize       int64
	CheckpointSize int64
	FilesUploaded  int
	FilesReused    int
}

type manifestFile struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
	BLAKE3   string `json:"blake3,omitempty"`
	Key      string `json:"key,omitempty"`
	Inline   []byte `json:"inline,omitempty"`
	Uploaded bool   `json:"uploaded"`
}

// ContentID is the file's content id as shared keys name it.
func (f manifestFile) ContentID() string {
	if f.BLAKE3 != "" {
		return fmt.Sprintf("b3-%s-%d", f.BLAKE3, f.Size)
	}
	return fmt.Sprintf("%s-%d", f.SHA256, f.Size)
}

type manifestEnvelope struct {
	Format int             `json:"format"`
	SHA256 string          `json:"sha256"`
	Body   json.RawMessage `json:"body"`
}

func manifestKey(job, task string, n uint64) string {
	return fmt.Sprintf("%s/tasks/%s/chk/%020d/manifest", job, task, n)
}

// manifestRE matches a manifest's key: the legacy "manifest" (epoch 0) or
// "manifest.e<epoch:020>" of an owner of epoch >= 1.
var manifestRE = regexp.MustCompile(`/chk/\d{20}/manifest(\.e(\d{20}))?$`)

// ownerRE matches a task's ownership record: bookkeeping of the task's
// owner, not checkpoint data.
var ownerRE = regexp.MustCompile(`/tasks/[^/]+/owner/\d{20}$`)

// isOwnerRecord reports whether a key or path is an ownership record.
func isOwnerRecord(rel string) bool { return ownerRE.MatchString(filepath.ToSlash(rel)) }

// newestManifestKey picks, of keys, the manifest of checkpoint n of task
// written by the newest epoch ("" if none): with one agent per task, the
// one every reader uses.
func newestManifestKey(keys []string, job, task string, n uint64) string {
	prefix := fmt.Sprintf("%s/tasks/%s/chk/%020d/", job, task, n)
	best, bestEpoch := "", ""
	for _, k := range keys {
		m := manifestRE.FindStringSubmatch(k)
		if m == nil || !strings.HasPrefix(k, prefix) {
			continue
		}
		if best == "" || m[2] > bestEpoch {
			best, bestEpoch = k, m[2]
		}
	}
	return best
}

// manifestPath is the file of checkpoint n's newest manifest in a file://
// storage directory ("" if none).
func manifestPath(storageDir, job, task string, n uint64) string {
	dir := filepath.Join(storageDir, filepath.FromSlash(fmt.Sprintf("%s/tasks/%s/chk/%020d", job, task, n)))
	entries, _ := os.ReadDir(dir)
	var keys []string
	for _, e := range entries {
		keys = append(keys, fmt.Sprintf("%s/tasks/%s/chk/%020d/%s", job, task, n, e.Name()))
	}
	k := newestManifestKey(keys, job, task, n)
	if k == "" {
		return ""
	}
	return filepath.Join(storageDir, filepath.FromSlash(k))
}

// readManifest reads and checks a manifest straight from a file:// storage
// directory, independently of the manifests package.
func readManifest(t *testing.T, storageDir, job, task string, n uint64) storedManifest {
	t.Helper()
	path := manifestPath(storageDir, job, task, n)
	if path == "" {
		t.Fatalf("read manifest: no manifest of %s checkpoint %d in %s", task, n, storageDir)
	}
	rel, err := filepath.Rel(storageDir, path)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.ToSlash(rel)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read manifest: %v", err)
	}
	return parseManifest(t, key, data)
}

// parseManifest checks a manifest's envelope and decodes the fields of its
// body the tests check, independently of the manifests package.
func parseManifest(t *testing.T, key string, data []byte) storedManifest {
	t.Helper()
	var env manifestEnvelope
	if err := json.Unmarshal(data, &env); err != nil {
		t.Fatalf("manifest %s: %v", key, err)
	}
	if env.Format == 2 {
		// Format 2's body is a compressed binary table: read it with the
		// library (which checks everything format 1's checks below do).
		m, err := manifests.Decode(data)
		if err != nil {
			t.Fatalf("manifest %s: %v", key, err)
		}
		sm := storedManifest{Key: key, Size: int64(len(data)), Task: m.Task, Checkpoint: m.Checkpoint,
			FullSize: m.FullSize, CheckpointSize: m.CheckpointSize, FilesUploaded: m.FilesUploaded, FilesReused: m.FilesReused}
		for _, f := range m.Files {
			sm.Files = append(sm.Files, manifestFile{Name: f.Name, Kind: string(f.Kind), Size: f.Size, SHA256: f.SHA256,
				BLAKE3: f.BLAKE3, Key: f.Key, Inline: f.Inline, Uploaded: f.Uploaded})
		}
		return sm
	}
	sum := sha256.Sum256(env.Body)
	if env.Format != 1 || env.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("manifest %s: format %d, checksum %s does not match its body (%x)", key, env.Format, env.SHA256, sum)
	}
	var body struct {
		Task           string         `json:"task"`
		Checkpoint     uint64         `json:"checkpoint"`
		Files          []manifestFile `json:"files"`
		FullSize       int64          `json:"full_size"`
		CheckpointSize int64          `json:"checkpoint_size"`
		FilesUploaded  int            `json:"files_uploaded"`
		FilesReused    int            `json:"files_reused"`
	}
	if err := json.Unmarshal(env.Body, &body); err != nil {
		t.Fatalf("manifest %s body: %v", key, err)
	}
	return storedManifest{Key: key, Size: int64(len(data)), Task: body.Task, Checkpoint: body.Checkpoint,
		Files: body.Files, FullSize: body.FullSize, CheckpointSize: body.CheckpointSize,
		FilesUploaded: body.FilesUploaded, FilesReused: body.FilesReused}
}

// treeSize is the sum of the sizes of the regular files under dir.
func treeSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if fi.Mode().IsRegular() && !isOwnerRecord(p) {
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return n
}

// fileState is what a listing remembers of a file.
type fileState struct {
	Size    int64
	ModTime time.Time
	Mode    fs.FileMode
}

// listTree lists every entry under dir by slash-separated relative path.
func listTree(t *testing.T, dir string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		st := fileState{Mode: fi.Mode().Type()}
		if fi.Mode().IsRegular() {
			st.Size, st.ModTime = fi.Size(), fi.ModTime()
		}
		out[filepath.ToSlash(rel)] = st
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return out
}

// diffTrees describes how two listings differ ("" when they are equal).
func diffTrees(before, after map[string]fileState) string {
	var d []string
	for k, b := range before {
		a, ok := after[k]
		switch {
		case !ok:
			d = append(d, "removed "+k)
		case a != b:
			d = append(d, fmt.Sprintf("changed %s: %+v -> %+v", k, b, a))
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			d = append(d, "added "+k)
		}
	}
	sort.Strings(d)
	return strings.Join(d, "\n")
}

// fileHashes maps each regular file directly in dir to its BLAKE3 content id.
func fileHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			t.Fatalf("%s: %s is not a regular file", dir, e.Name())
		}
		out[e.Name()] = hashFile(t, filepath.Join(dir, e.Name()))
	}
	return out
}

func hashFile(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatalf("hash: %v", err)
	}
	defer f.Close()
	d, n, err := manifests.HashReader(context.Background(), f, manifests.BLAKE3)
	if err != nil {
		t.Fatalf("hash %s: %v", p, err)
	}
	return manifests.ContentID(d, n) // as the agent's default format names it
}

// requireSameFiles requires two directories to hold the same file names
// with the same bytes.
func requireSameFiles(t *testing.T, want, got string) {
	t.Helper()
	w, g := fileHashes(t, want), fileHashes(t, got)
	var d []string
	for name, h := range w {
		switch gh, ok := g[name]; {
		case !ok:
			d = append(d, "missing "+name)
		case gh != h:
			d = append(d, fmt.Sprintf("%s differs: %s, want %s", name, gh, h))
		}
	}
	for name := range g {
		if _, ok := w[name]; !ok {
			d = append(d, "extra "+name)
		}
	}
	if len(d) > 0 {
		sort.Strings(d)
		t.Fatalf("%s is not byte-identical to %s:\n%s", got, want, strings.Join(d, "\n"))
	}
}

// copyDir copies the regular files of src into a new directory dst (real
// copies, not links).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// randomBytes returns n bytes that depend only on seed.
func randomBytes(n int, seed uint64) []byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	b := make([]byte, n)
	rand.NewChaCha8(s).Read(b)
	return b
}

func writeFile(t *testing.T, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// link hard-links every file of src into dst (created if needed).
func linkFiles(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Link(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// bigSet is a large set of random SSTs, written once per run and
// hard-linked into the snapshots of the tests that need a long upload.
var bigSet struct {
	once  sync.Once
	dir   string
	bytes int64
	files int
	err   error
}

const (
	bigFiles    = 160
	bigFileSize = 2 << 20 // 320 MiB in all
)

func bigSST(t *testing.T) (dir string, files int, bytes int64) {
	t.Helper()
	bigSet.once.Do(func() {
		bigSet.dir = filepath.Join(scratch, "big")
		if bigSet.err = os.MkdirAll(bigSet.dir, 0o755); bigSet.err != nil {
			return
		}
		for i := range bigFiles {
			data := randomBytes(bigFileSize, uint64(1000+i))
			p := filepath.Join(bigSet.dir, fmt.Sprintf("%06d.sst", 1000+i))
			if bigSet.err = os.WriteFile(p, data, 0o644); bigSet.err != nil {
				return
			}
			bigSet.bytes += int64(len(data))
			bigSet.files++
		}
	})
	if bigSet.err != nil {
		t.Fatalf("write the large SST set: %v", bigSet.err)
	}
	return bigSet.dir, bigSet.files, bigSet.bytes
}

// within reports whether got is within frac of want.
func within(got, want int64, frac float64) bool {
	d := float64(got - want)
	if d < 0 {
		d = -d
	}
	return d <= frac*float64(want)
}

// sharedObjects counts the finished shared objects of a job in a file://
// storage directory (temporary files excluded).
func sharedObjects(storageDir, job string) int {
	n := 0
	root := filepath.Join(storageDir, job, "shared")
	hh, _ := os.ReadDir(root)
	for _, d := range hh {
		objs, _ := os.ReadDir(filepath.Join(root, d.Name()))
		for _, o := range objs {
			if !strings.Contains(o.Name(), ".ckpt-tmp-") {
				n++
			}
		}
	}
	return n
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
