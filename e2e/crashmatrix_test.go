package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/lab/testservers"
)

// The crash matrix: a ckpt process (the agent, `ckpt gc` or `ckpt restore`)
// built with -tags ckpt_failpoints is SIGKILLed at each named step of the
// data path, ten times per step with a different number of skipped hits
// and a different jitter, on file:// and on S3. After each kill, whatever
// the process left behind must still hold the invariants: every complete
// checkpoint verifies and restores byte for byte, no object a complete
// manifest names is gone, the task goes on with a restarted agent, and the
// next GC leaves exactly the objects the retained manifests name.

// failpointBin is the ckpt binary built with -tags ckpt_failpoints, once
// per run, by the first test that needs it.
var failpointBin struct {
	once sync.Once
	path string
	err  error
}

func ckptFailpointBinary(t *testing.T) string {
	t.Helper()
	failpointBin.once.Do(func() {
		root, err := repoRoot()
		if err != nil {
			failpointBin.err = err
			return
		}
		p := filepath.Join(scratch, "ckpt-failpoints")
		build := exec.Command("go", "build", "-tags", "ckpt_failpoints", "-o", p, "./cmd/ckpt")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			failpointBin.err = fmt.Errorf("go build -tags ckpt_failpoints ./cmd/ckpt: %v\n%s", err, out)
			return
		}
		failpointBin.path = p
	})
	if failpointBin.err != nil {
		t.Fatal(failpointBin.err)
	}
	return failpointBin.path
}

// crashKind says which process a failpoint kills.
type crashKind int

const (
	killAgent   crashKind = iota // the agent, while it makes checkpoints
	killGC                       // `ckpt gc`
	killRestore                  // `ckpt restore`
)

// crashPoint is one row of the matrix.
type crashPoint struct {
	name string
	kind crashKind
	// after is CKPT_FAILPOINT_AFTER of repetition rep: the hits to skip.
	after func(rep int) int
	// committed: the checkpoint the agent was making when it died has its
	// manifest in storage (agent points only).
	committed bool
}

var crashPoints = []crashPoint{
	// Checkpoints 1 to 5: the first, then incremental ones.
	{name: failpoint.AfterLink, kind: killAgent, after: func(rep int) int { return rep % 5 }},
	// Checkpoint 1 uploads 9 objects (with a large one, see snapshot),
	// later ones 4 (two new SSTs, the MANIFEST and the WAL): hits 0-8 die
	// in checkpoint 1, 9-12 in 2, ...
	{name: failpoint.MidUpload, kind: killAgent, after: func(rep int) int { return []int{0, 3, 7, 9, 10, 12, 13, 2, 5, 11}[rep%10] }},
	{name: failpoint.BeforeManifest, kind: killAgent, after: func(rep int) int { return rep % 4 }},
	{name: failpoint.AfterManifest, kind: killAgent, after: func(rep int) int { return rep % 4 }, committed: true},
	// The armed agent's first commit retires three checkpoints at once
	// (see crashRun.crashAgent): hit k+1 is after k retirements.
	{name: failpoint.MidRetire, kind: killAgent, after: func(rep int) int { return rep % 4 }, committed: true},
	{name: failpoint.MidGC, kind: killGC, after: func(int) int { return 0 }},
	{name: failpoint.BeforeRename, kind: killRestore, after: func(int) int { return 0 }},
	// Ten files per checkpoint, each a hit of Adopt (or of Lend, then of
	// the Readopt that follows the rename).
	{name: failpoint.MidAdopt, kind: killRestore, after: func(rep int) int { return rep % 10 }},
}

// crashJitters are CKPT_FAILPOINT_JITTER by repetition.
var crashJitters = []string{"0s", "2ms", "10ms", "30ms", "60ms"}

const (
	crashJob  = "cm"
	crashTask = "cm-0"
	// crashReps is the repetitions of each failpoint on each backend.
	crashReps = 10
	// crashConcurrency is the scenarios run at once.
	crashConcurrency = 6
)

func TestCrashMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("the crash matrix runs about two thousand ckpt processes; skipped with -short")
	}
	start := time.Now()
	fpBin := ckptFailpointBinary(t)
	t.Logf("built the failpoint binary in %v", time.Since(start).Round(time.Millisecond))
	// The scenarios wait mostly on process starts, fsyncs and the S3
	// server, not on a CPU: run several at once, whatever -parallel says.
	sem := make(chan struct{}, crashConcurrency)
	var wg sync.WaitGroup
	for _, backend := range []string{"file", "s3"} {
		wg.Add(1)
		go runWith(&wg, t, backend, func(t *testing.T) {
			var srv *testservers.S3Server
			if backend == "s3" {
				srv = testservers.S3(t)
				srv.CreateBucket(t, testBucket)
			}
			var pwg sync.WaitGroup
			for _, p := range crashPoints {
				pwg.Add(1)
				go runWith(&pwg, t, p.name, func(t *testing.T) {
					var rwg sync.WaitGroup
					for rep := range crashReps {
						rwg.Add(1)
						go runWith(&rwg, t, fmt.Sprint(rep), func(t *testing.T) {
							sem <- struct{}{}
							defer func() { <-sem }()
							st := &crashStore{kind: backend}
							if srv == nil {
								st.dir = t.TempDir()
								st.url = "file://" + st.dir
							} else {
								st.s3, st.prefix, st.env = srv, fmt.Sprintf("cm/%s/%d", p.name, rep), srv.Env()
								st.url = srv.URL(testBucket, st.prefix)
							}
							r := newCrashRun(t, st, fpBin, p, rep)
							r.crash()
							r.check()
						})
					}
					rwg.Wait()
				})
			}
			pwg.Wait()
		})
	}
	wg.Wait()
	t.Logf("crash matrix: %d failpoints x %d kills x 2 backends in %v", len(crashPoints), crashReps, time.Since(start).Round(time.Millisecond))
}

// runWith runs the subtest name of t (it may be called from a goroutine)
// and marks wg done once it has run or was filtered out by -run.
func runWith(wg *sync.WaitGroup, t *testing.T, name string, fn func(t *testing.T)) {
	defer wg.Done()
	t.Run(name, fn)
}

// crashStore is one scenario's storage, and ways to look at it that do not
// go through ckpt.
type crashStore struct {
	kind   string // file or s3
	url    string
	env    []string
	dir    string // file: the storage directory
	s3     *testservers.S3Server
	prefix string // s3: the scenario's prefix in testBucket
}

// objects lists every object under the storage's prefix by key relative to
// it (temporary files included on file://).
func (s *crashStore) objects(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	if s.s3 == nil {
		for rel, st := range listTree(t, s.dir) {
			if st.Mode.IsRegular() {
				out[rel] = st.Size
			}
		}
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := s3.NewListObjectsV2Paginator(s.s3.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(testBucket), Prefix: aws.String(s.prefix + "/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("list the S3 bucket: %v", err)
		}
		for _, o := range page.Contents {
			out[strings.TrimPrefix(aws.ToString(o.Key), s.prefix+"/")] = aws.ToInt64(o.Size)
		}
	}
	return out
}

// get reads one object; ok is false when it does not exist.
func (s *crashStore) get(t *testing.T, key string) (data []byte, ok bool) {
	t.Helper()
	if s.s3 == nil {
		data, err := os.ReadFile(filepath.Join(s.dir, filepath.FromSlash(key)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false
		} else if err != nil {
			t.Fatal(err)
		}
		return data, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := s.s3.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(testBucket), Key: aws.String(s.prefix + "/" + key)})
	if err != nil {
		var re interface{ HTTPStatusCode() int }
		if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
			return nil, false
		}
		t.Fatalf("get %s from S3: %v", key, err)
	}
	defer out.Body.Close()
	data, err = io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("get %s from S3: %v", key, err)
	}
	return data, true
}

// multipartUploads counts the S3 multipart uploads in progress under the
// prefix (0 on file://).
func (s *crashStore) multipartUploads(t *testing.T) int {
	t.Helper()
	if s.s3 == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := s.s3.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(testBucket), Prefix: aws.String(s.prefix + "/")})
	if err != nil {
		t.Fatalf("list multipart uploads: %v", err)
	}
	return len(out.Uploads)
}

// crashRun is one kill and what follows it.
type crashRun struct {
	t      *testing.T
	st     *crashStore
	fpBin  string
	point  crashPoint
	rep    int
	fpEnv  []string // arms the failpoint
	root   string   // snapshot dirs (the agent's allowed root)
	local  string   // the agent's local dir
	socket string
	snaps  map[uint64]string // checkpoint -> the snapshot it was made from
	last   uint64            // highest checkpoint requested
	acked  []uint64          // checkpoints the agent answered completed for
	killed uint64            // the checkpoint the armed agent was making when it died
	// restoredN is the checkpoint the armed restore was restoring.
	restoredN uint64
}

