package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// dialAs connects to socket with the credentials uid and gid, as a process
// of that user would: on an OS thread of its own whose ids are changed
// (setresgid, setresuid on that thread only), which the runtime then
// discards. The kernel records the thread's ids as the peer's
// (SO_PEERCRED), and the connection works from any goroutine.
func dialAs(socket string, uid, gid uint32) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			ch <- result{err: fmt.Errorf("setresgid: %w", e)}
			return
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			ch <- result{err: fmt.Errorf("setresuid: %w", e)}
			return
		}
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: err}
			return
		}
		if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: socket}); err != nil {
			syscall.Close(fd)
			ch <- result{err: fmt.Errorf("connect as uid %d: %w", uid, err)}
			return
		}
		f := os.NewFile(uintptr(fd), socket)
		c, err := net.FileConn(f)
		f.Close()
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// tenantNode is a node agent with two tenants, alpha (uid 2001) and beta
// (uid 2002), each with its own root, job and task pattern, sharing one
// file:// store.
type tenantNode struct {
	t          *testing.T
	socket     string
	rootA      string
	rootB      string
	local      string
	storeFS    string
	store      storage.Store
	a          *Agent
	stop       func()
	uidA, uidB uint32
}

func startTenants(t *testing.T) *tenantNode {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: peers of other uids are made by changing a thread's ids")
	}
	base := t.TempDir()
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // the tenants' peers must reach the socket
	}
	n := &tenantNode{t: t, socket: filepath.Join(base, "ckpt.sock"), rootA: filepath.Join(base, "tenants", "alpha"),
		rootB: filepath.Join(base, "tenants", "beta"), local: filepath.Join(base, "tenants", "local"), storeFS: filepath.Join(base, "store"),
		uidA: 2001, uidB: 2002}
	for _, d := range []string{n.rootA, n.rootB, n.storeFS} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chown(n.rootA, int(n.uidA), int(n.uidA))
	os.Chown(n.rootB, int(n.uidB), int(n.uidB))
	fs, err := file.New(n.storeFS)
	if err != nil {
		t.Fatal(err)
	}
	n.store = fs
	doc := fmt.Sprintf(`tenants:
- {name: alpha, uid: %d, job: alpha, storage: "file://%s", allow_roots: [%s], tasks: "a-*"}
- {name: beta, uid: %d, gid: %d, job: beta, storage: "file://%s", allow_roots: [%s], tasks: "re:b-[0-9]+"}
`, n.uidA, n.storeFS, n.rootA, n.uidB, n.uidB, n.storeFS, n.rootB)
	tenants, err := ParseTenants([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Socket: n.socket, LocalDir: n.local, Tenants: tenants, GCGrace: time.Hour, ShutdownGrace: 5 * time.Second,
		TenantServices: func(tn Tenant, dir string) (TenantServices, error) {
			job := tn.Job
			return TenantServices{Store: fs, Restore: func(ctx context.Context, r RestoreRequest) (*restore.Result, error) {
				return restore.Run(ctx, restore.Options{Store: fs, Job: job, Task: r.Task, Checkpoint: r.Checkpoint,
					JobConsistent: r.JobConsistent, Target: r.Target, TargetParent: r.Parent, LocalDir: dir})
			}}, nil
		}}
	n.a, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.a.Run(ctx) }()
	select {
	case <-n.a.Ready():
	case err := <-done:
		t.Fatalf("node agent did not start: %v", err)
	}
	os.Chmod(n.socket, 0o666) // in Kubernetes: fsGroup or a shared group
	n.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node agent: %v", err)
		}
	}
	t.Cleanup(n.stop)
	return n
}

// as connects as uid (its gid the same number).
func (n *tenantNode) as(uid uint32) *rawConn {
	n.t.Helper()
	c, err := dialAs(n.socket, uid, uid)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { c.Close() })
	return &rawConn{t: n.t, c: c, r: bufio.NewReaderSize(c, 1<<20)}
}

// snapshot writes a snapshot dir under root owned by uid, as the tenant's
// app would make it.
func (n *tenantNode) snapshot(root, name string, uid uint32, files map[string]string) string {
	n.t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	os.Chown(dir, int(uid), int(uid))
	for f, content := range files {
		p := filepath.Join(dir, f)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			n.t.Fatal(err)
		}
		os.Chown(p, int(uid), int(uid))
	}
	return dir
}

// keys lists every object in storage.
func (n *tenantNode) keys() []string {
	var out []string
	n.store.List(context.Background(), "", func(o storage.ObjectInfo) error { out = append(out, o.Key); return nil })
	slices.Sort(out)
	return out
}

