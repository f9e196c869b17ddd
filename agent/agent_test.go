package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ckpt-io/ckpt/client"
	_ "github.com/ckpt-io/ckpt/engines/pebble"
	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gate is a store whose Puts of shared objects wait until the gate opens:
// it holds checkpoints in their async phase for as long as a test needs.
type gate struct {
	storage.Store
	mu      sync.Mutex
	open    chan struct{}
	entered chan string
}

func newGate(s storage.Store) *gate {
	return &gate{Store: s, open: make(chan struct{}), entered: make(chan string, 100)}
}

func (g *gate) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if strings.Contains(key, "/shared/") {
		select {
		case g.entered <- key:
		default:
		}
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Store.Put(ctx, key, body, size)
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

type harness struct {
	t       *testing.T
	root    string // allowed root holding snapshots
	storeFS string
	store   storage.Store
	socket  string
	local   string
	a       *Agent
	cancel  context.CancelFunc
	done    chan error
}

func start(t *testing.T, wrap func(storage.Store) storage.Store, mod func(*Config)) *harness {
	t.Helper()
	base := t.TempDir()
	h := &harness{t: t, root: filepath.Join(base, "apps"), storeFS: filepath.Join(base, "store"),
		socket: filepath.Join(base, "ckpt.sock"), local: filepath.Join(base, "apps", "local")}
	os.MkdirAll(h.root, 0o755)
	fs, err := file.New(h.storeFS)
	if err != nil {
		t.Fatal(err)
	}
	h.store = fs
	if wrap != nil {
		h.store = wrap(fs)
	}
	cfg := Config{Socket: h.socket, Store: h.store, Job: "job", LocalDir: h.local,
		AllowRoots: []string{h.root}, GCGrace: time.Hour, ShutdownGrace: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	h.a, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.a.Run(ctx) }()
	select {
	case <-h.a.Ready():
	case err := <-h.done:
		t.Fatalf("agent did not start: %v", err)
	}
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("agent run: %v", err)
		}
		h.done <- nil
	case <-time.After(30 * time.Second):
		h.t.Fatal("agent did not stop")
	}
}

func (h *harness) dial() *client.Client {
	c, err := client.Dial(context.Background(), h.socket)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// snapshot writes files (name → size, deterministic content by name) into a
// fresh dir under the allowed root.
func (h *harness) snapshot(name string, files map[string]int) string {
	dir := filepath.Join(h.root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	for f, size := range files {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(len(f)*31 + i*7 + int(f[0]))
		}
		copy(b, f)
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			h.t.Fatal(err)
		}
	}
	return dir
}

