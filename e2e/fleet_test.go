package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/lab/workload"
	"github.com/ckpt-io/ckpt/protocol"
)

// The fleet: three nodes, each with its own agent, local dir and --node
// name, run the six tasks of one job (two per node) on S3 (versitygw). Each
// task is a real Pebble app (lab/workload), and every second the job
// takes a job-wide checkpoint: every task checkpoints the same number N,
// each request listing all six tasks. With root, each node is its own
// network namespace reaching storage through its own veth pair.
//
// Then node 1's agent is SIGKILLed and comes back (same local dir, same
// node name), its apps reconnect and checkpoint through it, until the
// scheduler gives up on node 1 and moves its two tasks to a fourth node.
// Node 1 is now a zombie: its agent gets one more checkpoint of each task
// from its apps, and node 1 is cut off from storage in the middle of that
// upload. The fourth node's agent restores both tasks with the socket's
// restore op (job_consistent), which takes their ownership, and the apps
// there continue from the restored state. Node 1 is then reconnected: its
// in-flight checkpoints and later ones (new numbers, one of them the
// number the new owner is using) must be refused as fenced, or at least
// never listed.
//
// At the end, from storage alone: list shows no fenced manifest and every
// checkpoint it lists restores to exactly the state its app had when it
// took it; the newest job-complete checkpoint covers the six tasks and is
// what restore --job-consistent and drill --job restore; verify is clean;
// and two GC runs with deletion unlocked (D = 0, grace 0) keep every
// object a listed checkpoint needs.
const (
	fleetJob      = "fleet"
	fleetBucket   = "fleet"
	fleetInterval = time.Second
	// fleetZombieRate (bytes/s) slows the revived node-1 agent's uploads,
	// so that its last checkpoint is still uploading when it is cut off.
	fleetZombieRate = 4_000_000
)

var fleetTasks = []string{"task-0", "task-1", "task-2", "task-3", "task-4", "task-5"}

// fleetKey names one checkpoint attempt: a task's checkpoint N as taken by
// the app on one node (two apps of one task, the zombie's and the new
// owner's, may both take N).
type fleetKey struct {
	task string
	n    uint64
	node string
}

func (k fleetKey) String() string {
	return fmt.Sprintf("%s checkpoint %d from %s", k.task, k.n, k.node)
}

// fleetOutcome is how an attempt ended, as the app saw it.
type fleetOutcome struct {
	status string // "completed", "failed" (the agent said why), "lost" (no answer: the agent died or the send failed)
	code   string // the agent's error code, when failed
	msg    string
	at     time.Time
}

// fleetLedger records the app state at every attempt and its outcome.
type fleetLedger struct {
	mu       sync.Mutex
	states   map[fleetKey]*workload.Expected
	outcomes map[fleetKey]fleetOutcome
	pending  sync.WaitGroup
}

func (l *fleetLedger) state(k fleetKey, exp *workload.Expected) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.states[k] = exp
}

func (l *fleetLedger) expected(k fleetKey) *workload.Expected {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.states[k]
}

func (l *fleetLedger) outcome(k fleetKey, o fleetOutcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	o.at = time.Now()
	l.outcomes[k] = o
}

func (l *fleetLedger) get(k fleetKey) (fleetOutcome, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	o, ok := l.outcomes[k]
	return o, ok
}

// completedBy returns the checkpoints of task that the app on node saw
// completed, ascending.
func (l *fleetLedger) completedBy(task, node string) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ns []uint64
	for k, o := range l.outcomes {
		if k.task == task && k.node == node && o.status == "completed" {
			ns = append(ns, k.n)
		}
	}
	slices.Sort(ns)
	return ns
}

// jobCompleted returns the checkpoint numbers every task saw completed.
func (l *fleetLedger) jobCompleted() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	count := map[uint64]map[string]bool{}
	for k, o := range l.outcomes {
		if o.status == "completed" {
			if count[k.n] == nil {
				count[k.n] = map[string]bool{}
			}
			count[k.n][k.task] = true
		}
	}
	var ns []uint64
	for n, tasks := range count {
		if len(tasks) == len(fleetTasks) {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	return ns
}

// unresolved counts the attempts of node's apps without an outcome yet.
func (l *fleetLedger) unresolved(node string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k := range l.states {
		if _, ok := l.outcomes[k]; !ok && k.node == node {
			n++
		}
	}
	return n
}

func (l *fleetLedger) counts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := map[string]int{}
	for _, o := range l.outcomes {
		key := o.status
		if o.code != "" {
			key += "/" + o.code
		}
		c[key]++
	}
	return c
}