// checkpoint sends a checkpoint and returns its last event.
func (r *rawConn) checkpoint(line string) map[string]any {
	r.t.Helper()
	ev := r.send(line)
	if ev["event"] == "synced" {
		ev = r.next()
	}
	return ev
}

// TestTenantsCheckpointAndRestoreTheirOwnJobs: two tenants of one node
// agent, peers of different uids, each checkpoint and restore their own
// job, see only their own tasks, and get restored stores they own.
func TestTenantsCheckpointAndRestoreTheirOwnJobs(t *testing.T) {
	n := startTenants(t)
	a, b := n.as(n.uidA), n.as(n.uidB)
	dirA := n.snapshot(n.rootA, "chk-1", n.uidA, map[string]string{"000001.sst": "alpha's data", "CURRENT": "MANIFEST-1"})
	dirB := n.snapshot(n.rootB, "chk-1", n.uidB, map[string]string{"000007.sst": "beta's data", "CURRENT": "MANIFEST-7"})
	if ev := a.checkpoint(fmt.Sprintf(`{"op":"checkpoint","task":"a-0","checkpoint":1,"dir":%q}`, dirA)); ev["event"] != "completed" {
		t.Fatalf("alpha's checkpoint: %v", ev)
	}
	if ev := b.checkpoint(fmt.Sprintf(`{"op":"checkpoint","job":"beta","task":"b-0","checkpoint":1,"dir":%q}`, dirB)); ev["event"] != "completed" {
		t.Fatalf("beta's checkpoint naming its job: %v", ev)
	}
	var alphaKeys, betaKeys int
	for _, k := range n.keys() {
		switch {
		case len(k) > 6 && k[:6] == "alpha/":
			alphaKeys++
		case len(k) > 5 && k[:5] == "beta/":
			betaKeys++
		default:
			t.Errorf("object outside the tenants' jobs: %s", k)
		}
	}
	if alphaKeys == 0 || betaKeys == 0 {
		t.Fatalf("objects per job: alpha %d, beta %d", alphaKeys, betaKeys)
	}
	// Local copies are per tenant.
	for _, p := range []string{filepath.Join(n.local, "alpha", "alpha", "a-0"), filepath.Join(n.local, "beta", "beta", "b-0")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("local copy: %v", err)
		}
	}
	// status shows the peer's tenant's tasks only.
	for r, want := range map[*rawConn]string{a: "a-0", b: "b-0"} {
		ev := r.send(`{"op":"status"}`)
		tasks, _ := ev["tasks"].([]any)
		if len(tasks) != 1 || tasks[0].(map[string]any)["task"] != want {
			t.Errorf("status: %v, want only %s", ev, want)
		}
	}
	// Each restores its own task into its own root, and owns the result.
	for _, c := range []struct {
		r    *rawConn
		task string
		root string
		uid  uint32
		file string
		data string
	}{{a, "a-0", n.rootA, n.uidA, "000001.sst", "alpha's data"}, {b, "b-0", n.rootB, n.uidB, "000007.sst", "beta's data"}} {
		target := filepath.Join(c.root, "restored")
		ev := c.r.send(fmt.Sprintf(`{"op":"restore","task":%q,"target":%q}`, c.task, target))
		if ev["event"] != "restored" || ev["restored"] != true {
			t.Fatalf("restore of %s: %v", c.task, ev)
		}
		if got, _ := os.ReadFile(filepath.Join(target, c.file)); string(got) != c.data {
			t.Fatalf("restored %s: %q", c.file, got)
		}
		for _, p := range []string{target, filepath.Join(target, c.file)} {
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err != nil || st.Uid != c.uid {
				t.Errorf("%s is owned by uid %d, want the tenant's %d (%v)", p, st.Uid, c.uid, err)
			}
		}
	}
}