func newCrashRun(t *testing.T, st *crashStore, fpBin string, p crashPoint, rep int) *crashRun {
	r := &crashRun{t: t, st: st, fpBin: fpBin, point: p, rep: rep, root: t.TempDir(), local: t.TempDir(),
		socket: filepath.Join(shortDir(t), "ckpt.sock"), snaps: map[uint64]string{}}
	r.fpEnv = []string{"CKPT_FAILPOINT=" + p.name, fmt.Sprintf("CKPT_FAILPOINT_AFTER=%d", p.after(rep)),
		"CKPT_FAILPOINT_JITTER=" + crashJitters[rep%len(crashJitters)]}
	t.Logf("%s on %s: %s", p.name, st.kind, strings.Join(r.fpEnv, " "))
	return r
}

// env is the storage's environment plus more.
func (r *crashRun) env(more ...string) []string {
	return append(append([]string{}, r.st.env...), more...)
}

func (r *crashRun) agentConfig(bin string, env []string, extra ...string) agentConfig {
	return agentConfig{Bin: bin, Socket: r.socket, Storage: r.st.url, Env: env, Job: crashJob, LocalDir: r.local,
		AllowRoots: []string{r.root}, Extra: append([]string{"--gc-interval", "-1s"}, extra...)}
}

// crashSST is the size of SST id: 40 to 136 KiB.
func crashSST(id uint64) int { return 40<<10 + int(id%4)*32<<10 }