// fleetApp is one task's app on one node: a Pebble store with its
// workload, connected to the node's agent.
type fleetApp struct {
	task, node string
	opts       workload.Options
	store      string
	mu         sync.Mutex // one checkpoint at a time
	w          *workload.Workload
	c          *client.Client
}

// dial (re)connects the app to its agent.
func (a *fleetApp) dial(ctx context.Context, socket string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.c != nil {
		a.c.Close()
	}
	c, err := client.Dial(ctx, socket)
	if err != nil {
		return err
	}
	a.c = c
	return nil
}

func (a *fleetApp) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.c != nil {
		a.c.Close()
	}
	if a.w != nil {
		a.w.Close()
	}
}

// checkpoint runs one workload round, records the state, and sends
// checkpoint n as a job-wide one; the outcome is recorded when the agent
// answers (Wait on l.pending). synced says the agent answered synced; it
// is false, with a nil error, when the app was busy with an earlier
// checkpoint and took none, or when the agent refused or could not be
// reached (the outcome says which).
func (a *fleetApp) checkpoint(ctx context.Context, l *fleetLedger, n uint64) (synced bool, err error) {
	if !a.mu.TryLock() {
		return false, nil
	}
	defer a.mu.Unlock()
	if _, err := a.w.Round(ctx); err != nil {
		return false, fmt.Errorf("%s on %s: workload round: %w", a.task, a.node, err)
	}
	k := fleetKey{a.task, n, a.node}
	l.state(k, a.w.Snapshot())
	dir, err := ckptpebble.Snapshot(a.w.DB(), a.store, n)
	if err != nil {
		return false, fmt.Errorf("%s on %s: %w", a.task, a.node, err)
	}
	defer os.RemoveAll(dir) // handed off on synced; removed here if refused
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	p, err := a.c.Send(sctx, client.Request{Task: a.task, Checkpoint: n, Dir: dir, Engine: ckptpebble.Engine, Handoff: true, Tasks: fleetTasks})
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) {
			l.outcome(k, fleetOutcome{status: "failed", code: pe.Code, msg: pe.Message})
		} else {
			l.outcome(k, fleetOutcome{status: "lost", msg: err.Error()})
		}
		return false, nil
	}
	l.pending.Add(1)
	go func() {
		defer l.pending.Done()
		wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		_, err := p.Wait(wctx)
		var pe *protocol.Error
		switch {
		case err == nil:
			l.outcome(k, fleetOutcome{status: "completed"})
		case errors.As(err, &pe):
			l.outcome(k, fleetOutcome{status: "failed", code: pe.Code, msg: pe.Message})
		default:
			l.outcome(k, fleetOutcome{status: "lost", msg: err.Error()})
		}
	}()
	return true, nil
}

// fleetScheduler takes a job-wide checkpoint every interval: the next N,
// for every task whose app is scheduled.
type fleetScheduler struct {
	mu   sync.Mutex
	apps map[string]*fleetApp
	n    uint64
	errs []error
	stop chan struct{}
	done chan struct{}
}