// TestATenantReachesNothingOfAnother: alpha's peer naming beta's job, a
// task of beta's pattern, a directory or target under beta's root, or a
// snapshot holding a hard link to beta's file, gets forbidden, and storage
// and beta's directories are unchanged; a uid that matches no tenant is
// forbidden at connect.
func TestATenantReachesNothingOfAnother(t *testing.T) {
	n := startTenants(t)
	a := n.as(n.uidA)
	dirB := n.snapshot(n.rootB, "chk-1", n.uidB, map[string]string{"000007.sst": "beta's data", "CURRENT": "MANIFEST-7"})
	before := n.keys()
	cases := []struct{ name, line string }{}
	dirA := n.snapshot(n.rootA, "chk-1", n.uidA, map[string]string{"000001.sst": "alpha's data", "CURRENT": "MANIFEST-1"})
	linked := n.snapshot(n.rootA, "chk-2", n.uidA, map[string]string{"CURRENT": "MANIFEST-1"})
	if err := os.Link(filepath.Join(dirB, "000007.sst"), filepath.Join(linked, "000007.sst")); err != nil {
		t.Fatal(err)
	}
	// A name inside alpha's root that leads into beta's.
	if err := os.Symlink(dirB, filepath.Join(n.rootA, "to-beta")); err != nil {
		t.Fatal(err)
	}
	// A snapshot dir of another user (root) inside alpha's root, its files
	// the dir owner's: not alpha's to ship.
	rootOwned := n.snapshot(n.rootA, "chk-root", 0, map[string]string{"000009.sst": "root's data"})
	cases = append(cases,
		struct{ name, line string }{"a path plainly outside its roots", `{"op":"checkpoint","task":"a-0","checkpoint":1,"dir":"/nonexistent-of-beta/chk"}`},
		struct{ name, line string }{"a symlink into beta's root", fmt.Sprintf(`{"op":"checkpoint","task":"a-0","checkpoint":1,"dir":%q}`, filepath.Join(n.rootA, "to-beta"))},
		struct{ name, line string }{"a snapshot dir of another user", fmt.Sprintf(`{"op":"checkpoint","task":"a-0","checkpoint":1,"dir":%q}`, rootOwned)},
		struct{ name, line string }{"beta's job", fmt.Sprintf(`{"op":"checkpoint","job":"beta","task":"a-0","checkpoint":1,"dir":%q}`, dirA)},
		struct{ name, line string }{"a task of beta's pattern", fmt.Sprintf(`{"op":"checkpoint","task":"b-0","checkpoint":1,"dir":%q}`, dirA)},
		struct{ name, line string }{"beta's directory", fmt.Sprintf(`{"op":"checkpoint","task":"a-0","checkpoint":1,"dir":%q}`, dirB)},
		struct{ name, line string }{"a hard link to beta's file", fmt.Sprintf(`{"op":"checkpoint","task":"a-0","checkpoint":1,"dir":%q}`, linked)},
		struct{ name, line string }{"a restore of beta's job", fmt.Sprintf(`{"op":"restore","job":"beta","task":"a-0","target":%q}`, filepath.Join(n.rootA, "r1"))},
		struct{ name, line string }{"a restore of beta's task", fmt.Sprintf(`{"op":"restore","task":"b-0","target":%q}`, filepath.Join(n.rootA, "r2"))},
		struct{ name, line string }{"a restore into beta's root", fmt.Sprintf(`{"op":"restore","task":"a-0","target":%q}`, filepath.Join(n.rootB, "r3"))},
		struct{ name, line string }{"a status of beta's task", `{"op":"status","task":"b-0"}`},
		struct{ name, line string }{"an abort of beta's task", `{"op":"abort","task":"b-0","checkpoint":1}`},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev := a.checkpoint(c.line)
			if code(ev) != "forbidden" {
				t.Fatalf("%s: %v, want forbidden", c.name, ev)
			}
			if got := n.keys(); !slices.Equal(got, before) {
				t.Fatalf("%s changed storage: %v", c.name, got)
			}
		})
	}
	for _, p := range []string{filepath.Join(n.rootA, "r1"), filepath.Join(n.rootA, "r2"), filepath.Join(n.rootB, "r3")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("a refused restore made %s", p)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(n.local, "alpha", "alpha"))
	for _, e := range entries {
		sub, _ := os.ReadDir(filepath.Join(n.local, "alpha", "alpha", e.Name()))
		if len(sub) != 0 {
			t.Errorf("a refused checkpoint left a local copy: %s %v", e.Name(), sub)
		}
	}
	// The same requests within alpha's own bounds work: the refusals above
	// were the tenant's rules, not a broken agent.
	if ev := a.checkpoint(fmt.Sprintf(`{"op":"checkpoint","job":"alpha","task":"a-0","checkpoint":1,"dir":%q}`, dirA)); ev["event"] != "completed" {
		t.Fatalf("alpha's own checkpoint: %v", ev)
	}

	// A uid of no tenant is refused at connect, before any request.
	stranger := n.as(2999)
	stranger.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if ev := stranger.next(); ev["event"] != "error" || code(ev) != "forbidden" {
		t.Fatalf("a peer of no tenant: %v, want forbidden", ev)
	}
	// beta matches uid 2002 and gid 2002 both: uid 2002 with another gid is no one's.
	c, err := dialAs(n.socket, n.uidB, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &rawConn{t: t, c: c, r: bufio.NewReader(c)}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if ev := r.next(); code(ev) != "forbidden" {
		t.Fatalf("beta's uid with another gid: %v, want forbidden", ev)
	}
}