// snapshot writes the snapshot of checkpoint n, as an engine checkpoint of
// a store that flushed two SSTs and compacted two away since checkpoint
// n-1: SSTs 2n-1 to 2n+4 (hard links of the previous snapshot's where it
// has them), and private files of which the MANIFEST and the WAL change
// every time (both above the inline limit, so uploaded as objects).
func (r *crashRun) snapshot(n uint64) string {
	t := r.t
	dir := filepath.Join(r.root, fmt.Sprintf("snap-%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	prev := r.snaps[n-1]
	for id := 2*n - 1; id <= 2*n+4; id++ {
		name := fmt.Sprintf("%06d.sst", id)
		if prev != "" {
			if err := os.Link(filepath.Join(prev, name), filepath.Join(dir, name)); err == nil {
				continue
			}
		}
		writeFile(t, filepath.Join(dir, name), randomBytes(crashSST(id), id))
	}
	if n == 1 && r.point.name == failpoint.MidUpload {
		// A large SST, uploaded first (largest first) and still in flight
		// when the small ones land: a multipart upload on S3, a temporary
		// file on file://. Compacted away by checkpoint 2.
		writeFile(t, filepath.Join(dir, "000000.sst"), randomBytes(20<<20, 0))
	}
	writeFile(t, filepath.Join(dir, "CURRENT"), []byte("MANIFEST-000001\n"))
	writeFile(t, filepath.Join(dir, "OPTIONS-000003"), []byte(strings.Repeat("[Options]\n  bytes_per_sync=524288\n", 20)))
	writeFile(t, filepath.Join(dir, "MANIFEST-000001"), randomBytes(80<<10+int(n)*1000, 1000+n))
	writeFile(t, filepath.Join(dir, fmt.Sprintf("%06d.log", 100+n)), randomBytes(70<<10+int(n)*100, 2000+n))
	r.snaps[n] = dir
	return dir
}

// checkpoint asks the agent on the socket for the next checkpoint and
// waits for its end; the error is the agent's failure or the connection's.
func (r *crashRun) checkpoint() (uint64, error) {
	r.last++
	n := r.last
	dir := r.snapshot(n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, r.socket)
	if err != nil {
		return n, err
	}
	defer c.Close()
	p, err := c.Checkpoint(ctx, crashTask, n, dir, "")
	if err != nil {
		return n, err
	}
	if _, err := p.Wait(ctx); err != nil {
		return n, err
	}
	r.acked = append(r.acked, n)
	return n, nil
}

func (r *crashRun) mustCheckpoint() uint64 {
	r.t.Helper()
	n, err := r.checkpoint()
	if err != nil {
		r.t.Fatalf("checkpoint %d: %v", n, err)
	}
	return n
}

// history makes count checkpoints with an agent of the production binary
// and stops it.
func (r *crashRun) history(count int, extra ...string) {
	r.t.Helper()
	a := startAgent(r.t, "history", r.agentConfig(ckptBin, r.st.env, extra...))
	for range count {
		r.mustCheckpoint()
	}
	a.stop()
}

// crash runs the armed process until the failpoint kills it.
func (r *crashRun) crash() {
	switch r.point.kind {
	case killAgent:
		r.crashAgent()
	case killGC:
		r.crashGC()
	case killRestore:
		r.crashRestore()
	}
}

// requireKilled requires a process to have died by the armed failpoint.
func (r *crashRun) requireKilled(what string, code int, stderr string) {
	r.t.Helper()
	if code != -1 || !strings.Contains(stderr, "failpoint "+r.point.name+": killing the process") {
		r.t.Fatalf("%s was not killed at %s (exit %d):\n%s", what, r.point.name, code, stderr)
	}
}

func (r *crashRun) crashAgent() {
	t := r.t
	retain := "2"
	if r.point.name == failpoint.MidRetire {
		// Three complete checkpoints retained; the armed agent keeps one,
		// so its first commit retires three at once.
		r.history(3, "--retain", "3")
		retain = "1"
	}
	extra := []string{"--retain", retain}
	if r.point.name == failpoint.MidUpload {
		// One worker on the large SST, one on the small files.
		extra = append(extra, "--upload-concurrency", "2")
	}
	a := startAgent(t, "armed", r.agentConfig(r.fpBin, r.env(r.fpEnv...), extra...))
	for range 8 {
		n, err := r.checkpoint()
		if err == nil {
			continue
		}
		r.killed = n
		r.requireKilled("the agent", a.waitExit(20*time.Second), a.stderr.String())
		t.Logf("killed making checkpoint %d (%v); completed before: %v; %d multipart uploads in progress", n, err, r.acked, r.st.multipartUploads(t))
		return
	}
	t.Fatalf("the agent made checkpoints up to %d without reaching %s", r.last, r.point.name)
}

func (r *crashRun) crashGC() {
	// Checkpoints 1-3 retired by the agent (--retain 1), or retired by this
	// GC itself (--retain 1 here, 3 in the agent): GC deletes their
	// manifests and markers, then would delete their objects.
	agentRetain, args := "1", []string{"gc", "--storage", r.st.url, "--job", crashJob, "--grace", "0s", "--json"}
	if r.rep%2 == 1 {
		agentRetain, args = "3", append(args, "--retain", "1")
	}
	r.history(4, "--retain", agentRetain)
	res := runBinEnv(r.t, r.fpBin, r.env(append([]string{unsafeGCGrace, unsafeGCMarkDelay}, r.fpEnv...)...), args...)
	r.requireKilled("ckpt gc", res.Code, string(res.Stderr))
}

func (r *crashRun) crashRestore() {
	t := r.t
	r.history(3)
	variant := r.rep % 3
	n := r.last
	args := []string{"restore", "--storage", r.st.url, "--job", crashJob, "--task", crashTask, "--json"}
	switch {
	case r.point.name == failpoint.BeforeRename && variant == 0:
		if r.rep%2 == 1 {
			n-- // an older checkpoint, from storage alone
		}
	case variant == 0:
		// A new node: nothing local, every file from storage, then adopted
		// into a fresh local dir (where the agent restarts afterwards).
		r.local = t.TempDir()
		args = append(args, "--local-dir", r.local)
	case variant == 1 && r.point.name == failpoint.BeforeRename:
		args = append(args, "--local-dir", r.local) // every file from the local copy, hashed
	case variant == 1:
		// Identity: the local copy is lent (moved) into place, its private
		// files copied back, then its shared ones linked back (Readopt).
		args = append(args, "--local-dir", r.local, "--verify-local", "identity")
	case r.point.name == failpoint.BeforeRename:
		args = append(args, "--local-dir", r.local, "--verify-local", "identity")
	default:
		// No local copy of an older checkpoint: fetched, then adopted
		// beside the local copy of the newest.
		n--
		args = append(args, "--local-dir", r.local)
	}
	args = append(args, "--checkpoint", fmt.Sprint(n))
	r.restoredN = n
	target := filepath.Join(t.TempDir(), "store")
	res := runBinEnv(t, r.fpBin, r.env(r.fpEnv...), append(args, "--target", target)...)
	r.requireKilled("ckpt restore", res.Code, string(res.Stderr))
	parent := filepath.Dir(target)

	// The target appears whole or not at all: before the rename it is not
	// there; adoption runs after it (Adopt, Readopt) or before it (Lend).
	if empty, err := isEmptyOrAbsent(target); err != nil {
		t.Fatal(err)
	} else if !empty {
		if r.point.name == failpoint.BeforeRename {
			t.Fatalf("the restore target holds files after a kill before its rename: %v", listTree(t, target))
		}
		requireSameFiles(t, r.snaps[n], target)
		target = filepath.Join(t.TempDir(), "store") // a second restore needs an empty target
	}
	var rr restoreResult
	ckptJSONEnv(t, r.st.env, &rr, append(args, "--target", target)...)
	if !rr.Restored || rr.Checkpoint != n {
		t.Fatalf("the restore after the kill gave %+v, want checkpoint %d", rr, n)
	}
	requireSameFiles(t, r.snaps[n], target)

	// The killed restore's temporary tree stays beside the target until a
	// restore of the same target finds it unlocked and a minute old
	// (restore's sweepStale, tested in restore/): here it is younger.
	if left, _ := filepath.Glob(filepath.Join(parent, ".store.restore-*")); len(left) > 0 {
		t.Logf("left beside the target by the killed restore: %s (%d B)", filepath.Base(left[0]), treeSize(t, left[0]))
	}
}

// isEmptyOrAbsent reports whether dir does not exist or holds nothing.
func isEmptyOrAbsent(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	return len(entries) == 0, err
}

// list is `ckpt list --json` of the task, by checkpoint.
func (r *crashRun) list() []uint64 {
	r.t.Helper()
	var list []listEntry
	ckptJSONEnv(r.t, r.st.env, &list, "list", "--storage", r.st.url, "--job", crashJob, "--json")
	var out []uint64
	for _, e := range list {
		if e.Task != crashTask {
			r.t.Fatalf("list shows a checkpoint of task %q", e.Task)
		}
		if r.snaps[e.Checkpoint] == "" {
			r.t.Fatalf("list shows checkpoint %d, which was never requested", e.Checkpoint)
		}
		out = append(out, e.Checkpoint)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// manifests reads the manifests of the listed checkpoints from storage.
func (r *crashRun) manifests(listed []uint64) []storedManifest {
	r.t.Helper()
	var ms []storedManifest
	var keys []string
	for k := range r.st.objects(r.t) {
		keys = append(keys, k)
	}
	for _, n := range listed {
		key := newestManifestKey(keys, crashJob, crashTask, n)
		data, ok := r.st.get(r.t, key)
		if !ok {
			r.t.Fatalf("checkpoint %d is listed but its manifest %q is not in storage", n, key)
		}
		ms = append(ms, parseManifest(r.t, key, data))
	}
	return ms
}

// requireObjects requires every object of ms in storage with its size.
func (r *crashRun) requireObjects(when string, ms []storedManifest) {
	r.t.Helper()
	objs := r.st.objects(r.t)
	for _, m := range ms {
		for _, f := range m.Files {
			if f.Key == "" {
				continue
			}
			if size, ok := objs[f.Key]; !ok || size != f.Size {
				r.t.Errorf("%s: checkpoint %d names %s (%s, %d B); storage has it: %v, %d B", when, m.Checkpoint, f.Key, f.Name, f.Size, ok, size)
			}
		}
	}
}

func (r *crashRun) verify(when string) {
	r.t.Helper()
	res := runCkptEnv(r.t, r.st.env, "verify", "--storage", r.st.url, "--job", crashJob)
	if res.Code == 1 && strings.Contains(string(res.Stderr), "holds no checkpoint") {
		// Killed before any checkpoint completed: verify says the job holds
		// nothing (and exits 1), which the listing above agrees with.
		return
	}
	if res.Code != 0 {
		r.t.Fatalf("%s: ckpt verify: exit %d\n%s%s", when, res.Code, res.Stdout, res.Stderr)
	}
}

// restoreAndCompare restores checkpoint n from storage alone into a fresh
// directory and requires it byte-identical to n's snapshot.
func (r *crashRun) restoreAndCompare(n uint64) {
	r.t.Helper()
	target := filepath.Join(r.t.TempDir(), "restored")
	var rr restoreResult
	ckptJSONEnv(r.t, r.st.env, &rr, "restore", "--storage", r.st.url, "--job", crashJob, "--task", crashTask,
		"--checkpoint", fmt.Sprint(n), "--target", target, "--json")
	if !rr.Restored || rr.Checkpoint != n {
		r.t.Fatalf("restore of checkpoint %d gave %+v", n, rr)
	}
	requireSameFiles(r.t, r.snaps[n], target)
}

// check holds the invariants on what the killed process left behind.
func (r *crashRun) check() {
	t := r.t
	if t.Failed() {
		return
	}
	listed := r.list()
	ms := r.manifests(listed)
	r.requireObjects("after the kill", ms)
	has := func(n uint64) bool {
		i := sort.Search(len(listed), func(i int) bool { return listed[i] >= n })
		return i < len(listed) && listed[i] == n
	}
	if k := len(r.acked); k > 0 && !has(r.acked[k-1]) {
		t.Errorf("after the kill the newest completed checkpoint %d is not listed: %v", r.acked[k-1], listed)
	}
	if r.point.kind == killAgent && has(r.killed) != r.point.committed {
		t.Errorf("after a kill at %s, checkpoint %d listed: %v (list %v)", r.point.name, r.killed, has(r.killed), listed)
	}
	if r.point.kind == killRestore && !has(r.restoredN) {
		t.Errorf("a killed restore changed storage: checkpoint %d is not listed any more: %v", r.restoredN, listed)
	}

	// An agent restarts on the same local dir; every complete checkpoint
	// verifies and restores; the task goes on.
	a := startAgent(t, "restarted", r.agentConfig(ckptBin, r.st.env))
	r.verify("after the kill")
	for _, n := range listed {
		r.restoreAndCompare(n)
	}
	next := r.mustCheckpoint()
	r.restoreAndCompare(next)
	a.stop()

	// Reuse only what is confirmed: every shared file the first checkpoint
	// after the kill did not upload is an object of a checkpoint that was
	// complete and retained, never an upload the killed process left.
	confirmed := map[string]bool{}
	for _, m := range ms {
		for _, f := range m.Files {
			confirmed[f.Key] = true
		}
	}
	for _, f := range r.manifests([]uint64{next})[0].Files {
		if f.Kind == "shared" && !f.Uploaded && !confirmed[f.Key] {
			t.Errorf("checkpoint %d reuses %s (%s), which no retained checkpoint named after the kill", next, f.Key, f.Name)
		}
	}

	// The local dir holds no copy it trusts wrongly: a restore that takes
	// unchanged local files as they are (identity) is still byte-identical.
	target := filepath.Join(t.TempDir(), "store")
	var rr restoreResult
	ckptJSONEnv(t, r.st.env, &rr, "restore", "--storage", r.st.url, "--job", crashJob, "--task", crashTask,
		"--target", target, "--local-dir", r.local, "--verify-local", "identity", "--json")
	if !rr.Restored || rr.Checkpoint != next {
		t.Fatalf("restore from the local dir gave %+v, want checkpoint %d", rr, next)
	}
	requireSameFiles(t, r.snaps[next], target)

	// GC removes the orphans: storage then holds exactly the retained
	// manifests and the objects they name.
	before := r.st.objects(t)
	// Two collections: the first marks the orphans, the second (the mark
	// delay lowered to nothing) deletes them.
	var gc gcReport
	for range 2 {
		ckptJSONEnv(t, r.env(unsafeGCGrace, unsafeGCMarkDelay, unsafeGCLockExpiry), &gc, "gc", "--storage", r.st.url, "--job", crashJob, "--grace", "0s", "--json")
	}
	listed = r.list()
	if len(listed) == 0 || listed[len(listed)-1] != next {
		t.Fatalf("after gc the list is %v, want it to end with checkpoint %d", listed, next)
	}
	ms = r.manifests(listed)
	want := map[string]int64{}
	for _, m := range ms {
		want[m.Key] = m.Size
		for _, f := range m.Files {
			if f.Key != "" {
				want[f.Key] = f.Size
			}
		}
	}
	got := r.st.objects(t)
	var d []string
	for k, size := range got {
		if strings.Contains(k, "/owner/") {
			continue // ownership records: kept for as long as the task exists
		}
		if w, ok := want[k]; !ok {
			d = append(d, fmt.Sprintf("orphan %s (%d B)", k, size))
		} else if w != size {
			d = append(d, fmt.Sprintf("%s holds %d B, its manifest says %d", k, size, w))
		}
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			d = append(d, "missing "+k)
		}
	}
	if len(d) > 0 {
		sort.Strings(d)
		t.Errorf("after gc storage does not hold exactly checkpoints %v:\n%s", listed, strings.Join(d, "\n"))
	}
	if n := r.st.multipartUploads(t); n != 0 {
		t.Errorf("%d multipart uploads left after gc", n)
	}
	r.verify("after gc")
	t.Logf("listed %v; gc deleted %d objects (%d keys before, %d after)", listed, gc.DeletedObjects, len(before), len(got))
}