func ctxT(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// An engine the agent does not know is refused before anything is linked
// or written: a wrong classification could call a mutable file shared.
func TestAnUnknownEngineIsRefused(t *testing.T) {
	h := start(t, nil, nil)
	c := h.dial()
	dir := h.snapshot("s1", map[string]int{"000001.sst": 1000, "CURRENT": 16})
	p, err := c.Checkpoint(ctxT(t), "t1", 1, dir, "leveldb")
	if err == nil {
		_, err = p.Wait(ctxT(t))
	}
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeBadRequest || !strings.Contains(pe.Message, `unknown engine "leveldb"`) {
		t.Fatalf("checkpoint with engine leveldb: %v, want bad_request naming the engine", err)
	}
	var keys []string
	h.store.List(ctxT(t), "", func(o storage.ObjectInfo) error { keys = append(keys, o.Key); return nil })
	if len(keys) != 0 {
		t.Fatalf("a refused request wrote %v", keys)
	}
	var left []string
	filepath.WalkDir(h.local, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() != localrecovery.LockFile {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("a refused request left %v in the local dir", left)
	}
}

func TestCheckpointUploadsOnlyNewSharedFiles(t *testing.T) {
	h := start(t, nil, nil)
	c := h.dial()
	files := map[string]int{"000001.sst": 300_000, "000002.sst": 200_000, "CURRENT": 16, "MANIFEST-000001": 100_000}
	dir := h.snapshot("s1", files)
	p, err := c.Checkpoint(ctxT(t), "t1", 1, dir, "pebble")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := p.Wait(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if ev.FilesUploaded != 4 || ev.FilesReused != 0 || ev.FullSize != 600_016 {
		t.Fatalf("first checkpoint: %+v", ev)
	}
	files["000003.sst"] = 50_000
	dir2 := h.snapshot("s2", files)
	p, err = c.Checkpoint(ctxT(t), "t1", 2, dir2, "pebble")
	if err != nil {
		t.Fatal(err)
	}
	ev, err = p.Wait(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if ev.FilesReused != 2 || ev.FilesUploaded != 3 {
		t.Fatalf("second checkpoint reused %d uploaded %d, want 2 and 3", ev.FilesReused, ev.FilesUploaded)
	}
	// checkpoint size: the new SST, the 100 KB private object, and the manifest.
	m, err := manifests.Load(ctxT(t), h.store, "job", "t1", 2)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := h.store.Stat(ctxT(t), manifests.ManifestKeyOf("job", "t1", 2, m.Epoch))
	if want := int64(50_000+100_000) + info.Size; ev.CheckpointSize != want || m.CheckpointSize != want {
		t.Fatalf("checkpoint size reported %d, manifest %d, want %d", ev.CheckpointSize, m.CheckpointSize, want)
	}
	st, err := c.Status(ctxT(t), "t1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st.Raw), `"last_completed":2`) {
		t.Fatalf("status: %s", st.Raw)
	}
}

func TestStaleAndDuplicateCheckpointNumbersConflict(t *testing.T) {
	h := start(t, nil, nil)
	c := h.dial()
	dir := h.snapshot("s", map[string]int{"000001.sst": 1000, "CURRENT": 10})
	p, err := c.Checkpoint(ctxT(t), "t1", 5, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{5, 3} {
		_, err := c.Checkpoint(ctxT(t), "t1", n, dir, "")
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != protocol.CodeConflict {
			t.Fatalf("checkpoint %d after 5: got %v, want conflict", n, err)
		}
	}
}

// rawConn speaks the protocol line by line, as socat would.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (h *harness) raw() *rawConn {
	c, err := net.Dial("unix", h.socket)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return &rawConn{t: h.t, c: c, r: bufio.NewReaderSize(c, 1<<20)}
}

func (r *rawConn) send(line string) map[string]any {
	r.t.Helper()
	r.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(r.c, line+"\n"); err != nil {
		r.t.Fatal(err)
	}
	return r.next()
}

func (r *rawConn) next() map[string]any {
	r.t.Helper()
	line, err := r.r.ReadBytes('\n')
	if err != nil {
		r.t.Fatalf("read reply: %v", err)
	}
	var ev map[string]any
	if err := json.Unmarshal(line, &ev); err != nil {
		r.t.Fatalf("reply is not JSON: %q", line)
	}
	return ev
}

func code(ev map[string]any) string {
	e, _ := ev["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func TestBadInputGetsBadRequestAndChangesNothing(t *testing.T) {
	h := start(t, nil, nil)
	r := h.raw()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "000001.sst"), []byte("secret"), 0o644)
	escape := filepath.Join(h.root, "escape")
	os.Symlink(outside, escape)
	withLink := h.snapshot("withlink", map[string]int{"000001.sst": 100})
	os.Symlink("/etc/passwd", filepath.Join(withLink, "000002.sst"))
	withDir := h.snapshot("withdir", map[string]int{"000001.sst": 100})
	os.Mkdir(filepath.Join(withDir, "sub"), 0o755)
	withFifo := h.snapshot("withfifo", map[string]int{"000001.sst": 100})
	if err := syscall.Mkfifo(filepath.Join(withFifo, "LOCK"), 0o644); err != nil {
		t.Fatal(err)
	}

	cases := []struct{ name, line string }{
		{"garbage", "garbage"},
		{"a JSON array", `[1,2]`},
		{"an unknown op", `{"op":"explode"}`},
		{"no op", `{"task":"t"}`},
		{"a bad task name", `{"op":"checkpoint","task":"../x","checkpoint":1,"dir":"` + withDir + `"}`},
		{"checkpoint zero", `{"op":"checkpoint","task":"t","checkpoint":0,"dir":"` + withDir + `"}`},
		{"a fractional checkpoint", `{"op":"checkpoint","task":"t","checkpoint":1.5,"dir":"` + withDir + `"}`},
		{"a negative checkpoint", `{"op":"checkpoint","task":"t","checkpoint":-1,"dir":"` + withDir + `"}`},
		{"a relative dir", `{"op":"checkpoint","task":"t","checkpoint":1,"dir":"rel/dir"}`},
		{"a dir outside the roots", `{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/etc"}`},
		{"a dir escaping by dot-dot", `{"op":"checkpoint","task":"t","checkpoint":1,"dir":"` + h.root + `/../../.."}`},
		{"a dir escaping by symlink", `{"op":"checkpoint","task":"t","checkpoint":1,"dir":"` + escape + `"}`},
		{"a snapshot holding a symlink", `{"op":"checkpoint","task":"t","checkpoint":1,"dir":"` + withLink + `"}`},
		{"a snapshot holding a named pipe", `{"op":"checkpoint","task":"t","checkpoint":1,"dir":"` + withFifo + `"}`},
		{"a snapshot holding a directory", `{"op":"checkpoint","task":"t","checkpoint":1,"dir":"` + withDir + `"}`},
		{"a line over 1 MiB", `{"op":"hello","pad":"` + strings.Repeat("x", protocol.MaxLine+10) + `"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := r.send(tc.line)
			if code(ev) != protocol.CodeBadRequest {
				t.Fatalf("reply %v, want code bad_request", ev)
			}
			if hello := r.send(`{"op":"hello","id":7}`); hello["event"] != "hello" || hello["protocol"] != float64(1) || hello["id"] != float64(7) {
				t.Fatalf("after bad input, hello got %v", hello)
			}
		})
	}
	var objects []string
	h.store.List(context.Background(), "", func(o storage.ObjectInfo) error { objects = append(objects, o.Key); return nil })
	if len(objects) != 0 {
		t.Fatalf("refused requests stored objects: %v", objects)
	}
	msg := r.send(`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"` + withLink + `"}`)
	if m, _ := msg["error"].(map[string]any)["message"].(string); !strings.Contains(m, "000002.sst") {
		t.Fatalf("symlink refusal does not name the file: %v", msg)
	}
}

func TestAbortStopsAnInFlightCheckpoint(t *testing.T) {
	var g *gate
	h := start(t, func(s storage.Store) storage.Store { g = newGate(s); return g }, nil)
	c := h.dial()
	dir := h.snapshot("s", map[string]int{"000001.sst": 1000, "000002.sst": 1000, "CURRENT": 10})
	p, err := c.Checkpoint(ctxT(t), "t1", 1, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered // the upload is under way
	if _, err := c.Abort(ctxT(t), "t1", 1); err != nil {
		t.Fatalf("abort: %v", err)
	}
	if _, err := p.Wait(ctxT(t)); !errors.Is(err, client.ErrAborted) {
		t.Fatalf("checkpoint after abort: %v, want aborted", err)
	}
	if _, err := h.store.Stat(ctxT(t), manifests.ManifestKey("job", "t1", 1)); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("aborted checkpoint has a manifest: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.local, "job", "t1", fmt.Sprintf("%020d", 1))); !os.IsNotExist(err) {
		t.Fatal("aborted checkpoint's local copy was kept")
	}
	if _, err := c.Abort(ctxT(t), "t1", 1); err == nil || !strings.Contains(err.Error(), protocol.CodeNotFound) {
		t.Fatalf("second abort: %v, want not_found", err)
	}
	g.release()
	// The task goes on: the same number can be taken again.
	p, err = c.Checkpoint(ctxT(t), "t1", 1, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// GC leaves no orphan of the aborted attempt once past the grace.
	rep, err := gc.Collect(ctxT(t), h.store, "job", gc.Options{Grace: 0})
	if err != nil {
		t.Fatal(err)
	}
	if rep.LiveObjects != 2 {
		t.Fatalf("live objects %d, want the 2 SSTs", rep.LiveObjects)
	}
}

func TestSyncPhasesQueueUpToABound(t *testing.T) {
	var g *gate
	h := start(t, func(s storage.Store) storage.Store { g = newGate(s); return g }, func(c *Config) { c.MaxQueued = 2 })
	c := h.dial()
	var pending []*client.Pending
	for n := uint64(1); n <= 3; n++ {
		dir := h.snapshot(fmt.Sprint("s", n), map[string]int{fmt.Sprintf("%06d.sst", n): 1000, "CURRENT": 10})
		start := time.Now()
		p, err := c.Checkpoint(ctxT(t), "t1", n, dir, "")
		if err != nil {
			t.Fatalf("checkpoint %d: %v", n, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("sync phase of queued checkpoint %d took %v", n, d)
		}
		pending = append(pending, p)
		if n == 1 {
			<-g.entered
		}
	}
	dir := h.snapshot("s4", map[string]int{"000004.sst": 1000})
	_, err := c.Checkpoint(ctxT(t), "t1", 4, dir, "")
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != protocol.CodeUnavailable {
		t.Fatalf("checkpoint beyond the queue bound: %v, want unavailable", err)
	}
	g.release()
	for i, p := range pending {
		ev, err := p.Wait(ctxT(t))
		if err != nil {
			t.Fatalf("queued checkpoint %d: %v", i+1, err)
		}
		if ev.Checkpoint != uint64(i+1) {
			t.Fatalf("completion order: got %d at %d", ev.Checkpoint, i)
		}
	}
}

func TestShutdownFinishesInFlightWork(t *testing.T) {
	var g *gate
	h := start(t, func(s storage.Store) storage.Store { g = newGate(s); return g }, nil)
	c := h.dial()
	dir := h.snapshot("s", map[string]int{"000001.sst": 1000})
	p, err := c.Checkpoint(ctxT(t), "t1", 1, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered
	h.cancel() // SIGTERM
	time.Sleep(100 * time.Millisecond)
	if _, err := c.Hello(ctxT(t)); err != nil {
		t.Fatalf("agent stopped answering during its grace: %v", err)
	}
	_, err = c.Checkpoint(ctxT(t), "t1", 2, dir, "")
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != protocol.CodeUnavailable {
		t.Fatalf("new checkpoint while stopping: %v, want unavailable", err)
	}
	g.release()
	if _, err := p.Wait(ctxT(t)); err != nil {
		t.Fatalf("in-flight checkpoint did not finish: %v", err)
	}
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	h.done <- nil
	if _, err := os.Stat(h.socket); !os.IsNotExist(err) {
		t.Fatal("socket file left behind")
	}
}

func TestShutdownGraceAbortsStuckWork(t *testing.T) {
	h := start(t, func(s storage.Store) storage.Store { return newGate(s) }, func(c *Config) { c.ShutdownGrace = 200 * time.Millisecond })
	c := h.dial()
	p, err := c.Checkpoint(ctxT(t), "t1", 1, h.snapshot("s", map[string]int{"000001.sst": 10}), "")
	if err != nil {
		t.Fatal(err)
	}
	h.cancel()
	ev, err := p.Wait(ctxT(t))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != protocol.CodeUnavailable {
		t.Fatalf("stuck checkpoint at shutdown: %v %+v, want unavailable", err, ev)
	}
}

func TestSocketIsPrivateAndNotStolen(t *testing.T) {
	h := start(t, nil, nil)
	fi, err := os.Stat(h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o660 {
		t.Fatalf("socket mode %o, want 660", perm)
	}
	if _, err := listen(h.socket); err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	// A stale socket (nobody listening) is replaced.
	stale := filepath.Join(t.TempDir(), "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	l2, err := listen(stale)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	l2.Close()
	// A regular file in the way is left alone.
	plain := filepath.Join(t.TempDir(), "file")
	os.WriteFile(plain, []byte("x"), 0o644)
	if _, err := listen(plain); err == nil {
		t.Fatal("listen replaced a regular file")
	}
}

func TestRetentionKeepsNewestAndRestartRebuildsFromStorage(t *testing.T) {
	h := start(t, nil, func(c *Config) { c.Retain = 2; c.GCInterval = -1 })
	c := h.dial()
	for n := uint64(1); n <= 4; n++ {
		dir := h.snapshot(fmt.Sprint("s", n), map[string]int{fmt.Sprintf("%06d.sst", n): 1000, "000000.sst": 500, "CURRENT": 10})
		p, err := c.Checkpoint(ctxT(t), "t1", n, dir, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Wait(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	cat, err := manifests.Scan(ctxT(t), h.store, "job", "t1")
	if err != nil {
		t.Fatal(err)
	}
	var kept []uint64
	for _, r := range cat.Retained("t1") {
		kept = append(kept, r.Checkpoint)
	}
	if fmt.Sprint(kept) != "[3 4]" {
		t.Fatalf("retained %v, want [3 4]", kept)
	}
	h.stop()
	// A new agent on a fresh local dir learns the task from storage alone.
	h2 := start(t, func(storage.Store) storage.Store { return h.store }, nil)
	c2 := h2.dial()
	dir := h2.snapshot("s5", map[string]int{"000004.sst": 1000, "000000.sst": 500, "000005.sst": 700, "CURRENT": 10})
	p, err := c2.Checkpoint(ctxT(t), "t1", 5, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := p.Wait(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if ev.FilesReused != 2 {
		t.Fatalf("after restart reused %d files, want 2", ev.FilesReused)
	}
	if _, err := c2.Checkpoint(ctxT(t), "t1", 4, dir, ""); err == nil {
		t.Fatal("checkpoint 4 after 5 was accepted")
	}
}

func TestAHandedOffSnapshotIsMovedNotLinked(t *testing.T) {
	h := start(t, nil, nil)
	c := h.dial()
	dir := h.snapshot("handoff", map[string]int{"000001.sst": 1000, "CURRENT": 10})
	p, err := c.Send(ctxT(t), client.Request{Task: "t1", Checkpoint: 1, Dir: dir, Handoff: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatal("the handed-off snapshot dir is still there after synced")
	}
	ev, err := p.Wait(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if ev.FilesUploaded != 2 || ev.FullSize != 1010 {
		t.Fatalf("completed %+v", ev)
	}
	if _, err := os.Stat(filepath.Join(h.local, "job", "t1", fmt.Sprintf("%020d", 1), "000001.sst")); err != nil {
		t.Fatalf("local copy of the handed-off snapshot: %v", err)
	}
}

func TestTheRestoreOpRestoresInsideTheRootsOnly(t *testing.T) {
	var h *harness
	h = start(t, nil, func(c *Config) {
		c.Restore = func(ctx context.Context, r RestoreRequest) (*restore.Result, error) {
			return restore.Run(ctx, restore.Options{Store: h.store, Job: "job", Task: r.Task, Checkpoint: r.Checkpoint,
				JobConsistent: r.JobConsistent, Target: r.Target, TargetParent: r.Parent, LocalDir: h.local})
		}
	})
	c := h.dial()
	dir := h.snapshot("s", map[string]int{"000001.sst": 5000, "CURRENT": 10})
	p, err := c.Checkpoint(ctxT(t), "t1", 1, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r := h.raw()
	target := filepath.Join(h.root, "restored")
	ev := r.send(`{"op":"restore","task":"t1","target":"` + target + `","id":"r1"}`)
	if ev["event"] != "restored" || ev["restored"] != true || ev["checkpoint"] != float64(1) || ev["bytes"] != float64(5010) || ev["id"] != "r1" {
		t.Fatalf("restore op: %v", ev)
	}
	if b, _ := os.ReadFile(filepath.Join(target, "CURRENT")); len(b) != 10 {
		t.Fatal("restored store lacks CURRENT")
	}
	if ev := r.send(`{"op":"restore","task":"t1","target":"` + target + `"}`); code(ev) != protocol.CodeConflict {
		t.Fatalf("restore into a non-empty target: %v", ev)
	}
	if ev := r.send(`{"op":"restore","task":"nobody","target":"` + filepath.Join(h.root, "x") + `"}`); code(ev) != protocol.CodeNotFound {
		t.Fatalf("restore of a task without checkpoints: %v", ev)
	}
	outside := filepath.Join(t.TempDir(), "evil")
	if ev := r.send(`{"op":"restore","task":"t1","target":"` + outside + `"}`); code(ev) != protocol.CodeBadRequest {
		t.Fatalf("restore outside the roots: %v", ev)
	}
	if _, err := os.Stat(outside); !os.IsNotExist(err) {
		t.Fatal("a refused restore wrote outside the roots")
	}
}