// TestASidecarRefusesAnotherJob: a sidecar serves its one job; a request
// naming another is forbidden and writes nothing, one naming its own job
// is served as one naming none.
func TestASidecarRefusesAnotherJob(t *testing.T) {
	h := start(t, nil, nil)
	r := h.raw()
	dir := h.snapshot("s", map[string]int{"000001.sst": 100, "CURRENT": 10})
	for _, line := range []string{
		fmt.Sprintf(`{"op":"checkpoint","job":"other","task":"t","checkpoint":1,"dir":%q}`, dir),
		fmt.Sprintf(`{"op":"restore","job":"other","task":"t","target":%q}`, filepath.Join(h.root, "r")),
		`{"op":"status","job":"other"}`,
	} {
		if ev := r.checkpoint(line); code(ev) != "forbidden" {
			t.Fatalf("%s: %v, want forbidden", line, ev)
		}
	}
	if keys := h.storedKeys(); len(keys) != 0 {
		t.Fatalf("a refused request stored %v", keys)
	}
	if ev := r.checkpoint(fmt.Sprintf(`{"op":"checkpoint","job":"job","task":"t","checkpoint":1,"dir":%q}`, dir)); ev["event"] != "completed" {
		t.Fatalf("naming the agent's own job: %v", ev)
	}
}

// TestACgroupTenantMatchesThePeersRealCgroup: the peer's pid from
// SO_PEERCRED leads to its cgroup v2 path in /proc; a tenant whose cgroup
// the peer is not in does not match it.
func TestACgroupTenantMatchesThePeersRealCgroup(t *testing.T) {
	own, err := peerCgroup(int32(os.Getpid()))
	if err != nil {
		t.Skipf("no cgroup v2 path here: %v", err)
	}
	uid := os.Getuid()
	for _, c := range []struct {
		cgroup string
		want   string
	}{{own, "hello"}, {filepath.Join(own, "no-such-pod"), "error"}} {
		base := t.TempDir()
		root := filepath.Join(base, "root")
		os.MkdirAll(root, 0o755)
		fs, err := file.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		tenants, err := ParseTenants(fmt.Appendf(nil, "tenants:\n- {name: a, uid: %d, cgroup: %q, job: a, storage: \"file:///x\", allow_roots: [%s], tasks: \"*\"}\n", uid, c.cgroup, root))
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(Config{Socket: filepath.Join(base, "s.sock"), LocalDir: filepath.Join(base, "local"), Tenants: tenants, GCGrace: time.Hour,
			TenantServices: func(Tenant, string) (TenantServices, error) { return TenantServices{Store: fs}, nil }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		<-a.Ready()
		// A refused peer gets its error and is closed, perhaps before hello
		// is written: the write's error does not matter, the reply does.
		var line string
		nc, err := net.Dial("unix", filepath.Join(base, "s.sock"))
		if err == nil {
			nc.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(nc, `{"op":"hello"}`+"\n")
			line, err = bufio.NewReader(nc).ReadString('\n')
			nc.Close()
		}
		cancel()
		<-done
		var ev map[string]any
		json.Unmarshal([]byte(line), &ev)
		if err != nil || ev["event"] != c.want {
			t.Errorf("a peer in cgroup %s, tenant cgroup %s: %q %v, want %s", own, c.cgroup, line, err, c.want)
		}
	}
}

// TestARestoredTargetReplacedByThePeerIsNotGivenAway: giveTo changes the
// target only while it is the agent's own directory; one the peer swapped
// in (its own, holding a link to a file of someone else) is left alone.
func TestARestoredTargetReplacedByThePeerIsNotGivenAway(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to own files as another uid")
	}
	parent := t.TempDir()
	swapped := filepath.Join(parent, "target")
	os.Mkdir(swapped, 0o755)
	os.Chown(swapped, 2001, 2001)
	victim := filepath.Join(swapped, "shadow")
	os.WriteFile(victim, []byte("root's"), 0o600) // root's file, as a link would show it
	pf, err := os.Open(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	if err := giveTo(pf, "target", Peer{UID: 2001, GID: 2001}); err == nil {
		t.Fatal("a target the peer replaced was given away")
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(victim, &st); err != nil || st.Uid != 0 {
		t.Fatalf("a file in the replaced target now belongs to uid %d (%v)", st.Uid, err)
	}
	// The agent's own target is given to the peer, its files with it.
	own := filepath.Join(parent, "own")
	os.Mkdir(own, 0o750)
	os.WriteFile(filepath.Join(own, "CURRENT"), []byte("x"), 0o640)
	if err := giveTo(pf, "own", Peer{UID: 2001, GID: 2002}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{own, filepath.Join(own, "CURRENT")} {
		if err := syscall.Lstat(p, &st); err != nil || st.Uid != 2001 || st.Gid != 2002 {
			t.Fatalf("%s: uid %d gid %d (%v)", p, st.Uid, st.Gid, err)
		}
	}
}