func (s *fleetScheduler) run(ctx context.Context, l *fleetLedger) {
	defer close(s.done)
	tick := time.NewTicker(fleetInterval)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		s.mu.Lock()
		s.n++
		n := s.n
		apps := make([]*fleetApp, 0, len(s.apps))
		for _, a := range s.apps {
			apps = append(apps, a)
		}
		s.mu.Unlock()
		for _, a := range apps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := a.checkpoint(ctx, l, n); err != nil {
					s.mu.Lock()
					s.errs = append(s.errs, err)
					s.mu.Unlock()
				}
			}()
		}
		select {
		case <-s.stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// schedule puts app on the schedule (nil removes task).
func (s *fleetScheduler) schedule(task string, app *fleetApp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if app == nil {
		delete(s.apps, task)
		return
	}
	s.apps[task] = app
}

// current is the last N taken.
func (s *fleetScheduler) current() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// fleetAgent is an agent process of the fleet, perhaps in a network
// namespace.
type fleetAgent struct {
	t      *testing.T
	name   string
	cfg    agentConfig
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exited chan struct{}
}

// startFleetAgent starts an agent (in node's namespace when node is not
// nil) and waits until it answers hello. It is killed at cleanup, and its
// stderr logged if the test failed.
func startFleetAgent(t *testing.T, name string, node *netNode, cfg agentConfig) *fleetAgent {
	t.Helper()
	a := &fleetAgent{t: t, name: name, cfg: cfg, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	argv := append([]string{ckptBin}, cfg.args()...)
	if node != nil {
		argv = append(node.Wrap(), argv...)
	}
	a.cmd = exec.Command(argv[0], argv[1:]...)
	a.cmd.Env = childEnv(cfg.Env)
	a.cmd.Stdout, a.cmd.Stderr = a.stderr, a.stderr
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("start agent %s: %v", name, err)
	}
	go func() {
		a.cmd.Wait()
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
			t.Logf("agent %s (%s) stderr:\n%s", name, strings.Join(argv, " "), a.stderr)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for hello(cfg.Socket) != nil {
		select {
		case <-a.exited:
			t.Fatalf("agent %s exited before serving:\n%s", name, a.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent %s does not answer hello after 20s:\n%s", name, a.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return a
}

// kill SIGKILLs the agent (ip netns exec execs it: the pid is the agent's).
func (a *fleetAgent) kill() {
	a.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		a.t.Fatalf("kill agent %s: %v", a.name, err)
	}
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		a.t.Fatalf("agent %s still running 10s after SIGKILL", a.name)
	}
}

// socketRestore sends the restore op and returns its restored event, or
// the agent's error.
func socketRestore(ctx context.Context, socket, task, target string, jobConsistent bool) (*protocol.Restored, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	req, _ := json.Marshal(protocol.Request{Op: "restore", ID: "r", Task: task, Target: target, JobConsistent: jobConsistent})
	if _, err := conn.Write(append(req, '\n')); err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("restore %s: no answer: %w", task, err)
		}
		var ev protocol.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("restore %s: bad event %q: %w", task, line, err)
		}
		switch {
		case ev.Event == "restored" && ev.Restored != nil:
			return ev.Restored, nil
		case ev.Error != nil:
			return nil, ev.Error
		case ev.Event == "restored", ev.Event == "failed", ev.Event == "error":
			return nil, fmt.Errorf("restore %s: unexpected event %s", task, line)
		}
	}
}

// inFlight asks an agent how many checkpoints of task are past sync and
// not yet ended.
func inFlight(ctx context.Context, socket, task string) (int, error) {
	c, err := client.Dial(ctx, socket)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ev, err := c.Status(ctx, task)
	if err != nil {
		return 0, err
	}
	for _, ts := range ev.Tasks {
		if ts.Task == task {
			return ts.InFlight, nil
		}
	}
	return 0, nil
}

// fleetListEntry is an element of `ckpt list --json` with what the fleet
// checks.
type fleetListEntry struct {
	Task        string `json:"task"`
	Checkpoint  uint64 `json:"checkpoint"`
	Epoch       uint64 `json:"epoch"`
	JobComplete bool   `json:"job_complete"`
}

// fleetOwner is an ownership record as stored.
type fleetOwner struct {
	Task    string `json:"task"`
	Epoch   uint64 `json:"epoch"`
	Node    string `json:"node"`
	AgentID string `json:"agent_id"`
	After   uint64 `json:"after"`
}

var storedManifestRE = regexp.MustCompile(`/tasks/([^/]+)/chk/(\d{20})/manifest(?:\.e(\d{20}))?$`)

// fleetStorage reads what the bucket holds straight from versitygw's
// directory: ownership records and manifest keys, independently of ckpt.
type fleetStorage struct {
	owners    map[string]map[uint64]fleetOwner // task -> epoch -> record
	manifests map[string]map[uint64][]uint64   // task -> N -> epochs
}

func readFleetStorage(t *testing.T, root string) fleetStorage {
	t.Helper()
	s := fleetStorage{owners: map[string]map[uint64]fleetOwner{}, manifests: map[string]map[uint64][]uint64{}}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel := filepath.ToSlash(p)
		switch {
		case ownerRE.MatchString(rel):
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			var o fleetOwner
			if err := json.Unmarshal(data, &o); err != nil {
				return fmt.Errorf("ownership record %s: %w", rel, err)
			}
			if s.owners[o.Task] == nil {
				s.owners[o.Task] = map[uint64]fleetOwner{}
			}
			s.owners[o.Task][o.Epoch] = o
		case storedManifestRE.MatchString(rel):
			m := storedManifestRE.FindStringSubmatch(rel)
			n, _ := strconv.ParseUint(m[2], 10, 64)
			var e uint64
			if m[3] != "" {
				e, _ = strconv.ParseUint(m[3], 10, 64)
			}
			if s.manifests[m[1]] == nil {
				s.manifests[m[1]] = map[uint64][]uint64{}
			}
			s.manifests[m[1]][n] = append(s.manifests[m[1]][n], e)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read storage: %v", err)
	}
	return s
}

// fencedBy applies the fencing rule (manifests/owner.go) on its own: the
// manifest (n, epoch) of task is fenced iff some record k > epoch has
// n > after_k.
func (s fleetStorage) fencedBy(task string, n, epoch uint64) (fleetOwner, bool) {
	var ks []uint64
	for k := range s.owners[task] {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for _, k := range ks {
		if r := s.owners[task][k]; k > epoch && n > r.After {
			return r, true
		}
	}
	return fleetOwner{}, false
}

// fleetNode is a node of the fleet: its directories, socket and namespace.
type fleetNode struct {
	name   string
	root   string // the apps' directory (the agent's allowed root)
	local  string // the agent's local dir
	socket string
	net    *netNode // nil without namespaces
}

func TestFleetJobSurvivesNodeLossZombieAndGC(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the fleet runs four agents and six Pebble apps on S3 for about a minute")
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	lab, labErr := newNetLab(t)
	var s3 *testservers.S3Server
	if labErr != nil {
		t.Logf("SHAPE: plain processes (no network namespaces: %v); node 1 cannot be cut off from storage, its last checkpoint is only slowed down", labErr)
		s3 = testservers.S3(t)
	} else {
		t.Logf("SHAPE: one network namespace per node, storage at %s on the host, node 1 cut off from storage mid-upload", lab.StorageIP)
		s3 = testservers.S3(t, testservers.WithHost(lab.StorageIP))
	}
	s3.CreateBucket(t, fleetBucket)
	storage := s3.URL(fleetBucket, "e2e")
	env := append(s3.Env(), "NO_PROXY=*")
	dataRoot := filepath.Join(s3.DataDir, fleetBucket, "e2e", fleetJob)

	base := t.TempDir()
	newNode := func(name string) *fleetNode {
		n := &fleetNode{name: name, root: filepath.Join(base, name, "apps"), local: filepath.Join(base, name, "local"),
			socket: filepath.Join(shortDir(t), "ckpt.sock")}
		if err := os.MkdirAll(n.root, 0o755); err != nil {
			t.Fatal(err)
		}
		if lab != nil {
			n.net = lab.Node(name)
		}
		return n
	}
	agentFor := func(n *fleetNode, extra ...string) agentConfig {
		return agentConfig{Socket: n.socket, Storage: storage, Env: env, Job: fleetJob, LocalDir: n.local,
			AllowRoots: []string{n.root}, Extra: append([]string{"--node", n.name, "--gc-interval", "5s"}, extra...)}
	}
	nodes := []*fleetNode{newNode("node-1"), newNode("node-2"), newNode("node-3")}
	agents := map[string]*fleetAgent{}
	for _, n := range nodes {
		agents[n.name] = startFleetAgent(t, n.name, n.net, agentFor(n))
	}

	ledger := &fleetLedger{states: map[fleetKey]*workload.Expected{}, outcomes: map[fleetKey]fleetOutcome{}}
	sched := &fleetScheduler{apps: map[string]*fleetApp{}, stop: make(chan struct{}), done: make(chan struct{})}
	optsOf := func(i int) workload.Options {
		return workload.Options{Seed: uint64(100 + i), StateBytes: 2 << 20, ValueSize: 256, Churn: 0.05, MemTableSize: 512 << 10}
	}
	var allApps []*fleetApp
	defer func() {
		for _, a := range allApps {
			a.close()
		}
	}()
	original := map[string]*fleetApp{}
	for i, task := range fleetTasks {
		n := nodes[i/2]
		app := &fleetApp{task: task, node: n.name, opts: optsOf(i), store: filepath.Join(n.root, task, "store")}
		w, err := workload.Open(app.store, app.opts)
		if err != nil {
			t.Fatal(err)
		}
		app.w = w
		allApps = append(allApps, app)
		if err := app.dial(ctx, n.socket); err != nil {
			t.Fatal(err)
		}
		original[task] = app
		sched.schedule(task, app)
	}
	go sched.run(ctx, ledger)
	stopped := false
	stopScheduler := func() {
		if !stopped {
			stopped = true
			close(sched.stop)
			<-sched.done
		}
	}
	defer stopScheduler()

	waitFor := func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("after %v: still waiting for %s; outcomes so far %v", limit, what, ledger.counts())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	phase := func(format string, args ...any) {
		t.Logf("[%5.1fs] N=%d %s", time.Since(began).Seconds(), sched.current(), fmt.Sprintf(format, args...))
	}

	// Phase 1: the healthy fleet.
	waitFor("eight job-complete checkpoints", 60*time.Second, func() bool { return len(ledger.jobCompleted()) >= 8 })
	phase("healthy fleet: job-complete checkpoints %v", ledger.jobCompleted())

	// Phase 2: node 1's agent dies and comes back; its apps reconnect.
	node1 := nodes[0]
	agents["node-1"].kill()
	killedAt := sched.current()
	phase("SIGKILLed node-1's agent")
	agents["node-1"] = startFleetAgent(t, "node-1 (revived)", node1.net, agentFor(node1, "--upload-rate", strconv.Itoa(fleetZombieRate)))
	for _, task := range fleetTasks[:2] {
		if err := original[task].dial(ctx, node1.socket); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("checkpoints through node-1's revived agent", 60*time.Second, func() bool {
		for _, task := range fleetTasks[:2] {
			c := ledger.completedBy(task, "node-1")
			if len(c) < 2 || c[len(c)-2] <= killedAt {
				return false
			}
		}
		return true
	})
	phase("node-1's revived agent committed %v and %v", ledger.completedBy("task-0", "node-1"), ledger.completedBy("task-1", "node-1"))

	// Phase 3: the scheduler moves node 1's tasks away. Node 1 still runs
	// (a zombie): its apps take one more checkpoint each, and node 1 is
	// cut off from storage while it uploads.
	for _, task := range fleetTasks[:2] {
		sched.schedule(task, nil)
	}
	moved := sched.current()
	waitFor("the ticks that still had node 1's apps to pass", 10*time.Second, func() bool { return sched.current() >= moved+2 })
	waitFor("node-1's checkpoints before the move to end", 60*time.Second, func() bool { return ledger.unresolved("node-1") == 0 })
	// Both zombie checkpoints at once, then the cut: their uploads (slowed
	// by --upload-rate, and made larger by a few more rounds of writes) are
	// under way.
	for _, task := range fleetTasks[:2] {
		a := original[task]
		a.mu.Lock()
		for range 3 {
			if _, err := a.w.Round(ctx); err != nil {
				a.mu.Unlock()
				t.Fatal(err)
			}
		}
		a.mu.Unlock()
	}
	zn := sched.current() + 1
	zombieKeys := []fleetKey{{"task-0", zn, "node-1"}, {"task-1", zn, "node-1"}}
	var zwg sync.WaitGroup
	zsynced := make([]bool, 2)
	zerrs := make([]error, 2)
	for i, task := range fleetTasks[:2] {
		zwg.Add(1)
		go func() {
			defer zwg.Done()
			zsynced[i], zerrs[i] = original[task].checkpoint(ctx, ledger, zn)
		}()
	}
	zwg.Wait()
	if lab != nil {
		lab.Cut(node1.net)
	}
	for i, k := range zombieKeys {
		if zerrs[i] != nil || !zsynced[i] {
			o, _ := ledger.get(k)
			t.Fatalf("zombie's %s: synced %v, %v, outcome %+v", k, zsynced[i], zerrs[i], o)
		}
	}
	inflightAt := func() map[string]int {
		m := map[string]int{}
		for _, task := range fleetTasks[:2] {
			k, err := inFlight(ctx, node1.socket, task)
			if err != nil {
				t.Fatal(err)
			}
			m[task] = k
		}
		return m
	}
	phase("node-1 cut off from storage (namespaces: %v); zombie checkpoints %d in flight there: %v", lab != nil, zn, inflightAt())

	takeoverAt := time.Now()
	node4 := newNode("node-4")
	agents["node-4"] = startFleetAgent(t, "node-4", node4.net, agentFor(node4))
	restoredAt := map[string]uint64{}
	for _, task := range fleetTasks[:2] {
		target := filepath.Join(node4.root, task, "store")
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
		res, err := socketRestore(rctx, node4.socket, task, target, true)
		rcancel()
		if err != nil {
			t.Fatalf("node-4 restores %s (job_consistent): %v", task, err)
		}
		if !res.Restored || res.Task != task {
			t.Fatalf("node-4 restores %s: %+v", task, res)
		}
		restoredAt[task] = res.Checkpoint
		phase("node-4 took %s over and restored its job-consistent checkpoint %d (%d files, %d B, %d ms)", task, res.Checkpoint, res.Files, res.Bytes, res.DurationMS)
	}
	inflightAtTakeover := inflightAt()
	if restoredAt["task-0"] != restoredAt["task-1"] {
		t.Fatalf("the two tasks restored different job-consistent checkpoints: %v", restoredAt)
	}
	k0 := restoredAt["task-0"]
	if seen := ledger.jobCompleted(); len(seen) > 0 && seen[len(seen)-1] > k0 {
		// Every task reported a newer checkpoint completed, but it never was
		// job-complete in storage: see
		// TestFleetATaskLaggingBeyondRetainStillYieldsJobCompleteCheckpoints.
		phase("FINDING: node-4 restored job-consistent checkpoint %d, but the apps saw every task complete checkpoints %v before the takeover", k0, seen)
	}
	// The apps on node 4 continue from the restored state: Resume checks
	// the store holds exactly the state node 1's app had at checkpoint k0.
	for i, task := range fleetTasks[:2] {
		exp := ledger.expected(fleetKey{task, k0, "node-1"})
		if exp == nil {
			t.Fatalf("no recorded state of %s checkpoint %d on node-1", task, k0)
		}
		app := &fleetApp{task: task, node: "node-4", opts: optsOf(i), store: filepath.Join(node4.root, task, "store")}
		w, err := workload.Resume(ctx, app.store, app.opts, exp)
		if err != nil {
			t.Fatalf("DEFECT: %s restored on node-4 from job-consistent checkpoint %d does not hold that checkpoint's state: %v", task, k0, err)
		}
		app.w = w
		allApps = append(allApps, app)
		if err := app.dial(ctx, node4.socket); err != nil {
			t.Fatal(err)
		}
		sched.schedule(task, app)
	}
	takeoverN := sched.current()
	phase("node-4's apps resumed from checkpoint %d (%d keys each); in flight on node-1 at the takeover: %v", k0, ledger.expected(fleetKey{"task-0", k0, "node-1"}).Keys(), inflightAtTakeover)
	waitFor("node-4's first checkpoints", 60*time.Second, func() bool {
		return len(ledger.completedBy("task-0", "node-4")) > 0 && len(ledger.completedBy("task-1", "node-4")) > 0
	})
	if lab != nil {
		lab.Reconnect(node1.net)
		phase("node-1 reconnected")
	}

	// The zombie's checkpoints in flight end without being the job's.
	waitFor("the zombie's in-flight checkpoints to end", 90*time.Second, func() bool {
		for _, k := range zombieKeys {
			if _, ok := ledger.get(k); !ok {
				return false
			}
		}
		return true
	})
	for _, k := range zombieKeys {
		o, _ := ledger.get(k)
		phase("zombie's in-flight %s: %s %s %s", k, o.status, o.code, o.msg)
		if o.status == "completed" && o.at.After(takeoverAt) {
			t.Errorf("zombie's %s was reported completed after node-4 took the task over", k)
		}
	}
	// Later zombie checkpoints: the number node 4 is about to take, and
	// one far above anything the job took.
	for _, zk := range []uint64{sched.current() + 1, sched.current() + 1000} {
		for _, task := range fleetTasks[:2] {
			k := fleetKey{task, zk, "node-1"}
			synced, err := original[task].checkpoint(ctx, ledger, zk)
			if err != nil {
				t.Fatal(err)
			}
			if synced {
				waitFor("the zombie's "+k.String(), 60*time.Second, func() bool { _, ok := ledger.get(k); return ok })
			}
			o, _ := ledger.get(k)
			phase("zombie's later %s: %s %s %s", k, o.status, o.code, o.msg)
			if o.status != "failed" || o.code != protocol.CodeConflict || !strings.Contains(o.msg, "fenced") {
				t.Errorf("zombie's %s: %s %s %q, want failed with conflict (fenced)", k, o.status, o.code, o.msg)
			}
			zombieKeys = append(zombieKeys, k)
		}
	}
	afterZombie := sched.current()

	// Phase 4: the new owner was never blocked; the job goes on.
	waitFor("ten more job-complete checkpoints after the zombie's attempts", 90*time.Second, func() bool {
		n := 0
		for _, c := range ledger.jobCompleted() {
			if c > afterZombie {
				n++
			}
		}
		return n >= 10
	})
	stopScheduler()
	ledger.pending.Wait()
	for _, err := range sched.errs {
		t.Error(err)
	}
	jobDone := ledger.jobCompleted()
	phase("stopped; job-complete checkpoints the apps saw: %v; outcomes %v", jobDone, ledger.counts())
	if t.Failed() {
		t.FailNow()
	}

	// The end: storage alone says what the job has.
	checkStorage := func(when string) ([]fleetListEntry, uint64) {
		t.Helper()
		var list []fleetListEntry
		ckptJSONEnv(t, env, &list, "list", "--storage", storage, "--job", fleetJob, "--json")
		st := readFleetStorage(t, dataRoot)
		var newest uint64
		byN := map[uint64]map[string]bool{}
		for _, e := range list {
			if r, fenced := st.fencedBy(e.Task, e.Checkpoint, e.Epoch); fenced {
				t.Errorf("DEFECT (%s): list shows %s checkpoint %d of epoch %d, fenced by the record of epoch %d (node %s, after %d)",
					when, e.Task, e.Checkpoint, e.Epoch, r.Epoch, r.Node, r.After)
			}
			if e.JobComplete {
				if byN[e.Checkpoint] == nil {
					byN[e.Checkpoint] = map[string]bool{}
				}
				byN[e.Checkpoint][e.Task] = true
				newest = max(newest, e.Checkpoint)
			}
		}
		if newest == 0 {
			t.Fatalf("%s: list shows no job-complete checkpoint:\n%+v", when, list)
		}
		if len(byN[newest]) != len(fleetTasks) {
			t.Errorf("%s: the newest job-complete checkpoint %d is listed for %d tasks, want %d: %v", when, newest, len(byN[newest]), len(fleetTasks), byN[newest])
		}
		return list, newest
	}
	list, newest := checkStorage("before GC")
	st := readFleetStorage(t, dataRoot)
	if newest <= afterZombie || newest != jobDone[len(jobDone)-1] {
		t.Errorf("the newest job-complete checkpoint listed is %d; the apps saw %v complete (the zombie's last attempt was at %d)", newest, jobDone, afterZombie)
	}
	for task, recs := range st.owners {
		var desc []string
		for e, r := range recs {
			desc = append(desc, fmt.Sprintf("epoch %d: %s after %d", e, r.Node, r.After))
		}
		sort.Strings(desc)
		t.Logf("ownership of %s: %s", task, strings.Join(desc, "; "))
	}
	// Which node's app took a listed checkpoint: the node of the owner
	// record of its epoch.
	nodeOf := func(task string, epoch uint64) string { return st.owners[task][epoch].Node }
	var zombieStored []string
	for _, task := range fleetTasks[:2] {
		for n, epochs := range st.manifests[task] {
			for _, e := range epochs {
				if _, fenced := st.fencedBy(task, n, e); fenced {
					zombieStored = append(zombieStored, fmt.Sprintf("%s/%d@e%d", task, n, e))
				}
			}
		}
	}
	sort.Strings(zombieStored)
	t.Logf("fenced manifests in storage (written by the zombie, ignored by readers): %v", zombieStored)

	// Every listed checkpoint restores to exactly its app's state then.
	restoreDir := t.TempDir()
	for _, e := range list {
		node := nodeOf(e.Task, e.Epoch)
		k := fleetKey{e.Task, e.Checkpoint, node}
		exp := ledger.expected(k)
		if exp == nil {
			t.Errorf("list shows %s checkpoint %d of epoch %d (node %q), which no app on that node took", e.Task, e.Checkpoint, e.Epoch, node)
			continue
		}
		if o, ok := ledger.get(k); ok && o.status == "failed" {
			t.Errorf("DEFECT: list shows %s, which its agent reported failed (%s: %s)", k, o.code, o.msg)
		}
		target := filepath.Join(restoreDir, fmt.Sprintf("%s-%d", e.Task, e.Checkpoint))
		var rr restoreResult
		ckptJSONEnv(t, env, &rr, "restore", "--storage", storage, "--job", fleetJob, "--task", e.Task,
			"--checkpoint", fmt.Sprint(e.Checkpoint), "--target", target, "--json")
		verifyStore(t, target, exp)
	}
	t.Logf("every listed checkpoint (%d) restored to its app's state", len(list))
	for _, task := range fleetTasks {
		target := filepath.Join(restoreDir, task+"-job")
		var rr restoreResult
		ckptJSONEnv(t, env, &rr, "restore", "--storage", storage, "--job", fleetJob, "--task", task, "--target", target, "--job-consistent", "--json")
		if rr.Checkpoint != newest {
			t.Errorf("restore --job-consistent of %s: checkpoint %d, want %d", task, rr.Checkpoint, newest)
		}
		node := "node-" + strconv.Itoa(1+slices.Index(fleetTasks, task)/2)
		if slices.Index(fleetTasks, task) < 2 {
			node = "node-4"
		}
		verifyStore(t, target, ledger.expected(fleetKey{task, newest, node}))
	}

	verifyJob := func(when string) {
		t.Helper()
		var v struct {
			Checkpoints int             `json:"checkpoints"`
			Objects     int             `json:"objects"`
			OK          bool            `json:"ok"`
			Problems    json.RawMessage `json:"problems"`
		}
		res := runCkptEnv(t, env, "verify", "--storage", storage, "--job", fleetJob, "--json")
		if err := json.Unmarshal(res.Stdout, &v); err != nil || res.Code != 0 || !v.OK {
			t.Fatalf("verify of the job %s: exit %d, %+v (%v)\n%s\n%s", when, res.Code, v, err, res.Stdout, res.Stderr)
		}
		var drill jobDrill
		ckptJSONEnv(t, env, &drill, "drill", "--storage", storage, "--job", fleetJob, "--json")
		if drill.Checkpoint == nil || *drill.Checkpoint != newest || drill.Tasks == nil || *drill.Tasks != len(fleetTasks) || drill.Verified == nil || !*drill.Verified {
			t.Fatalf("drill --job %s: %+v, want checkpoint %d of %d tasks verified", when, drill, newest, len(fleetTasks))
		}
		t.Logf("%s: verify read %d checkpoints, %d objects: clean; drill --job restored checkpoint %d of %d tasks (%d B) in %d ms, verified",
			when, v.Checkpoints, v.Objects, *drill.Checkpoint, *drill.Tasks, *drill.Bytes, *drill.DurationMS)
	}
	verifyJob("before GC")

	// GC twice with deletion unlocked: the first marks, the second deletes.
	gcEnv := append(append([]string{}, env...), unsafeGCGrace, unsafeGCMarkDelay)
	for i := range 2 {
		var g gcReport
		ckptJSONEnv(t, gcEnv, &g, "gc", "--storage", storage, "--job", fleetJob, "--grace", "0s", "--json")
		t.Logf("gc %d: deleted %d objects (%d B), %d live (%d B), %d checkpoints retained", i+1, g.DeletedObjects, g.DeletedBytes, g.LiveObjects, g.LiveBytes, g.RetainedCheckpoints)
	}
	after, newestAfter := checkStorage("after GC")
	if newestAfter != newest {
		t.Errorf("after GC the newest job-complete checkpoint is %d, was %d", newestAfter, newest)
	}
	was := map[string]bool{}
	for _, e := range list {
		was[fmt.Sprintf("%s/%d@e%d", e.Task, e.Checkpoint, e.Epoch)] = true
	}
	for _, e := range after {
		delete(was, fmt.Sprintf("%s/%d@e%d", e.Task, e.Checkpoint, e.Epoch))
	}
	if len(was) > 0 {
		t.Errorf("GC removed listed checkpoints: %v", was)
	}
	verifyJob("after GC")
	for _, task := range fleetTasks {
		target := filepath.Join(restoreDir, task+"-after-gc")
		var rr restoreResult
		ckptJSONEnv(t, env, &rr, "restore", "--storage", storage, "--job", fleetJob, "--task", task, "--target", target, "--job-consistent", "--json")
		node := "node-" + strconv.Itoa(1+slices.Index(fleetTasks, task)/2)
		if slices.Index(fleetTasks, task) < 2 {
			node = "node-4"
		}
		verifyStore(t, target, ledger.expected(fleetKey{task, rr.Checkpoint, node}))
	}
	stAfter := readFleetStorage(t, dataRoot)
	var fencedLeft []string
	for _, task := range fleetTasks[:2] {
		for n, epochs := range stAfter.manifests[task] {
			for _, e := range epochs {
				if _, fenced := stAfter.fencedBy(task, n, e); fenced {
					fencedLeft = append(fencedLeft, fmt.Sprintf("%s/%d@e%d", task, n, e))
				}
			}
		}
	}
	sort.Strings(fencedLeft)
	t.Logf("fenced manifests left after GC: %v (takeover at N=%d, zombie attempts %v)", fencedLeft, takeoverN, zombieKeys)
	t.Logf("fleet done in %v: %d job-complete checkpoints seen by the apps, outcomes %v", time.Since(began).Round(time.Second), len(jobDone), ledger.counts())
}
